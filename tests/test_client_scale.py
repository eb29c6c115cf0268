"""The server client at scale (issue 60): the hot loop's bytes read into the same tokens however they were split,
the schedule's slices for worker processes, shards and Ray actors, the records merged onto one clock, a row that
says when its client sent late (and --strict), latencies from the scheduled or the sent time, and `merge`."""
from __future__ import annotations

import json
import math
import sys
from contextlib import contextmanager

import pytest

from prefillbench.backends.server import client, client_pool, client_workers
from prefillbench.backends.server.client_events import EventReader, LlamaApi, OpenAIApi
from prefillbench.backends.server.client_http import read_stream
from prefillbench.backends.server.client_settings import ClientSettings
from prefillbench.backends.server.engines import parse_template
from prefillbench.backends.server.process import ServerProcess, free_port
from prefillbench.bench import client_columns
from prefillbench.engine import RunRecord
from prefillbench.engine.served import _record
from prefillbench.sequence import Request

STUB = f"{sys.executable} -m prefillbench.backends.server.stub --port {{port}}"


@contextmanager
def stub_server(*flags: str):
    port = free_port()
    server = ServerProcess([*parse_template(STUB.format(port=port)), *flags], f"http://127.0.0.1:{port}/health")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def open_loop(n: int, gap: float = 0.01, n_gen: int = 4) -> list[Request]:
    return [Request(tuple(range(i, i + 8)), n_gen, i * gap) for i in range(n)]


# ---------------------------------------------------------------- the stream's bytes, read off the hot path


def _llama_stream(n: int) -> bytes:
    events = [{"content": "", "tokens": [0], "stop": False, "tokens_predicted": 0,
               "prompt_progress": {"total": 8, "cache": 0, "processed": 8, "time_ms": 1.0}}]
    for i in range(n):
        events.append({"content": "x", "tokens": [i], "stop": False, "tokens_predicted": i + 1,
                       "timings": {"prompt_ms": 1.0, "predicted_ms": 2.0 * (i + 1), "cache_n": 0}})
    events.append({"content": "", "tokens": [], "stop": True, "tokens_predicted": n,
                   "timings": {"prompt_ms": 1.0, "predicted_ms": 2.0 * n, "cache_n": 0}})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


#: An answer's head as the stub's server sends it, its body to the connection's close.
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"


def _read(api, request: Request, pieces: list[tuple[bytes, float]]) -> client.Streamed:
    s = client.Streamed(request, 0.0, sent=0.0)
    s.chunks, s.chunk_times = [HEAD] + [p for p, _ in pieces], [pieces[0][1]] + [t for _, t in pieces]
    read_stream(api, s)
    return s


def test_a_stream_split_anywhere_reads_as_the_same_tokens():
    # The hot loop keeps whatever the socket gave; an event split between two reads is read when its end came.
    whole = _llama_stream(5)
    request = Request(tuple(range(8)), 5)
    one = _read(LlamaApi(), request, [(whole, 1.0)])
    assert one.error is None and one.tokens == [0, 1, 2, 3, 4] and one.first_scheduled == pytest.approx(0.999)
    # events read together are dated back from the last by the engine's own clock (2 ms a token here)
    assert one.token_times == pytest.approx([0.992, 0.994, 0.996, 0.998, 1.0])
    for cut in range(1, len(whole)):
        two = _read(LlamaApi(), request, [(whole[:cut], 1.0), (whole[cut:], 2.0)])
        assert (two.tokens, two.error) == (one.tokens, None), cut
        assert two.token_times == sorted(two.token_times) and two.token_times[-1] in (1.0, 2.0), cut


def test_an_event_is_stamped_with_the_arrival_of_the_read_that_completed_it():
    data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in (
        {"choices": [{"index": 0, "text": "x", "token_ids": [5], "finish_reason": None}]},
        {"choices": [{"index": 0, "text": "x", "token_ids": [6], "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})) + b"data: [DONE]\n\n"
    second = data.index(b"data:", 10)
    s = _read(OpenAIApi(), Request((1, 2, 3), 2), [(data[:second + 12], 1.0), (data[second + 12:], 1.5)])
    assert s.tokens == [5, 6] and s.token_times == [1.0, 1.5] and s.error is None


@pytest.mark.parametrize("pieces, says", [
    ([b"data: {\"content\": \"x\", \"tokens\": [1], \"tokens_predicted\": 1}\n\n"], "the stream ended before its last event"),
    ([b"data: {not json}\n\n"], "a malformed event"),
    ([b"data: {\"error\": \"boom\"}\n\n"], "the server's error: boom"),
])
def test_a_stream_that_fails_is_read_into_its_reason(pieces, says):
    s = _read(LlamaApi(), Request((1,), 2), [(p, 1.0) for p in pieces])
    assert s.error is not None and says in s.error


def test_a_connections_own_failure_is_the_reason_kept():
    s = client.Streamed(Request((1,), 2), 0.0, sent=0.0, error="the stream was cut: ConnectionResetError")
    s.chunks, s.chunk_times = [HEAD + _llama_stream(1)[:60]], [1.0]
    read_stream(LlamaApi(), s)
    assert s.error == "the stream was cut: ConnectionResetError" and s.parsed


def test_a_reader_fed_as_bytes_come_reads_what_the_kept_chunks_read():
    whole = _llama_stream(4)
    request = Request(tuple(range(8)), 4)
    s = client.Streamed(request, 0.0, sent=0.0)
    reader = EventReader(LlamaApi(), s)
    for i in range(0, len(whole), 7):
        reader.feed(whole[i:i + 7], 1.0 + i)
    reader.close()
    kept = _read(LlamaApi(), request, [(whole[i:i + 7], 1.0 + i) for i in range(0, len(whole), 7)])
    assert (s.tokens, s.token_times, s.error) == (kept.tokens, kept.token_times, kept.error)


def _answer(pieces: list[bytes], request: Request = Request(tuple(range(8)), 2)) -> client.Streamed:
    """An answer kept raw, as the protocol keeps it (its head included), read."""
    s = client.Streamed(request, 0.0, sent=0.0)
    s.chunks, s.chunk_times = list(pieces), [1.0 + i for i in range(len(pieces))]
    read_stream(LlamaApi(), s)
    return s


def _chunked(body: bytes, size: int) -> bytes:
    """`body` in HTTP chunks of `size` bytes, then the last chunk."""
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n" % len(p) + p + b"\r\n" for p in parts) + b"0\r\n\r\n"


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"


@pytest.mark.parametrize("size", [1, 7, 64, 4096])
def test_a_chunked_answer_reads_as_its_body_in_any_chunks_and_reads(size):
    raw = CHUNKED_HEAD + _chunked(_llama_stream(2), size)
    whole = _answer([raw])
    assert whole.error is None and whole.tokens == [0, 1]
    for cut in (5, len(CHUNKED_HEAD) + 3, len(raw) // 2, len(raw) - 3):
        split = _answer([raw[:cut], raw[cut:]])
        assert (split.tokens, split.error) == (whole.tokens, None), (size, cut)


def test_a_read_per_chunk_reads_as_the_answer_read_whole_each_token_at_its_reads_arrival():
    # A server's write of one event is one chunk, and one read where the client keeps up: read on its own path
    events = [e + b"\n\n" for e in _llama_stream(3).split(b"\n\n") if e]
    writes = [b"%x\r\n" % len(e) + e + b"\r\n" for e in events] + [b"0\r\n\r\n"]
    s = client.Streamed(Request(tuple(range(8)), 3), 0.0, sent=0.0)
    s.chunks, s.chunk_times = [CHUNKED_HEAD, *writes], [1.0] + [2.0 + i for i in range(len(writes))]
    read_stream(LlamaApi(), s)
    whole = _answer([CHUNKED_HEAD + b"".join(writes)], Request(tuple(range(8)), 3))
    assert s.error is None and s.tokens == whole.tokens == [0, 1, 2]
    assert s.token_times == [3.0, 4.0, 5.0]  # the reads of the three token events (the first is the prompt's)
    # a read of one chunk and the start of the next goes the general way and reads the same
    joined = [CHUNKED_HEAD, writes[0], writes[1] + writes[2][:9], writes[2][9:], *writes[3:]]
    assert _answer(joined, Request(tuple(range(8)), 3)).tokens == [0, 1, 2]


@pytest.mark.parametrize("line", [b"data: {\"content\": \"x\"} x", b"data: {\"a\": 1}{\"b\": 2}", b"data: ", b"data: [1"])
def test_an_event_that_is_not_one_json_value_is_malformed(line):
    s = _read(LlamaApi(), Request((1,), 2), [(line + b"\n\n", 1.0)])
    assert s.error == "a malformed event in the stream"


def test_an_answer_cut_before_its_last_chunk_is_a_cut_stream():
    raw = CHUNKED_HEAD + _chunked(_llama_stream(2), 64)
    s = _answer([raw[:-5]])  # every event there, the last chunk not
    assert s.error is not None and s.error.startswith("the stream was cut")
    s = _answer([raw[:len(raw) // 2]])
    assert s.error is not None and s.error.startswith("the stream was cut")


def test_an_error_status_keeps_the_start_of_its_body():
    body = b'{"error": {"message": "stub failure"}}'
    s = _answer([b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n" % len(body) + body])
    assert s.error == 'HTTP 500: {"error": {"message": "stub failure"}}'
    assert _answer([b"HTTP/1.1 200 OK\r\nContent-"]).error == "an HTTP answer cut in its headers"


# ---------------------------------------------------------------- slices of one schedule


def test_an_open_loop_is_dealt_round_robin_in_arrival_order_and_every_request_once():
    requests = open_loop(10)
    parts = client_workers.slices(requests, 0, 3)
    assert [[r.arrival_s for r in p.requests] for p in parts] == [
        [0.0, 0.03, 0.06, 0.09], [0.01, 0.04, 0.07], [0.02, 0.05, 0.08]]
    assert sorted((r for p in parts for r in p.requests), key=lambda r: r.arrival_s) == requests
    assert client_workers.slices(requests, 0, 3) == parts  # deterministic: every shard computes the same deal


def test_a_closed_loops_concurrency_is_split_and_a_session_stays_whole():
    closed = [Request((i,), 2) for i in range(7)]
    assert [p.concurrency for p in client_workers.slices(closed, 5, 2)] == [3, 2]
    assert len(client_workers.slices(closed, 2, 4)) == 2  # no worker without a place in flight
    assert [p.concurrency for p in client_workers.slices(open_loop(6), 1, 3)] == [1]  # an open loop's cap too
    turns = [Request((s, t), 2, 0.1 * s if t == 0 else None, session=s, turn=t) for s in range(3) for t in range(2)]
    parts = client_workers.slices(turns, 0, 2)
    for p in parts:
        sessions = {r.session for r in p.requests}
        assert all(sum(r.session == s for r in p.requests) == 2 for s in sessions)


def test_auto_sizes_workers_from_the_expected_event_rate_by_the_stated_constant():
    per = client_workers.EVENTS_PER_WORKER_S
    # 300 requests a second of 100 tokens: 30k events a second, three workers' worth
    requests = [Request((1,), 100, i / 300) for i in range(3000)]
    assert client_workers.auto_workers(requests, 0, cores=None) == math.ceil(300 * 100 / per)
    assert client_workers.auto_workers(requests, 0, cores=2) == 2  # no more than the cores
    assert client_workers.auto_workers([Request((1,), 8)] * 250, 250, cores=None) == 3  # 100 in flight a worker


@pytest.mark.parametrize("flags, says", [
    (("--client-workers", "0"), "--client-workers 0: at least 1"),
    (("--client-workers", "many"), "--client-workers many: a number of processes, or auto"),
    (("--shard", "2/2"), "--shard 2/2: I/N with 0 <= I < N"),
    (("--latency-from", "now"), "'now' is not one of scheduled, sent"),
])
def test_a_bad_client_flag_is_one_line(run_cli, flags, says):
    # refused before the server is asked anything: no server answers at this address
    code, out, err = run_cli("run", "--backend", "server", "--url", "http://127.0.0.1:1", "--pg", "8,2", "-p", "0",
                             "-n", "0", "--no-progress", "--no-results-file", *flags)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1


def test_a_shard_sends_its_slice_of_the_run():
    requests = open_loop(5)
    mine, c = ClientSettings.parse(shard="1/2").shard_of(requests, 0)
    assert mine == requests[1::2] and c == 0
    with pytest.raises(Exception, match="no slice 3 of 4"):
        ClientSettings.parse(shard="3/4").shard_of([Request((1,), 2)] * 3, 3)


# ---------------------------------------------------------------- worker processes against the stub


def test_workers_send_their_slices_on_one_schedule_and_the_records_merge_into_one_run():
    requests = open_loop(12, gap=0.02)
    with stub_server("--token-ms", "2") as url:
        jobs = [client_workers.SliceJob(url, "llama", s.requests, s.concurrency)
                for s in client_workers.slices(requests, 0, 2)]
        run = client_pool.stream_in_workers(jobs)
    assert run.workers == 2 and run.cpu_s > 0 and len(run.done) == 12
    assert sorted(s.request.arrival_s for s in run.done) == [r.arrival_s for r in requests]
    for s in run.done:
        assert s.error is None and len(s.tokens) == 4 and s.parsed
        # due at the common start plus its arrival, on this process's clock (the workers' moved onto it)
        assert s.scheduled - run.start == pytest.approx(s.request.arrival_s, abs=1e-6)
        assert s.sent >= s.scheduled - 1e-6 and s.token_times[0] > s.sent
        assert run.start <= s.token_times[-1] <= run.end


def test_a_run_with_two_workers_gives_rows_with_the_clients_figures(run_cli, tmp_path):
    export = tmp_path / "w.json"
    with stub_server("--token-ms", "2") as url:
        code, out, err = run_cli("run", "--backend", "server", "--url", url, "--pg", "16,4", "--arrival", "poisson",
                                 "--rate", "40", "--requests", "24", "--client-workers", "2", "--no-progress",
                                 "--no-results-file", "--export", str(export))
    assert code == 0, err
    data = json.loads(export.read_text())
    row, meta = data["results"][0], data["metadata"]
    assert row["requests"] == 24 and row["failed_requests"] == 0 and row["client_workers"] == 2
    assert row["client_cpu_pct"] > 0 and row["arrival_lag_p99_ms"] >= row["arrival_lag_p50_ms"] >= 0
    assert meta["client_workers"] == 2 and meta["client_latency_from"] == "scheduled"
    # the stub paces tokens 2 ms apart: the merged rows see it
    assert 1 < row["tbt_p50_ms"] < 200


def test_latency_from_sent_starts_at_the_send_and_scheduled_at_the_due_time():
    s = client.Streamed(Request((1, 2), 1), 10.0, sent=10.25, token_times=[10.5], tokens=[1])
    assert _record(s, "scheduled").arrival == 10.0 and _record(s, "sent").arrival == 10.25


# ---------------------------------------------------------------- a run that says when it was late


def _runs(lags_ms: list[float], cpu_s: float = 0.5) -> list[RunRecord]:
    return [RunRecord(0.0, 1.0, [], [], arrival_lags=[x / 1e3 for x in lags_ms], client_cpu_s=cpu_s, client_workers=2)]


def test_a_send_lag_past_its_share_of_the_ttft_marks_the_row():
    assert client_columns.late_bound_ms(100.0) == pytest.approx(100.0 * client_columns.LATE_SHARE)
    assert client_columns.late_bound_ms(2.0) == client_columns.LATE_FLOOR_MS  # never finer than the timers
    kept_up = client_columns.client_columns(_runs([0.5] * 99 + [5.0]), ttft_p50_ms=100.0)
    late = client_columns.client_columns(_runs([0.5] * 90 + [50.0] * 10), ttft_p50_ms=100.0)
    assert kept_up["client_late"] == "" and kept_up["client_cpu_pct"] == pytest.approx(50.0)
    assert late["client_late"].startswith("send lag p99 50.0 ms > 10.0 ms") and late["client_workers"] == 2
    assert client_columns.client_columns([RunRecord(0.0, 1.0, [], [])], 1.0) == {}  # a step backend has no client


@pytest.mark.parametrize("late", [True, False])
def test_strict_exits_1_where_a_row_measured_the_client(run_cli, monkeypatch, late):
    # The bound moved so that any lag is late, or none: what --strict and the verdict do with the mark.
    monkeypatch.setattr(client_columns, "LATE_SHARE", 0.0 if late else 1e9)
    monkeypatch.setattr(client_columns, "LATE_FLOOR_MS", -1.0 if late else 1e9)
    with stub_server("--token-ms", "1") as url:
        code, out, err = run_cli("run", "--backend", "server", "--url", url, "--pg", "8,2", "--arrival", "poisson",
                                 "--rate", "50", "--requests", "6", "--no-progress", "--no-results-file", "--strict")
    if late:
        assert code == 1 and "--strict: 1 row(s) measured the client" in err
        assert "the client measured itself" in out and " late |" in out
    else:
        assert code == 0, err
        assert "measured itself" not in out and "send lag p99 ms" not in out


# ---------------------------------------------------------------- shards, merged


def test_shards_merge_into_the_run_they_split(run_cli, tmp_path):
    args = ["run", "--pg", "16,4", "--arrival", "poisson", "--rate", "30", "--requests", "12", "--no-progress",
            "--no-results-file", "--no-verdict"]
    with stub_server("--token-ms", "2") as url:
        for name, shard in (("s0", ["--shard", "0/2"]), ("s1", ["--shard", "1/2"]), ("whole", [])):
            code, out, err = run_cli(*args, "--backend", "server", "--url", url, *shard,
                                     "--export", str(tmp_path / f"{name}.json"))
            assert code == 0, err
    halves = [json.loads((tmp_path / f"s{i}.json").read_text())["results"][0]["requests"] for i in range(2)]
    assert halves == [6, 6]
    code, out, err = run_cli("merge", str(tmp_path / "s1.json"), str(tmp_path / "s0.json"), "-o", "json",
                             "--export", str(tmp_path / "m.json"))
    assert code == 0, err
    merged = json.loads((tmp_path / "m.json").read_text())
    row = merged["results"][0]
    assert row["requests"] == 12 and row["failed_requests"] == 0 and merged["metadata"]["merged_shards"] == 2
    assert 1 < row["tbt_p50_ms"] < 200 and row["ttft_p50_ms"] > 0
    # the merged requests are the whole schedule's: its 12 arrivals' offered rate, as the run sent from one process
    whole = json.loads((tmp_path / "whole.json").read_text())["results"][0]
    assert row["offered_rps"] == pytest.approx(whole["offered_rps"], rel=1e-4)
    code, out, err = run_cli("merge", str(tmp_path / "s0.json"))
    assert code == 2 and "shard 1/2 is missing" in err and len(err.strip().splitlines()) == 1


def test_the_kubernetes_manifest_is_an_indexed_job_sending_its_shards():
    import yaml
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "k8s-client-shards.yaml").read_text()
    (job,) = list(yaml.safe_load_all(text))
    spec = job["spec"]
    assert job["kind"] == "Job" and spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"]
    container = spec["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert int(env["SHARDS"]) == spec["completions"]
    command = " ".join(container["args"])
    assert '--shard "$JOB_COMPLETION_INDEX/$SHARDS"' in command and "--export" in command

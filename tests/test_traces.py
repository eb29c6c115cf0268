"""Trace files read by their own columns: Mooncake's JSONL and Azure's CSV beside prefillbench's own, the scales,
the window and the length cap, the prompts made from Mooncake's block ids, and bad files refused in one line."""
from __future__ import annotations

import json

import pytest

from prefillbench.bench.traces import MOONCAKE_BLOCK, TraceReading, WorkloadError, load_workload
from prefillbench.bench.workloads import make_requests, workload_test
from prefillbench.backends.prefix_cache import implied_hits

from mooncake_traces import write_trace


def _mooncake(tmp_path, rows, name="trace.jsonl"):
    return write_trace(tmp_path / name, rows)


def test_the_shipped_mooncake_sample_is_read_by_its_own_columns():
    w = load_workload("mooncake-sample")
    assert (w.source, len(w), w.block_size) == ("mooncake", 200, MOONCAKE_BLOCK)
    # timestamps are ms from the trace's start: lines 3601-3800 span 45.048 s
    assert w.arrivals[0] == 0 and w.arrivals[-1] == pytest.approx(45.048)
    assert all(len(ids) * MOONCAKE_BLOCK >= n for ids, n in zip(w.blocks, w.prompt_lens))


def test_the_shipped_azure_sample_dates_requests_by_their_timestamps():
    w = load_workload("azure-conv-sample")
    assert (w.source, len(w), w.blocks) == ("azure", 200, None)
    # 2023-11-16 18:15:46.6805900 then 18:15:50.9951690: seven fractional digits, read to the 100 ns
    assert w.arrivals[1] == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)
    assert (w.prompt_lens[0], w.gen_lens[0]) == (374, 44)


def test_requests_sharing_block_ids_share_exactly_those_tokens(tmp_path):
    path = _mooncake(tmp_path, [
        {"timestamp": 0, "input_length": 1000, "output_length": 4, "hash_ids": [7, 8]},
        {"timestamp": 10, "input_length": 1200, "output_length": 4, "hash_ids": [7, 9, 10]},
        {"timestamp": 20, "input_length": 300, "output_length": 4, "hash_ids": [7]},
    ])
    test = workload_test(load_workload(path))
    a, b, c = (r.prompt for r in make_requests(test, 3, 49152, seed=5))
    assert (len(a), len(b), len(c)) == (1000, 1200, 300)
    assert a[:512] == b[:512] and a[512:1000] != b[512:1000]
    assert c == a[:300]  # a partial block is the first tokens of the same block elsewhere
    # another seed gives other tokens, with the same sharing
    a2, b2, _ = (r.prompt for r in make_requests(test, 3, 49152, seed=6))
    assert a2 != a and a2[:512] == b2[:512]


def test_the_token_scale_shrinks_lengths_and_blocks_and_keeps_the_sharing():
    full = load_workload("mooncake-sample")
    small = load_workload("mooncake-sample", TraceReading(token_scale=1 / 32))
    assert small.block_size == 16 and small.blocks == full.blocks
    assert small.prompt_lens == tuple(max(1, round(n / 32)) for n in full.prompt_lens)

    def rate(w, block):
        cached, total = implied_hits([r.prompt for r in make_requests(workload_test(w), len(w), 49152, 0)], block)
        return cached / total

    # The same blocks are shared whatever their size; only rounding and the never-cached last token move it.
    assert rate(small, 16) == pytest.approx(rate(full, 512), abs=0.005)


def test_time_scale_window_and_cap(tmp_path):
    rows = [{"timestamp": 1000 * i, "input_length": 100 * (i + 1), "output_length": 10, "hash_ids": [i, 50 + i]}
            for i in range(6)]
    path = _mooncake(tmp_path, rows)
    assert load_workload(path, TraceReading(time_scale=0.5)).arrivals == (0, 0.5, 1.0, 1.5, 2.0, 2.5)
    assert len(load_workload(path, TraceReading(first=2))) == 2
    assert len(load_workload(path, TraceReading(span=3.0))) == 3  # arrivals 0, 1 and 2 s of the trace's own time
    capped = load_workload(path, TraceReading(max_len=350))
    assert capped.prompt_lens == (100, 200, 300) and capped.dropped == 3


@pytest.mark.parametrize("lines, message", [
    (['{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}', '{"timestamp": 5, "input_length": 9}'],
     "line 2: no output_length"),
    (['{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}', '{"timestamp": '],
     "line 2: malformed JSON"),
    (['{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1]}'], "line 1: 1 hash_ids cover 512 tokens"),
    (['{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [-1]}'], "line 1: hash_ids must be"),
    (['{"timestamp": 0, "input_length": 10.5, "output_length": 2, "hash_ids": [1]}'], "line 1: input_length must be a whole"),
    (['{"when": 0, "tokens": 10}'], "line 1: no prompt_len"),
])
def test_bad_trace_lines_are_refused_naming_the_line(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkloadError, match=message):
        load_workload(path)


def test_a_bad_azure_timestamp_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,2\nyesterday,10,2\n")
    with pytest.raises(WorkloadError, match="line 3: TIMESTAMP is not a date"):
        load_workload(path)


@pytest.mark.parametrize("args, message", [
    (["--token-scale", "0.5"], "--token-scale reads a --workload"),
    (["--workload", "mooncake-sample", "--time-scale", "0"], "--time-scale must be a number above 0"),
    (["--workload", "mooncake-sample", "--trace-max-len", "10"], "no request is within --trace-max-len 10"),
])
def test_trace_flags_are_checked_in_one_line(args, message, capsys):
    from prefillbench.cli import main
    code = main(["run", "--backend", "sim", "-s", "sequential", "--no-results-file", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1] and "Traceback" not in "\n".join(err)


def test_capacity_replays_a_traces_requests_at_each_probes_rate(run_cli):
    # Every probe sends the trace's own requests (its lengths and shared prefixes) at the probe's Poisson rate.
    result = run_cli("capacity", "--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "a100", "--workload",
                     "mooncake-sample", "--trace-first", "40", "--trace-max-len", "32768", "--slo", "tbt=100",
                     "-s", "sequential", "--requests", "500", "-o", "json")
    assert result.code == 0, result.err
    row = json.loads(result.out)["results"][0]
    assert row["requests"] + row["failed_requests"] <= 40 and row["capacity_rps"] > 0
    assert row["prefix_hit_rate"] > 0 and "--requests 500 is ignored" in result.err


def test_on_the_sim_every_request_arrives_at_its_traces_scaled_time():
    from strategies import make_strategy

    from prefillbench import engine
    from prefillbench.backends.sim.backend import SimBackend
    from prefillbench.bench.workloads import ArrivalSpec

    w = load_workload("mooncake-sample", TraceReading(time_scale=0.5, max_len=32768, first=80))
    test = workload_test(w)
    reqs = make_requests(test, len(w), 32000, 0, ArrivalSpec("trace").times(len(w), 0, test))
    run = engine.run(SimBackend.load("mistral-7b", "a100", prefix_cache="on"), make_strategy("chunked", 512), reqs, 0)
    arrived = sorted(r.arrival - run.start for r in run.requests)
    assert arrived == pytest.approx(sorted(w.arrivals), abs=1e-3)  # within 1 ms: exactly, in virtual time
    assert w.arrivals[-1] == pytest.approx(0.5 * (load_workload("mooncake-sample", TraceReading(max_len=32768, first=80)).arrivals[-1]))
    # the engine's lag taking them: every request that came while the sim waited idle was admitted at its arrival
    assert run.arrival_lags and all(lag == 0.0 for lag in run.arrival_lags)


def test_arrival_lag_counts_the_requests_that_came_while_the_engine_waited_idle():
    # A backend whose steps take 0.5 s of its own clock and whose every wait wakes 1 ms late. Of requests arriving at
    # 0, 10.2, 10.3 and 20, those at 0 (the run's start: nothing runs yet), 10.2 and 20 came while nothing ran: each
    # is taken its wake-up late (0 for the first, admitted on the first pass). The one at 10.3 came during the
    # 10.2 request's prompt step and waited for it: its scheduling delay, not lag, and not counted.
    from strategies import make_strategy

    from prefillbench import engine
    from prefillbench.backends.fake import FakeBackend
    from prefillbench.sequence import Request

    class LateWaker(FakeBackend):
        def wait_until(self, t, *, stalled=False, idle=False):
            self.clock = max(self.clock, t + 0.001)

    reqs = [Request(tuple(range(1, 9)), 2, arrival_s=t) for t in (0.0, 10.2, 10.3, 20.0)]
    run = engine.run(LateWaker(seconds_per_token=0.0, seconds_per_step=0.5), make_strategy("sequential"), reqs, 0)
    assert len(run.requests) == 4
    assert run.arrival_lags == pytest.approx([0.0, 0.001, 0.001], abs=1e-9)

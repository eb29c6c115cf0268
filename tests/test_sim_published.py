"""The published rows the sim is checked against (benchmarks/lib/published_rows.py) are well formed, their flags are
what the CLI's own parser accepts, and one cheap row runs end to end and is read as the price of its one step."""
from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest
import typer

from benchmarks.lib.published_rows import READS, ROWS, is_moe
from benchmarks.sim import published, sarathi_steps
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.cost import Batch

ROOT = Path(__file__).resolve().parent.parent


def test_rows_are_well_formed():
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids)), "row ids repeat"
    for r in ROWS:
        assert r.source.cite.strip() and r.source.engine.strip() and r.source.metric.strip(), r.id
        assert r.model.strip() and r.conditions.strip() and r.unit.strip(), r.id
        assert r.published > 0 and math.isfinite(r.published), r.id
        assert r.read in READS, r.id
        if r.read == "moe_kernel_us":
            assert r.arg > 0 and r.layers > 0, r.id


def test_the_docs_fifteen_are_all_here_and_at_least_ten_new_rows_of_both_kinds():
    docs = [r for r in ROWS if r.from_docs]
    new = [r for r in ROWS if not r.from_docs]
    assert len(docs) == 15
    assert len(new) >= 10
    assert any(is_moe(r) for r in new) and any(not is_moe(r) for r in new)
    # The doc's table holds the same published figures (a row edited here and not there, or the reverse, fails).
    table = (ROOT / "docs" / "sim.md").read_text().split("### Checked against published MoE measurements")[1]
    for i, r in enumerate(docs, 1):
        line = next(x for x in table.splitlines() if x.startswith(f"| {i} |"))
        assert f"{r.published:g}" in line, (r.id, line)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_flags_parse_with_the_clis_parser(row):
    params = published.parse_flags(published.row_argv(row, export="x.json"))
    assert params["backend"] == "sim"
    for word in shlex.split(row.flags):  # every file a row names is in the repository
        if word.startswith("docs/"):
            assert (ROOT / word).is_file(), f"{row.id}: {word} is missing"


def test_a_bad_flag_is_refused_by_the_parser():
    row = ROWS[0]
    with pytest.raises(typer.TyperException):  # what prefillbench.cli.main reports as a usage error
        published.parse_flags(published.row_argv(row, extra="--no-such-flag 3"))


def test_a_cheap_row_runs_end_to_end_and_reads_its_one_steps_price(tmp_path):
    # TensorRT-LLM's first-token latency of one 128-token prompt: the run is one prefill step from t = 0, so the
    # sim's TTFT must be that step's price exactly (no queue, no other request, spec sheets: no jitter).
    row = next(r for r in ROWS if r.id == "trt-ttft-h100-llama2-7b-128")
    outcome = published.run_row(row, extra="--sim-pricing spec", workdir=tmp_path)
    assert not math.isnan(outcome.sim), outcome.message
    backend = SimBackend.load(sim_model=str(ROOT / "docs/sim/llama-2-7b.json"), sim_gpu="h100", sim_dtype="fp8",
                              kv_dtype="fp8", sim_pricing="spec")
    step_ms = 1e3 * backend.cost.seconds(Batch(((0, 128, True),), ()))
    assert outcome.sim == pytest.approx(step_ms, rel=1e-9)
    assert outcome.error == pytest.approx(outcome.sim / row.published - 1)
    record = json.loads((tmp_path / f"{row.id}.json").read_text())["results"][0]
    # The batch-latency reading (c x tokens / throughput) agrees with the request's own end-to-end time.
    assert 1 * (128 + 1) / record["throughput"] == pytest.approx(record["e2e_p50_ms"] / 1e3, rel=1e-9)


def test_sarathi_steps_price_the_artifacts_shapes():
    steps = sarathi_steps.all_steps()
    assert len(steps) == 8 + 8 + 3
    decodes = [s for s in steps if s.name.startswith("decode x") and "1022" in s.name]
    assert [len(s.batches[0].decodes) for s in decodes] == [1, 2, 4, 8, 16, 32, 64, 128]
    # figure-2's decodes: 1020 prompt tokens and 3 decode-only steps, contexts 1021-1023 (the token itself included)
    assert [b.decodes[0] for b in decodes[0].batches] == [1021, 1022, 1023]
    hybrid = next(s for s in steps if s.name.startswith("hybrid")).batches[0]
    assert hybrid.chunks == ((0, 1021, False),) and len(hybrid.decodes) == 3 and hybrid.n_tokens == 1024
    assert all(s.published_ms > 0 for s in steps)
    cost = sarathi_steps.CostModel(sarathi_steps.YI_34B, sarathi_steps.gpus("nvlink")["nvlink"], tp=2)
    # A 16,384-token prefill costs more than a 128-token one, and the hybrid step more than its prefill alone.
    priced = {s.name: sarathi_steps.price(cost, s)[0] for s in steps}
    assert priced["prefill 16384"] > priced["prefill 128"]
    assert priced["hybrid 1021 + 3 decodes"] > cost.seconds(Batch(((0, 1021, False),), ())) * 1e3


def test_under_measured_pricing_each_row_pays_its_own_engines_overheads():
    from prefillbench.backends.sim.pricing import OVERHEADS

    by_engine = {r.source.overheads for r in ROWS}
    assert by_engine <= set(OVERHEADS) and {"vllm", "vllm-v0", "sglang", "tensorrt-llm"} <= by_engine
    # vLLM before V1: the early-2024 PR branches, 0.6.3, and Oracle's page of 2024-10 (no version, but V1 came in
    # 2025); a later vLLM, or one of neither version nor date (the nightly builds), is V1's
    v0 = {"vllm-pr2542", "vllm-pr3240", "qwen2.5-speed", "oracle-mi300x"}
    for r in ROWS:
        named = ("sglang" if "SGLang" in r.source.engine else "tensorrt-llm" if "TensorRT" in r.source.engine
                 else "vllm-v0" if r.source.key in v0 else "vllm")
        assert r.source.overheads == named, r.id
        argv = published.row_argv(r, "--sim-pricing measured")
        assert argv[argv.index("--sim-overheads") + 1] == r.source.overheads, r.id
        # measured is the default on every row's GPU; spec pricing has no engine; an engine named in --sim-extra wins
        plain = published.row_argv(r)
        assert plain[plain.index("--sim-overheads") + 1] == r.source.overheads, r.id
        assert "--sim-overheads" not in published.row_argv(r, "--sim-pricing spec")
        forced = published.row_argv(r, "--sim-pricing measured --sim-overheads none")
        assert forced.count("--sim-overheads") == 1 and forced[forced.index("--sim-overheads") + 1] == "none"

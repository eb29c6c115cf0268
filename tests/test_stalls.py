"""Decode stalls traced to the prefill that caused them (bench/stalls.py), in rows, tables and verdicts."""
from __future__ import annotations

import math

import numpy as np
import pytest

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench.metrics import summarize
from prefillbench.bench.stalls import Gaps, run_gaps, stall_columns, tail_parts
from prefillbench.bench.workloads import TestSpec, make_requests
from prefillbench.engine import RequestRecord, RunRecord, StepRecord
from prefillbench.report.verdict import render_verdict
from strategies import make_strategy


def step(start, end, prompt=0, decodes=1):
    return StepRecord(start, end, [(0, prompt)] if prompt else [], 0, [10] * decodes)


def test_a_decode_left_out_of_a_prompts_step_waited_behind_it_and_its_own_step_is_decode_time():
    # sequential: decode at 1.0, a 300-token prompt alone 1.0-1.5, the decode again 1.51-1.6 (10 ms between steps)
    steps = [step(0.9, 1.0), step(1.0, 1.5, prompt=300, decodes=0), step(1.51, 1.6)]
    run = RunRecord(0.0, 2.0, [RequestRecord(5, 0.0, [1.0, 1.6], [1, 2])], steps)
    gaps = run_gaps(run)
    assert gaps.ms == pytest.approx([600.0])
    assert gaps.behind_ms == pytest.approx([500.0])
    assert gaps.decode_ms == pytest.approx([90.0])
    assert gaps.between_ms == pytest.approx([10.0])
    assert gaps.prompt_tokens.tolist() == [300.0]


def test_a_decode_sharing_a_chunked_step_waited_behind_its_chunk_only():
    steps = [step(0.0, 0.1), step(0.1, 0.4, prompt=256, decodes=2), step(0.4, 0.5)]
    run = RunRecord(0.0, 1.0, [RequestRecord(5, 0.0, [0.1, 0.4, 0.5], [1, 2, 3])], steps)
    gaps = run_gaps(run)
    assert gaps.behind_ms == pytest.approx([300.0, 0.0])
    assert gaps.decode_ms == pytest.approx([0.0, 100.0], abs=1e-9)
    assert gaps.prompt_tokens.tolist() == [256.0, 0.0]


def test_overlapping_steps_count_their_time_once_and_prefill_wins_where_any_runs_one():
    # the sim's pipeline: two stages' steps overlap; 0.2-0.3 has both, so it is behind prefill, once
    steps = [step(0.0, 0.3), step(0.2, 0.5, prompt=64, decodes=0)]
    run = RunRecord(0.0, 1.0, [RequestRecord(5, 0.0, [0.0, 0.5], [1, 2])], steps)
    gaps = run_gaps(run)
    assert gaps.behind_ms == pytest.approx([300.0])
    assert gaps.decode_ms == pytest.approx([200.0])
    assert gaps.between_ms == pytest.approx([0.0], abs=1e-9)


def test_the_p99s_parts_add_up_to_the_p99_numpy_gives_the_gaps():
    rng = np.random.default_rng(3)
    ms = rng.exponential(20, 1001)
    behind = ms * rng.uniform(0, 1, ms.size)
    gaps = Gaps(ms, behind, (ms - behind) * 0.9, rng.integers(0, 512, ms.size).astype(float))
    parts = tail_parts(gaps)
    assert parts.p99_ms == pytest.approx(np.percentile(ms, 99))
    assert parts.behind_ms + parts.decode_ms + parts.between_ms == pytest.approx(parts.p99_ms)
    assert 0 < parts.behind_ms < parts.p99_ms


def test_a_run_without_steps_or_dated_prompts_has_no_stall_columns():
    served = RunRecord(0.0, 1.0, [RequestRecord(5, 0.0, [0.1, 0.2, 0.3], [1, 2, 3])], [])
    assert run_gaps(served) is None and stall_columns([served]) == {}


def test_a_served_run_reads_its_stalls_on_the_prompts_spans_the_engine_dated():
    # llama-server: A decodes 1.0 -> 1.1 -> 1.6; B's 400-token prompt (100 cached) ran 1.2-1.5, dated by its progress
    a = RequestRecord(10, 0.0, [1.0, 1.1, 1.6], [1, 2, 3], first_scheduled=0.5)
    b = RequestRecord(400, 1.2, [1.5, 1.55], [4, 5], first_scheduled=1.2, cached_tokens=100)
    gaps = run_gaps(RunRecord(0.0, 2.0, [a, b], []))
    # A's second gap spans all of B's prompt: 300 ms behind it, the rest decodes (or nothing); 300 tokens computed
    assert gaps.ms == pytest.approx([100.0, 500.0, 50.0])
    assert gaps.behind_ms == pytest.approx([0.0, 300.0, 0.0])
    assert gaps.prompt_tokens == pytest.approx([0.0, 300.0, 0.0])


def sim_runs(strategy: str, chunk: int | None, c: int = 8) -> tuple[TestSpec, list]:
    backend = SimBackend.load("llama-13b", "a6000")
    test = TestSpec(512, 64)
    reqs = make_requests(test, 16, vocab_size=backend.vocab_size, seed=0)
    return test, [engine.run(backend, make_strategy(strategy, chunk), reqs, c)]


@pytest.mark.parametrize("chunk", [128, 256])
def test_chunked_decodes_never_wait_behind_more_prompt_tokens_than_its_budget(chunk):
    test, runs = sim_runs("chunked", chunk)
    gaps = run_gaps(runs[0])
    # one step a gap, so the prompt tokens a decode waited behind are its step's: at most the budget
    assert gaps.prompt_tokens.max() <= chunk
    row = summarize(test, runs, model="m", backend="sim", strategy="chunked", concurrency=8, chunk_size=chunk)
    assert row.tbt_p99_prefill_tokens <= chunk
    assert (row.tbt_p99_behind_prefill_ms + row.tbt_p99_decode_ms + row.tbt_p99_between_steps_ms
            == pytest.approx(row.tbt_p99_ms))


def test_sequentials_tbt_p99_is_a_whole_prompt_and_the_verdict_says_so():
    rows = []
    for strategy, chunk in (("sequential", None), ("chunked", 256)):
        test, runs = sim_runs(strategy, chunk)
        rows.append(summarize(test, runs, model="m", backend="sim", strategy=strategy, concurrency=8,
                              chunk_size=chunk))
    seq, chunked = rows
    # sequential's tail gaps wait out whole 512-token prompts the decode was left out of
    assert seq.tbt_tail_behind_prefill == 1.0 and seq.tbt_p99_prefill_tokens >= 512
    assert seq.tbt_p99_with_prefill_ms > seq.tbt_p99_decode_only_ms
    # the sim has no time between steps: the steps account for every gap
    assert seq.tbt_p99_between_steps_ms == pytest.approx(0.0, abs=1e-6)
    text = render_verdict(rows, "sequential")
    assert "TBT p99 better" in text
    assert f"{100 * chunked.tbt_p99_behind_prefill_ms / chunked.tbt_p99_ms:.0f}% of it in steps computing 256 prompt tokens" in text


def test_the_table_shows_the_p99_behind_prefill_and_its_tokens(run_cli):
    result = run_cli("run", "--backend", "sim", "--pg", "512,64", "-p", "0", "-n", "0", "-c", "8", "-s", "chunked",
                     "--chunk-size", "256", "-r", "1")
    assert result.code == 0
    header, _, row = result.out.splitlines()[:3]
    assert "TBT p99 behind prefill ms (prompt t)" in header
    cells = dict(zip([h.strip() for h in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["TBT p99 behind prefill ms (prompt t)"].endswith("(256)")


def test_the_per_request_export_traces_every_gap_and_plot_draws_them(run_cli, tmp_path):
    from prefillbench.report.plots import load_inputs, stall_charts
    from prefillbench.report.traces import load_traces

    out = tmp_path / "r.json"
    result = run_cli("run", "--backend", "sim", "--pg", "512,64", "-p", "0", "-n", "0", "-c", "8", "-s",
                     "sequential,chunked", "--chunk-size", "256", "-r", "1", "--export", str(out))
    assert result.code == 0
    traces = load_traces(str(tmp_path / "r.requests.jsonl"))
    chunked = [t for t in traces if t.strategy == "chunked"]
    assert all(len(t.gap_prompt_tokens) == len(t.token_times) - 1 for t in traces)
    assert max(n for t in chunked for n in t.gap_prompt_tokens) == 256
    assert max(n for t in traces if t.strategy == "sequential" for n in t.gap_prompt_tokens) >= 512
    (chart,) = stall_charts(load_inputs([str(out)])[1])
    assert chart.name == "tbt_stalls_pp512+tg64_c8"
    assert chart.panels[0].labels == ["sequential", "chunked (256)"]

"""Decode runs: the sim executes decode-only steps in a row, without the engine asking the strategy each time.
What a run records must be what launching every step alone records, to the float."""
from __future__ import annotations

import dataclasses

import pytest

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.bench.capacity import CertainFailure, Criteria
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, make_requests
from strategies import STRATEGIES, make_strategy
from strategies.sglang import INIT_RATIO, MIN_RATIO, RATIO_DECAY

TEST = TestSpec(400, 120, spread=0.9)


def sim(jitter: float = 0.0, step_by_step: bool = False) -> SimBackend:
    backend = SimBackend(load_model_spec("mistral-7b"), dataclasses.replace(load_gpu_spec("a100"), step_jitter=jitter))
    backend.runs = []  # the length of each decode run
    if step_by_step:
        backend.run_decodes = lambda step, most, until: None
    else:
        inner = backend.run_decodes

        def counted(step, most, until):
            burst = inner(step, most, until)
            if burst is not None:
                assert len(burst.ends) <= most
                backend.runs.append(len(burst.ends))
            return burst

        backend.run_decodes = counted
    return backend


def requests(n: int, rate: float | None, seed: int = 3):
    times = ArrivalSpec("poisson", rate).times(n, seed, TEST) if rate else None
    return make_requests(TEST, n, 32000, seed, times)


def both_ways(strategy: str, reqs, concurrency: int, jitter: float = 0.0, stop=None):
    out = []
    for step_by_step in (False, True):
        backend = sim(jitter, step_by_step)
        record = engine.run(backend, make_strategy(strategy, 128), reqs, concurrency,
                            stop=stop(reqs) if stop else None)
        out.append((backend, record))
    return out


#: The shipped strategies whose next step depends on more than which sequences wait and run and how far each prompt
#: is: SGLang's, whose new_token_ratio falls with every decode batch it chooses (a count of its calls), so the engine
#: asks them for every step.
COUNTS_ITS_CALLS = {"sglang", "sglang-mixed"}


@pytest.mark.parametrize("strategy", [n for n, c in STRATEGIES.items()
                                      if not c.needs_price and n not in COUNTS_ITS_CALLS])  # slo-budget: test_slo_budget.py
@pytest.mark.parametrize("rate, concurrency, jitter", [(2.0, 0, 0.0), (6.0, 12, 0.15), (None, 8, 0.1)])
def test_a_run_with_decode_runs_records_what_single_steps_record(strategy, rate, concurrency, jitter):
    (fast, a), (slow, b) = both_ways(strategy, requests(80, rate), concurrency, jitter)
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert (fast.clock, fast.n_steps, fast._held, fast._seq_tokens) == (slow.clock, slow.n_steps, slow._held, slow._seq_tokens)
    # and the runs carried most of the steps: a lightly loaded run is mostly decode steps that change nothing else
    assert max(fast.runs) > 1 and sum(fast.runs) > len(a.steps) / 2, fast.runs


@pytest.mark.parametrize("strategy", ["sequential", "chunked", "static"])
def test_decode_runs_end_at_the_stop_checks(strategy):
    """A run above capacity stops at the same step either way: runs end where the engine asks `stop`. (With 4 in
    flight the queue grows while the prompts in flight are soon done: decode runs, then a certain failure.)"""
    stop = lambda reqs: CertainFailure([Criteria(20.0, sched_delay_p50_ms=100.0)], reqs)  # noqa: E731
    (fast, a), (slow, b) = both_ways(strategy, requests(300, 40.0), 4, stop=stop)
    assert a.stopped and b.stopped
    assert len(a.steps) % engine.STOP_CHECK_STEPS == 0
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert fast.runs


def test_a_strategy_that_is_not_steady_is_asked_for_every_step():
    class Counting(type(make_strategy("sequential"))):
        steady_decodes = False
        calls = 0

        def next_step(self, waiting, running):
            Counting.calls += 1
            return super().next_step(waiting, running)

    backend = sim()
    record = engine.run(backend, Counting(), requests(30, 2.0), 0)
    assert Counting.calls == len(record.steps) and not backend.runs


def test_every_shipped_strategy_lets_the_engine_run_decodes_but_those_that_count_their_calls():
    # Each of them chooses from which sequences wait and run and how far each prompt is, nothing else; SGLang's
    # ratio decays once a decode batch, so a decode run that skipped its calls would leave it where it was.
    assert {name for name, cls in STRATEGIES.items() if not cls.steady_decodes} == COUNTS_ITS_CALLS


@pytest.mark.parametrize("strategy", sorted(COUNTS_ITS_CALLS))
def test_a_strategy_that_counts_its_calls_is_asked_for_every_step_and_its_ratio_falls_with_each(strategy):
    backend = sim()
    record = engine.run(backend, make_strategy(strategy, 128), requests(30, 2.0), 0)
    assert not backend.runs
    ratios = [dict(s.policy_values)["new_token_ratio"] for s in record.steps]
    decodes = [not s.prefill_chunks for s in record.steps]
    # every decode batch (no retraction here: memory is ample) takes one decay off, a prefill batch none (or, after
    # the engine idled, the ratio is back at its start)
    for before, after, decode in zip(ratios, ratios[1:], decodes[1:]):
        if decode:
            assert after == pytest.approx(max(before - RATIO_DECAY, MIN_RATIO), abs=1e-12)
        else:
            assert after in (before, INIT_RATIO)
    assert sum(decodes) > len(decodes) / 2 and min(ratios) < INIT_RATIO - 10 * RATIO_DECAY


def test_a_backend_that_runs_every_pass_is_never_asked_for_a_decode_run():
    from prefillbench.backends.fake import FakeBackend

    backend = FakeBackend(0.0, 0.01)
    backend.run_decodes = lambda *a: pytest.fail("asked a backend whose runs_decodes is False")
    record = engine.run(backend, make_strategy("sequential"), requests(10, 2.0), 0)
    assert len(record.steps) == len(backend.steps)


def test_a_sim_with_pipeline_stages_or_a_trace_runs_every_step(tmp_path):
    traced = SimBackend(load_model_spec("mistral-7b"), load_gpu_spec("a100"), trace=str(tmp_path / "t.jsonl"))
    staged = SimBackend(load_model_spec("mistral-7b"), load_gpu_spec("a100"), pp=2)
    for backend in (traced, staged):
        backend.prepare(4, 1024, 1024)
        assert not backend.runs_decodes
    assert sim().runs_decodes

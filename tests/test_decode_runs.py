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


def sim(jitter: float = 0.0, step_by_step: bool = False, mem_bytes: float | None = None) -> SimBackend:
    gpu = dataclasses.replace(load_gpu_spec("a100"), step_jitter=jitter)
    backend = SimBackend(load_model_spec("mistral-7b"),
                         gpu if mem_bytes is None else dataclasses.replace(gpu, mem_bytes=mem_bytes))
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
#: is: SGLang's, whose new_token_ratio falls with every decode batch it chooses (a count of its calls), and a waiting
#: prompt is tried against the ratio every step; so the engine runs their decodes in a row only while nothing waits,
#: and has them take the decays of the steps it did not ask for (Strategy.ran_decodes).
COUNTS_ITS_CALLS = {"sglang", "sglang-mixed"}


@pytest.mark.parametrize("strategy", [n for n, c in STRATEGIES.items()
                                      if not c.needs_price])  # slo-budget: test_slo_budget.py
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


def test_every_shipped_strategy_lets_the_engine_run_decodes_those_that_count_their_calls_while_nothing_waits():
    # Each of them chooses from which sequences wait and run and how far each prompt is, nothing else; SGLang's
    # ratio decays once a decode batch, so a decode run hands it the steps it skipped.
    assert {name for name, cls in STRATEGIES.items() if not cls.steady_decodes} == COUNTS_ITS_CALLS
    assert all(STRATEGIES[name].steady_while_none_waits for name in COUNTS_ITS_CALLS)
    # a cadence counts steps: no decode runs of either kind
    paced = make_strategy("sglang · cadence decode-rounds:2", 128)
    assert not paced.steady_decodes and not paced.steady_while_none_waits


@pytest.mark.parametrize("strategy", sorted(COUNTS_ITS_CALLS))
def test_a_strategy_that_counts_its_calls_runs_decodes_and_its_ratio_falls_with_each_step(strategy):
    backend = sim()
    record = engine.run(backend, make_strategy(strategy, 128), requests(30, 2.0), 0)
    assert max(backend.runs) > 1
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


@pytest.mark.parametrize("strategy", sorted(COUNTS_ITS_CALLS))
def test_sglang_under_memory_pressure_records_the_same_retractions_and_ratios_either_way(strategy):
    """A KV memory that holds a few requests only: decode batches retract (the ratio is set, not decayed), prompts
    wait between runs, and the runs stop where the blocks run out; what is recorded, ratios included, is the
    same to the float as asking the strategy for every step."""
    long_outputs = TestSpec(200, 600, spread=0.9)  # the ratio falls for hundreds of batches before memory runs out
    reqs = make_requests(long_outputs, 60, 32000, 3, ArrivalSpec("poisson", 4.0).times(60, 3, long_outputs))
    out = []
    for step_by_step in (False, True):
        backend = sim(step_by_step=step_by_step, mem_bytes=16.3e9)  # about 5,700 tokens of KV beside the weights
        out.append((backend, engine.run(backend, make_strategy(strategy, 128), reqs, 0)))
    (fast, a), (slow, b) = out
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert (fast.clock, fast.n_steps, fast._held) == (slow.clock, slow.n_steps, slow._held)
    assert sum(r.retractions for r in a.requests) > 0  # the pressure is real: batches retracted
    ratios = [dict(s.policy_values)["new_token_ratio"] for s in a.steps]
    assert len(set(ratios)) > 100 and fast.runs and max(fast.runs) > 1

"""A probe stops once its failure is certain (CertainFailure): never a probe that would pass, never a verdict
that the whole run would not give, and every sequence's cache given back."""
from __future__ import annotations

import numpy as np
import pytest

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench.capacity import CapacityConfig, CertainFailure, Criteria, probe_case
from prefillbench.bench.cases import Case
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, make_requests
from prefillbench.sequence import Request

TEST = TestSpec(512, 64, spread=0.5)


@pytest.mark.parametrize("n", [10, 101, 1000, 4150])
@pytest.mark.parametrize("q", [50.0, 90.0, 99.0])
def test_the_count_it_needs_is_the_count_at_which_numpys_percentile_passes_the_limit(n, q):
    watch = CertainFailure([Criteria(100, percentile=q)], [Request((1,), n + 1)])  # n TBTs
    need = watch.needed[0]["tbt"]
    # The bound is sufficient whatever the values under the limit, and tight: one fewer over it (barely over,
    # the rest at 0) and the percentile can stay within.
    for under in (0.0, 99.9):
        assert np.percentile(np.concatenate([np.full(n - need, under), np.full(need, 100.1)]), q) > 100
    if need > 1:
        assert np.percentile(np.concatenate([np.zeros(n - need + 1), np.full(need - 1, 100.1)]), q) <= 100


@pytest.mark.parametrize("strategy, budget", [("sequential", None), ("chunked", 256), ("static", None)])
@pytest.mark.parametrize("criteria", [Criteria(60), Criteria(500, sched_delay_p50_ms=300), Criteria(None, ttft_ms=800, percentile=90)])
def test_a_stopped_probe_fails_as_its_whole_run_would_and_a_passing_one_is_never_stopped(strategy, budget, criteria):
    backend = SimBackend.load("llama-13b", "a6000")
    config = CapacityConfig(TEST, [strategy], [], criteria, requests=120)
    case = Case(TEST, strategy, 0, budget)
    stopped = 0
    for rate in (0.5, 1.5, 3.0, 6.0, 12.0):
        early = probe_case(backend, case, config, rate)
        full = probe_case(backend, case, config, rate, watch=[])
        assert not full.stopped_early
        assert early.passed == full.passed
        if early.stopped_early:
            stopped += 1
            assert early.limited_by and set(early.limited_by) <= set(full.limited_by)
            assert early.row.requests < full.row.requests
        else:
            assert early.values == pytest.approx(full.values, rel=1e-9)
    assert stopped >= 1  # the high rates fail long before their last request


def test_a_stopped_run_keeps_the_finished_requests_and_frees_every_sequence():
    backend = SimBackend.load("llama-13b", "a6000")
    requests = make_requests(TEST, 200, backend.vocab_size, 3, ArrivalSpec("poisson", 20.0).times(200, 3, TEST))
    calls = []

    def stop(progress: engine.Progress) -> bool:
        calls.append(len(progress.finished))
        return len(progress.finished) >= 5

    run = engine.run(backend, make_strategy("chunked", 256), requests, 0, stop=stop)
    assert run.stopped and 5 <= len(run.requests) < 200
    assert all(len(r.token_times) >= 1 for r in run.requests)
    assert backend._held == 0 and not backend._seq_tokens
    assert len(run.steps) == engine.STOP_CHECK_STEPS * len(calls)


def test_with_several_criteria_a_probe_stops_only_when_all_of_them_fail():
    backend = SimBackend.load("llama-13b", "a6000")
    strict, loose = Criteria(30), Criteria(10_000, sched_delay_p50_ms=1e9)
    config = CapacityConfig(TEST, ["sequential"], [], strict, requests=120)
    case = Case(TEST, "sequential", 0, None)
    one = probe_case(backend, case, config, 3.0, watch=[strict])
    both = probe_case(backend, case, config, 3.0, watch=[strict, loose])
    assert one.stopped_early and one.certain == {strict: ["tbt"]}
    assert not both.stopped_early and not both.passed  # the loose SLO needs the whole run

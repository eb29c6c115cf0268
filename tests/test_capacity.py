"""The capacity search: bracket then bisect, against probes and a backend whose capacity is known by construction."""
from __future__ import annotations

import math

import pytest

from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench.capacity import (MAX_BRACKET_STEPS, CapacityConfig, Criteria, Probe, SearchResult, find_capacity,
                                         relative_capacities, search)
from prefillbench.bench.metrics import ResultRow
from prefillbench.bench.workloads import TestSpec
from prefillbench.backends.fake import FakeBackend
from rows import make_row


def threshold_probe(capacity: float, log: list[float]):
    def probe(rate: float) -> Probe:
        log.append(rate)
        return Probe(rate, rate <= capacity, None)
    return probe


@pytest.mark.parametrize("true, start", [(3.7, 1.0), (3.7, 100.0), (0.02, 1.0), (1.0, 1.0)])
def test_search_brackets_then_bisects_to_the_precision(true, start):
    log: list[float] = []
    result = search(threshold_probe(true, log), start, precision=0.02)
    assert true / 1.02 <= result.capacity <= true
    assert len(result.probes) == len(log) == len(set(log))  # no rate probed twice
    passed = [p.rate for p in result.probes if p.passed]
    failed = [p.rate for p in result.probes if not p.passed]
    assert max(passed) == result.capacity and min(failed) > true
    assert min(failed) - result.capacity <= 0.02 * result.capacity


def test_search_reports_zero_when_nothing_passes_and_stops_when_everything_does():
    never = search(threshold_probe(-1, []), 1.0)
    assert never.capacity == 0.0 and len(never.probes) == MAX_BRACKET_STEPS + 1
    always = search(threshold_probe(math.inf, []), 1.0)
    assert always.capacity == 2.0 ** MAX_BRACKET_STEPS
    assert always.hit_bound and not never.hit_bound and always.upper == math.inf


def test_the_stopping_rule_and_the_probe_count_are_pinned():
    # Doubling from 1 until 4 fails, then bisecting [2, 4) until the bracket is at most 2% of its low end.
    log: list[float] = []
    result = search(threshold_probe(3.7, log), 1.0, precision=0.02)
    assert log == [1, 2, 4, 3, 3.5, 3.75, 3.625, 3.6875]
    assert result.capacity == 3.6875 and result.upper == 3.75 and not result.hit_bound
    # Near a known capacity the bracket grows by 20% a step: pass, fail, then two bisections.
    near: list[float] = []
    search(threshold_probe(1.09, near), 1.0, precision=0.05, growth=1.2)
    assert near == [1.0, 1.2, 1.1, pytest.approx(1.05)]


def test_the_row_at_capacity_is_the_probe_at_capacity():
    result = search(lambda rate: Probe(rate, rate <= 3.7, _row(offered_rps=rate, tbt_p99_ms=rate)), 1.0, precision=0.02)
    assert result.at_capacity.rate == result.capacity == 3.6875
    assert result.at_capacity.row.offered_rps == result.capacity  # not the first probe's (1 req/s)


def test_an_unfinished_search_keeps_what_its_probes_showed():
    probes = [Probe(1.0, True, None), Probe(2.0, True, None), Probe(4.0, False, None, ["sched"])]
    partial = SearchResult.partial(probes)
    assert partial.capacity == 2.0 and partial.interrupted and partial.limited_by == "scheduling delay"
    assert SearchResult.partial([Probe(1.0, False, None)]).capacity == 0.0


def _row(**kw) -> ResultRow:
    base = dict(backend="b", strategy="s", test="t", n_prompt=1, n_gen=1, concurrency=0, requests=1, repetitions=1,
                ts_mean=1.0, ts_std=0.0, ms_per_token=1.0, throughput=1.0, ttft_p50_ms=1.0, ttft_p99_ms=1.0,
                tbt_p50_ms=1.0, tbt_p99_ms=100.0, sched_delay_p50_ms=10.0)
    return make_row(**{**base, **kw})


def test_criteria_are_p99_tbt_and_median_scheduling_delay():
    c = Criteria(tbt_p99_ms=100, sched_delay_p50_ms=50)
    assert c.met(_row())
    assert not c.met(_row(tbt_p99_ms=100.5))
    assert not c.met(_row(sched_delay_p50_ms=51))
    assert c.met(_row(tbt_p99_ms=math.nan))  # one-token requests: no gap to miss
    with pytest.raises(ValueError):
        Criteria(tbt_p99_ms=0)


def test_capacity_of_a_backend_that_serves_ten_requests_per_second():
    # One-token requests, one per 0.1 s step: the backend serves 10 req/s. Nearly even arrivals (gamma,
    # burstiness 10^4) leave no queue below that rate; above it the queue, and the delay, grow with every request.
    backend = FakeBackend(seconds_per_token=0.0, seconds_per_step=0.1)
    config = CapacityConfig(TestSpec(1, 0), ["sequential"], [], Criteria(tbt_p99_ms=1000, sched_delay_p50_ms=50),
                            requests=200, arrival="gamma", burstiness=1e4, precision=0.02, start_rate=3.0)
    config.validate()
    (case,) = config.cases()
    starts = []
    result = find_capacity(backend, case, config, on_probe_start=lambda c, n, rate: starts.append((n, rate)))
    assert 10 / 1.03 <= result.capacity <= 10.05
    assert [n for n, _ in starts] == list(range(1, len(result.search.probes) + 1))
    assert [r for _, r in starts][:3] == [3.0, 6.0, 12.0]  # bracketing by doubling
    row = result.row
    assert row.capacity_rps == result.capacity and row.rate is None and row.arrival == "gamma"
    assert row.sched_delay_p50_ms <= 50
    # The row was measured at the capacity: its requests arrived at that rate, not at the first probe's 3 req/s.
    assert row.offered_rps == pytest.approx(result.capacity, rel=0.01)
    assert result.search.limited_by == "scheduling delay"


@pytest.mark.parametrize("kwargs, message", [
    (dict(requests=1), "at least 2"), (dict(arrival="closed"), "poisson or gamma"), (dict(precision=1.5), "precision"),
    (dict(start_rate=0), "rate above 0"), (dict(strategies=["fifo"]), "unknown strategy"),
])
def test_bad_capacity_settings_are_refused(kwargs, message):
    base = dict(test=TestSpec(8, 4), strategies=["sequential"], chunk_sizes=[64], criteria=Criteria(100))
    base.update(kwargs)
    with pytest.raises(ValueError, match=message):
        CapacityConfig(**base).validate()


def test_on_the_sim_chunked_prefill_has_more_capacity_than_sequential_under_a_strict_tbt_slo():
    backend = SimBackend.load("mistral-7b", "a100")
    config = CapacityConfig(TestSpec(1024, 128, spread=0.9), ["sequential", "chunked"], [512], Criteria(100),
                            requests=60, precision=0.1)
    results = [find_capacity(backend, case, config) for case in config.cases()]
    sequential, chunked = results
    assert sequential.row.tbt_p99_ms <= 100 and chunked.row.tbt_p99_ms <= 100
    assert relative_capacities(results, "sequential") == [1.0, pytest.approx(chunked.capacity / sequential.capacity)]
    assert chunked.capacity > 1.5 * sequential.capacity


def _fifo_run(rate: float, service_s: float, n: int, known_start: bool = True):
    """n requests arriving evenly at `rate`, served one at a time for `service_s` each, first come first served."""
    from prefillbench.engine import RequestRecord, RunRecord
    reqs, free = [], 0.0
    for i in range(n):
        arrival = i / rate
        start = max(arrival, free)
        free = start + service_s
        reqs.append(RequestRecord(8, arrival, [free], [0], first_scheduled=start if known_start else None))
    return RunRecord(0.0, free, reqs, [])


@pytest.mark.parametrize("rate, expected", [(5.0, 0.0), (9.9, 0.0), (12.0, 12 / 10 - 1), (20.0, 1.0), (40.0, 3.0)])
def test_queue_growth_is_how_far_the_rate_is_over_what_the_system_serves(rate, expected):
    # Served at 10 req/s: over capacity the request arriving at t waits (rate/10 - 1) t; under it, never.
    from prefillbench.bench.metrics import queue_growth
    assert queue_growth(_fifo_run(rate, 0.1, 30)) == pytest.approx(expected, abs=1e-9)
    # Where the backend does not say when a prompt started, the TTFT grows the same (it is the wait plus the service).
    assert queue_growth(_fifo_run(rate, 0.1, 30, known_start=False)) == pytest.approx(expected, abs=1e-9)


def _slots_run(rate: float, service_s: float, n: int):
    """n requests arriving evenly at `rate`, each given a slot on arrival (so scheduled at once), their prompts then
    served one at a time for `service_s` each in slot order rather than arrival order (llama-server's slots are
    taken least recently used first), here at the extreme: the latest started first."""
    from prefillbench.engine import RequestRecord, RunRecord
    arrivals = [i / rate for i in range(n)]
    done, waiting, t, i = {}, [], 0.0, 0
    while len(done) < n:
        while i < n and arrivals[i] <= t + 1e-12:
            waiting.append(i)
            i += 1
        if not waiting:
            t = arrivals[i]
            continue
        t += service_s
        done[waiting.pop()] = t
    reqs = [RequestRecord(8, arrivals[k], [done[k]], [0], first_scheduled=arrivals[k]) for k in range(n)]
    return RunRecord(0.0, t, reqs, [])


@pytest.mark.parametrize("rate, expected", [(5.0, 0.0), (8.0, 0.0), (15.0, 15 / 10 - 1), (30.0, 2.0)])
def test_queue_growth_sees_a_queue_inside_started_prompts_that_the_requests_own_waits_cannot(rate, expected):
    # Served at 10 req/s by slots that start every request on arrival: no request's scheduling delay grows at any
    # rate, and over capacity the first requests wait longest (served last), so their TTFT falls with arrival;
    # the first tokens still come out at 10 a second, the queue's growth as in first come, first served.
    from prefillbench.bench.metrics import queue_growth, sched_delay_ms, ttft_ms
    from scipy.stats import theilslopes
    run = _slots_run(rate, 0.1, 30)
    assert all(sched_delay_ms(r) == 0 for r in run.requests)
    if expected:
        own = theilslopes([ttft_ms(r) for r in run.requests], [r.arrival for r in run.requests]).slope
        assert own / 1000 < 1e-9  # no growth seen
    assert queue_growth(run) == pytest.approx(expected, abs=1e-9)


def test_queue_growth_is_fitted_on_at_most_growth_points_requests_and_needs_three():
    from prefillbench.bench.metrics import GROWTH_POINTS, queue_growth
    assert queue_growth(_fifo_run(20.0, 0.1, 5 * GROWTH_POINTS)) == pytest.approx(1.0, abs=1e-9)
    assert math.isnan(queue_growth(_fifo_run(20.0, 0.1, 2)))


def test_a_short_probe_over_capacity_fails_on_queue_growth_where_the_delay_bound_cannot_see_it():
    # 30 one-token requests served at 10 req/s: even all at once they drain in 3 s, a median delay of 1.5 s, under
    # Sarathi-Serve's 2 s bound at any rate. Only the queue's growth tells 12 req/s (over by 20%) from 8.
    backend = FakeBackend(seconds_per_token=0.0, seconds_per_step=0.1)
    config = CapacityConfig(TestSpec(1, 0), ["sequential"], [], Criteria(tbt_p99_ms=1000), requests=30,
                            arrival="gamma", burstiness=1e4, precision=0.02, start_rate=3.0)
    (case,) = config.cases()
    result = find_capacity(backend, case, config)
    assert 10 / 1.1 <= result.capacity <= 10 * (1 + config.criteria.max_queue_growth) * 1.02
    assert result.search.limited_by == "queue growth" and not result.search.hit_bound
    loose = CapacityConfig(TestSpec(1, 0), ["sequential"], [], Criteria(tbt_p99_ms=1000, max_queue_growth=1e9),
                           requests=30, arrival="gamma", burstiness=1e4, precision=0.02, start_rate=3.0)
    assert find_capacity(backend, case, loose).search.hit_bound  # what the delay bound alone finds: no top

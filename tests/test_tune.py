"""tune's search, against a fake backend whose capacity per configuration is known by construction.

Prompt-only requests of 8 tokens, one emitted token each, arriving nearly evenly (gamma, burstiness 10^4), on a
backend whose every step takes 0.1 s whatever it holds: chunked with budget B needs ceil(8 / B) steps per
request, one request at a time, so it keeps up below 10 / ceil(8 / B) req/s and its queue (and the median
scheduling delay) grows above it; sequential takes a prompt per step: 10 req/s.
"""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.calibration import at_speed
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.backends.sim.cost import Batch, CostModel
from prefillbench.bench import sim_first, tune
from prefillbench.bench.capacity import Criteria, Probe, SearchResult
from prefillbench.bench.pricing import pricer
from prefillbench.bench.workloads import TestSpec, make_requests
from prefillbench.report import tune as report
from prefillbench.commands import parsers
from prefillbench.backends.fake import FakeBackend

PRECISION = 0.02
TRUE = {tune.Config("sequential", None): 10.0, tune.Config("chunked", 1): 1.25, tune.Config("chunked", 2): 2.5,
        tune.Config("chunked", 4): 5.0, tune.Config("chunked", 8): 10.0}


def settings(repeats: int = 1, criteria=None, **kw) -> tune.TuneSettings:
    return tune.TuneSettings(TestSpec(8, 0), criteria or [Criteria(tbt_p99_ms=1000, sched_delay_p50_ms=50)], 200,
                             arrival="gamma", burstiness=1e4, repeats=repeats, start_rate=3.0, precision=PRECISION, **kw)


def configs() -> list[tune.Config]:
    return tune.grid(["sequential", "chunked"], [1, 2, 4, 8])


def test_the_grid_lists_strategies_that_ignore_the_budget_once():
    assert configs() == list(TRUE)


def test_each_configuration_is_found_within_the_precision_and_ranked():
    grid = tune.run_grid(FakeBackend(0.0, 0.1), configs(), settings(repeats=2))
    assert not grid.stopped and len(grid.results) == len(TRUE)
    for r in grid.results:
        true = TRUE[r.config]
        assert true / (1 + 2 * PRECISION) <= r.capacity <= true * 1.005, (r.config, r.capacity)
        assert r.low <= r.capacity < r.high and r.limited_by == "scheduling delay"
        assert len(r.searches) == 2 and {p.seed for p in r.probes} == {42, 1042}  # fresh seeds across repeats
        # The reported row is the probe at capacity: its offered rate is the capacity.
        assert r.at_capacity.rate == r.capacity and r.at_capacity.passed
        assert r.at_capacity.row.offered_rps == pytest.approx(r.capacity, rel=0.01)
    order = [r.config for r in tune.ranked(grid.results)]
    assert order[2:] == [tune.Config("chunked", 4), tune.Config("chunked", 2), tune.Config("chunked", 1)]
    by = {r.config: r for r in grid.results}
    assert by[tune.Config("sequential", None)].ties(by[tune.Config("chunked", 8)])  # both 10 req/s
    assert not by[tune.Config("chunked", 4)].ties(by[tune.Config("chunked", 2)])
    # The second seed searched near the first one's capacity: fewer probes than the first.
    seq = by[tune.Config("sequential", None)]
    assert len(seq.searches[1].probes) < len(seq.searches[0].probes)


def test_every_configuration_replays_the_same_trace_per_seed():
    seen: dict[tuple[float, int], dict] = {}

    def note(config, index, p):
        if not p.stopped_early:  # a stopped run's row holds the requests finished by then
            seen.setdefault((p.rate, p.seed), {})[config] = p.row.offered_rps

    tune.run_grid(FakeBackend(0.0, 0.1), configs(), settings(repeats=2), on_probe=note)
    shared = {key: offered for key, offered in seen.items() if len(offered) > 1}
    assert len(shared) >= 2  # the start rate at least, for every chain
    for offered in shared.values():
        # Identical arrivals for every configuration at that rate and seed (up to where each run's clock started).
        first = next(iter(offered.values()))
        assert all(v == pytest.approx(first, rel=1e-12) for v in offered.values())
    assert {seed for _, seed in seen} == {42, 1042}


def test_a_strategys_budgets_start_near_the_previous_budgets_capacity():
    # Budgets 8 and 16 both take a prompt in one step: the same capacity, 10 req/s.
    grid = tune.run_grid(FakeBackend(0.0, 0.1), tune.grid(["chunked"], [8, 16]), settings())
    first, second = grid.results
    assert first.probes[0].rate == 3.0  # the first budget climbs from the start rate
    assert second.probes[0].rate == first.capacity  # the next starts at its capacity, bracketing by 20% steps
    assert len(second.probes) <= 5 < len(first.probes)  # pass, fail, bisections of an 8% bracket to 2%
    assert second.capacity == pytest.approx(10.0, rel=2 * PRECISION)


def test_a_list_of_slos_gives_capacity_against_the_slo_from_shared_runs():
    crit = [Criteria(tbt_p99_ms=1000, sched_delay_p50_ms=50), Criteria(tbt_p99_ms=1000, sched_delay_p50_ms=5000)]
    backend = FakeBackend(0.0, 0.1)
    grid = tune.run_grid(backend, [tune.Config("chunked", 4)], settings(criteria=crit))
    strict, loose = grid.results
    assert strict.criteria == crit[0] and loose.criteria == crit[1]
    assert loose.capacity > strict.capacity  # a looser delay bound admits a growing queue for longer
    table = report.render_vs_slo(grid.results, crit)
    assert "chunked (4)" in table and table.count("|") > 6


class InterruptedBackend(FakeBackend):
    """Ctrl-C in the middle of the `at`-th engine run (warm-ups count): where a real one arrives, in the backend."""

    def __init__(self, at: int) -> None:
        super().__init__(0.0, 0.1)
        self.runs, self.at = 0, at

    def prepare(self, *args):
        self.runs += 1
        super().prepare(*args)

    def execute(self, step, return_logits=False):
        if self.runs == self.at:
            raise KeyboardInterrupt
        return super().execute(step, return_logits)


def test_ctrl_c_keeps_finished_configurations_and_probes():
    reported = []
    grid = tune.run_grid(InterruptedBackend(at=14), configs(), settings(),
                         on_probe=lambda config, index, p: reported.append((config, p)))
    assert grid.stopped == "interrupted"
    # Every probe that finished is kept, under its configuration; each chain keeps its finished configurations.
    assert sorted((r.config.label, p.rate) for r in grid.results for p in r.probes) == sorted(
        (c.label, p.rate) for c, p in reported)
    assert len(reported) >= 10
    by = {r.config: r for r in grid.results}
    assert set(grid.left) == {c for c in configs() if c not in by or by[c].interrupted}
    assert any(r.interrupted for r in grid.results)
    for r in grid.results:
        passed = [p.rate for p in r.probes if p.passed]
        if r.interrupted:
            assert r.capacity == (max(passed) if passed else 0.0)


def test_the_measured_stage_takes_turns_a_probe_each_and_finds_what_it_finds_alone():
    s = settings()
    chosen = [tune.Config("sequential", None), tune.Config("chunked", 2), tune.Config("chunked", 4)]
    order = []
    turns = tune.run_grid(FakeBackend(0.0, 0.1), chosen, s, on_probe=lambda c, i, p: order.append(c.strategy))
    # Alone: one chain at a time (the sim's path, and a single chain's).
    alone = [tune.run_grid(FakeBackend(0.0, 0.1), [c for c in chosen if c.strategy == k], s).results
             for k in ("sequential", "chunked")]
    assert [(r.config, [(p.rate, p.passed) for p in r.probes]) for r in turns.results] == [
        (r.config, [(p.rate, p.passed) for p in r.probes]) for rs in alone for r in rs]
    # The two chains alternated, probe by probe, while both were searching.
    n_seq = order.count("sequential")
    assert order[:2 * n_seq] == ["sequential", "chunked"] * n_seq


def test_the_time_budget_stops_before_a_probe_that_would_end_past_it():
    import time
    grid = tune.run_grid(FakeBackend(0.0, 0.1), configs(), settings(), deadline=time.monotonic() + 1.0)
    # Each probe of 200 requests at a few req/s spans over a minute: the first would end past the budget.
    assert grid.stopped.startswith("time budget") and grid.results == [] and grid.left == configs()


def test_the_sim_first_stage_measures_the_sims_top_k_and_sequential_from_its_predictions():
    s = settings()
    chosen = [tune.Config("sequential", None), tune.Config("chunked", 1), tune.Config("chunked", 2), tune.Config("chunked", 4)]
    predicted = tune.run_grid(FakeBackend(0.0, 0.1), chosen, s).results
    # The "real" backend is 25% slower per step: every capacity is 0.8 times the prediction.
    measured = sim_first.measure_picks(FakeBackend(0.0, 0.125), predicted, s, top_k=2).results
    assert [r.config for r in measured] == [tune.Config("sequential", None), tune.Config("chunked", 4)]
    for c in sim_first.compare_stages(predicted, measured):
        assert c.measured.capacity == pytest.approx(0.8 * TRUE[c.measured.config], rel=2 * PRECISION)
        assert c.error == pytest.approx(0.25, abs=0.06)
        # The error against the measured interval: its top gives the low end, its bottom (the capacity) the high end.
        low, high = c.error_range
        assert high == pytest.approx(c.error) and low == pytest.approx(c.predicted.capacity / c.measured.high - 1)
        assert low <= high and c.error_text.endswith(f"{high:+.0%}")
        # Started at the prediction: bracketing near it, not from the start rate.
        assert c.measured.probes[0].rate == c.predicted.capacity
    assert not sim_first.order_differs(sim_first.compare_stages(predicted, measured))
    table = report.render_ranked(measured, 8.0, predicted, verbose=True)
    assert "sim req/s" in table and any(f"+{pct}%" in table for pct in (24, 25, 26))


def _result(config: tune.Config, capacity: float, upper: float) -> tune.ConfigResult:
    probes = [Probe(capacity, True, None), Probe(upper, False, None, ["tbt"])]
    return tune.ConfigResult(config, Criteria(100), [SearchResult(capacity, probes)])


def test_pick_for_measurement_adds_sequential_and_order_differs_past_ties():
    a, b, seq = tune.Config("chunked", 512), tune.Config("sarathi-serve", 512), tune.Config("sequential", None)
    predicted = [_result(seq, 1.0, 1.05), _result(a, 5.0, 5.25), _result(b, 4.0, 4.2)]
    assert sim_first.pick_for_measurement(tune.ranked(predicted), 1) == [a, seq]
    assert sim_first.pick_for_measurement(tune.ranked(predicted), 3) == [a, b, seq]
    reversed_ = [_result(seq, 1.0, 1.05), _result(a, 3.0, 3.15), _result(b, 4.0, 4.2)]
    assert sim_first.order_differs(sim_first.compare_stages(predicted, reversed_))
    tied = [_result(seq, 1.0, 1.05), _result(a, 3.9, 4.1), _result(b, 4.0, 4.2)]  # overlapping intervals
    assert not sim_first.order_differs(sim_first.compare_stages(predicted, tied))
    notes = report.stage_notes(predicted, reversed_)
    assert "the measured order differs" in notes[-1]


def test_verdict_names_the_best_its_ratio_and_its_ties():
    a, b, seq = tune.Config("sarathi-serve", 512), tune.Config("chunked", 512), tune.Config("sequential", None)
    results = [_result(seq, 1.69, 1.77), _result(a, 5.0, 5.25), _result(b, 5.0, 5.25)]
    line = report.verdict(results, Criteria(100))
    assert line.startswith("best within TBT p99 <= 100 ms: chunked, budget 512: 5.000 req/s, 2.96x sequential")
    assert "tie" in line and "sarathi-serve (512)" in line


@pytest.mark.parametrize("text, values", [("64:512:x2", [64, 128, 256, 512]), ("64,128", [64, 128]),
                                          ("100:300:+100", [100, 200, 300]), ("64:100:x2,64", [64])])
def test_budget_ranges(text, values):
    assert parsers.parse_budgets([text]) == values


@pytest.mark.parametrize("text", ["64:32:x2", "64:512", "64:512:x1", "a:b:x2", "0"])
def test_bad_budget_ranges(text):
    with pytest.raises(ValueError):
        parsers.parse_budgets([text])


def test_slo_lists():
    slos = parsers.parse_slo_list("tbt=50,100,200,ttft=1000")
    assert [s.tbt_ms for s in slos] == [50, 100, 200] and {s.ttft_ms for s in slos} == {1000}
    with pytest.raises(ValueError, match="only one SLO key"):
        parsers.parse_slo_list("tbt=50,100,ttft=1,2")


def test_criteria_at_another_percentile_name_what_they_exceed():
    c = Criteria(tbt_p99_ms=100, ttft_ms=500, percentile=90)
    assert c.describe() == "TBT p90 <= 100 ms, TTFT p90 <= 500 ms"
    assert c.exceeded({"tbt": 101, "ttft": 400, "tpot": math.nan, "e2e": math.nan, "sched": 10}) == ["tbt"]
    assert c.exceeded({"tbt": 50, "ttft": 600, "tpot": math.nan, "e2e": math.nan, "sched": 3000}) == ["ttft", "sched"]


@pytest.mark.parametrize("tp,shape_terms", [(1, {}), (2, {}), (1, {"decode_attention_fraction": 0.05, "mixed_step_factor": 1.3})])
def test_the_sims_fast_step_price_is_step_costs(tp, shape_terms):
    cost = CostModel(load_model_spec("mistral-7b"), load_gpu_spec("a100").with_calibration(shape_terms), tp=tp)
    for chunks, decodes in [(((0, 512, False),), ()), (((1024, 300, True), (0, 212, False)), (700, 1500, 33)),
                            ((), (1,) * 130), (((0, 40, True),), (2048,))]:
        batch = Batch(chunks, decodes)
        fast = cost.fast_seconds([(s, n) for s, n, _ in chunks], len(decodes), sum(decodes), batch.n_emit)
        assert fast == cost.step_cost(batch).seconds  # the same float, not just close


def test_the_sim_backend_runs_the_same_with_and_without_a_trace(tmp_path):
    from strategies import make_strategy
    from prefillbench import engine
    from prefillbench.bench.workloads import ArrivalSpec, make_requests

    test = TestSpec(700, 20, spread=0.5)
    runs = []
    for trace in (None, tmp_path / "t.jsonl"):
        backend = SimBackend.load("mistral-7b", "a100", trace=trace)
        reqs = make_requests(test, 30, backend.vocab_size, 1, ArrivalSpec("poisson", 4.0).times(30, 1))
        runs.append(engine.run(backend, make_strategy("sarathi-serve", 256), reqs, 0))
    assert [r.token_times for r in runs[0].requests] == [r.token_times for r in runs[1].requests]


# ---- the pool of processes the sim's grid runs on ------------------------------------------------------------
def sim_settings(repeats: int = 2) -> tune.TuneSettings:
    return tune.TuneSettings(TestSpec(1024, 64, spread=0.9), [Criteria(tbt_p99_ms=100)], 60, repeats=repeats,
                             precision=0.2)


def searched(grid: tune.GridResult) -> list:
    # Rates to 9 digits: the sim's clock runs on across runs, so a run's times carry the rounding of its offset.
    return [(r.config, [(f"{s.capacity:.9g}", s.interrupted, [(p.seed, f"{p.rate:.9g}", p.passed) for p in s.probes])
                        for s in r.searches]) for r in grid.results]


def test_the_pool_finds_what_one_process_finds_probe_for_probe():
    chosen = tune.grid(["sequential", "chunked", "static"], [256, 1024])
    serial = tune.run_grid(SimBackend.load("mistral-7b", "a100"), chosen, sim_settings())
    finished = []
    pooled = tune.run_grid(SimBackend.load("mistral-7b", "a100"), chosen, sim_settings(), on_config=lambda c, found: finished.append(c), jobs=2)
    assert not pooled.stopped and searched(pooled) == searched(serial)
    assert all(len(r.searches) == 2 for r in pooled.results)  # each further seed searched apart, then joined
    assert sorted(finished) == sorted(chosen)  # a configuration is finished once all its seeds are


def test_ctrl_c_during_the_pool_keeps_every_reported_probe():
    sim = SimBackend.load("mistral-7b", "a100")
    chosen = tune.grid(["sequential", "chunked"], [256, 1024])
    reported = []

    def interrupt_at_fifteen(config, index, p):
        reported.append(p)
        if len(reported) == 15:
            raise KeyboardInterrupt

    grid = tune.run_grid(sim, chosen, sim_settings(), on_probe=interrupt_at_fifteen, jobs=2)
    assert grid.stopped == "interrupted" and grid.left
    assert sum(len(r.probes) for r in grid.results) == len(reported)
    for r in grid.results:
        assert r.interrupted == (r.config in grid.left)
        for s in r.searches:
            assert len({p.seed for p in s.probes}) == 1  # one search per seed, the unfinished one kept as partial


# ---- the measured stage's steps priced by the calibrated sim -------------------------------------------------
CAL = {"fitted": {"compute_fraction": 0.5, "memory_fraction": 0.6, "step_overhead_s": 1e-3}}


def calibrated(slowdown: float = 1.0) -> SimBackend:
    return SimBackend(load_model_spec("mistral-7b"), load_gpu_spec("a100"), calibration=at_speed(CAL, slowdown))


@pytest.mark.parametrize("strategy", ["sequential", "chunked", "sarathi-serve", "orca"])
def test_a_sim_run_priced_by_its_own_cost_model_costs_what_it_took(strategy):
    sim = calibrated()
    requests = make_requests(TestSpec(700, 20, spread=0.5), 12, sim.vocab_size, 7)
    run = engine.run(sim, make_strategy(strategy, 256), requests, 4)
    price = pricer(sim.cost)
    assert any(s.chunk_emits for s in run.steps) and any(s.decode_contexts for s in run.steps)
    for s in run.steps:
        assert price(s) == pytest.approx(s.seconds, rel=1e-9)


def test_at_speed_scales_every_step_price_by_the_slowdown():
    batches = [Batch(((0, 512, True),)), Batch((), (900,) * 16), Batch(((256, 256, False),), (300,) * 4)]
    for b in batches:
        assert calibrated(1.3).cost.seconds(b) == pytest.approx(1.3 * calibrated().cost.seconds(b), rel=1e-12)


def test_the_measured_stage_prices_its_steps_and_repredicts_at_the_speed_they_ran():
    # The "real" backend is the calibrated sim with every step 25% longer: its measured steps cost 1.25x their
    # price, and the sim slowed by that much finds the measured capacities, probe for probe.
    s = sim_settings(repeats=1)
    chosen = tune.grid(["sequential", "chunked"], [256, 1024])
    predicted = tune.run_grid(calibrated(), chosen, s).results
    measured = sim_first.measure_picks(calibrated(1.25), predicted, s, top_k=1, price=pricer(calibrated().cost)).results
    assert len(measured) == 2
    for m in measured:
        assert m.step_speed == pytest.approx(1.25, rel=1e-9) and all(p.busy_s > 0 for p in m.probes)
        assert m.capacity < [p for p in predicted if p.config == m.config][0].capacity  # slower: less capacity
    again = sim_first.repredict(calibrated, predicted, measured, s)
    assert [(r.config, f"{r.capacity:.9g}") for r in again] == [(m.config, f"{m.capacity:.9g}") for m in measured]
    assert all(r.stage == "sim at measured speed" for r in again)
    table = report.render_ranked(measured, 100.0, predicted, again, verbose=True)
    assert "steps vs sim" in table and "1.25x" in table
    assert "at the speed its steps ran (1.25x" in report.verdict(measured, s.criteria[0], predicted, again)
    assert any(line.startswith("at the speed the measured steps ran") and "+0%" in line
               for line in report.stage_notes(predicted, measured, again))
    records = report.config_records(measured, 100.0)
    assert all(r["step_time_vs_sim"] == pytest.approx(1.25) for r in records)
    # by step kind: the kinds add up to the probe, and each ran 1.25x too
    for m in measured:
        for p in m.probes:
            assert sum(t for t, _ in p.by_kind.values()) == pytest.approx(p.busy_s, rel=1e-12)
            assert sum(q for _, q in p.by_kind.values()) == pytest.approx(p.priced_s, rel=1e-12)
        assert set(m.kind_speeds()) >= {"decode"} and all(v == pytest.approx(1.25) for v in m.kind_speeds().values())
    chunked = [m for m in measured if m.config.strategy == "chunked"][0]
    assert {"prompt", "mixed", "decode"} <= set(chunked.kind_speeds())
    [kinds] = [line for line in report.stage_notes(predicted, measured, again) if line.startswith("their steps by kind")]
    assert f"{chunked.config.label} prompt alone 1.25x, prompt + decodes 1.25x, decode-only 1.25x" in kinds
    probe = report.probe_records(measured)[0]
    assert probe["busy_decode_s"] + probe["busy_mixed_s"] + probe["busy_prompt_s"] == pytest.approx(probe["busy_s"])
    # a kind that ran slower than the rest shows as such
    p0 = chunked.probes[0]
    took, priced = p0.by_kind["mixed"]
    p0.by_kind["mixed"] = (took * 1.2, priced)
    assert chunked.kind_speeds()["mixed"] > 1.25 and chunked.kind_speeds()["decode"] == pytest.approx(1.25)
    p0.by_kind["mixed"] = (took, priced)
    # A machine at one speed throughout gets no drift line; one whose speed moved between probes does.
    assert not any("speed moved" in line for line in report.stage_notes(predicted, measured, again))
    slow = measured[0].probes[0]
    slow.by_kind = {kind: (took * 1.2, priced) for kind, (took, priced) in slow.by_kind.items()}
    drift = [line for line in report.stage_notes(predicted, measured, again) if "speed moved" in line]
    assert len(drift) == 1 and "1.25x to 1.50x" in drift[0]


def test_the_slowed_sim_tells_the_configurations_at_the_edge_of_the_slo():
    s = sim_settings(repeats=1)
    chosen = tune.grid(["sequential", "chunked"], [256, 1024])
    predicted = tune.run_grid(calibrated(), chosen, s).results
    edge = sim_first.slowed(calibrated, predicted, chosen[:2], s)
    assert not edge.stopped and [r.config for r in edge.results] == chosen[:2]
    assert all(r.stage == "sim 10% slower" for r in edge.results)
    pred = {r.config: r for r in predicted}
    for r in edge.results:  # every step 10% longer: never more capacity, and the search found it on that sim
        assert 0 < r.capacity <= pred[r.config].capacity
        again = tune.run_grid(calibrated(1.1), [r.config], s).results[0]
        assert again.low <= r.capacity * (1 + s.precision) and r.capacity <= again.high
    table = report.render_ranked(predicted, 100.0, slower=edge.results, verbose=True)
    assert "sim 10% slower" in table
    row = [line for line in table.splitlines() if "| sequential " in line][0]
    change = sim_first.capacity_change(pred[chosen[0]], edge.results[0])
    assert f"{change:+.0%}" in row


def test_a_capacity_that_falls_by_more_than_a_quarter_when_steps_run_10_percent_slower_is_at_the_edge():
    k = Criteria(tbt_p99_ms=300)

    def result(config, capacity):
        return tune.ConfigResult(config, k, [SearchResult(capacity, [])])

    a, b, c = tune.Config("chunked", 32), tune.Config("sarathi-serve", 32), tune.Config("sequential", None)
    predicted = [result(a, 0.46), result(b, 0.45), result(c, 0.2)]
    slower = [result(a, 0.26), result(b, 0.41), result(c, 0.0)]
    edge = sim_first.at_the_edge(predicted, slower)
    assert [p.config for p, _ in edge] == [a, c]  # -43% and -100%; -9% is about the slowdown
    note, safer = report.edge_notes(predicted, slower)
    assert "chunked (32) -43% (0.46 -> 0.26 req/s)" in note and "sequential -100%" in note
    assert "sarathi-serve" not in note.split(".")[0]
    # the sim's best is at the edge, and another holds more with slower steps: that one is named
    assert [(a.config, b.config) for a, b in sim_first.margin_picks(predicted, slower)] == [(a, b)]
    assert safer == ("the sim's pick within TBT p99 <= 300 ms: sarathi-serve (32), 0.41 req/s with every step "
                     "10% longer, where chunked (32), the highest as calibrated, holds 0.26 (the picks are ranked by "
                     "what they keep)")
    assert report.edge_notes(predicted, [slower[1]]) == []  # chunked (32) never searched slowed: no pick over it
    # a best that is not at the edge needs no safer choice, nor does one that still holds the most
    assert sim_first.margin_picks([result(b, 0.46), result(a, 0.45)], [result(b, 0.41), result(a, 0.26)]) == []
    assert sim_first.margin_picks(predicted, [result(a, 0.26), result(b, 0.2)]) == []


def test_the_sim_picks_what_keeps_the_most_capacity_with_every_step_10_percent_longer():
    """A configuration at the edge of its SLO (the highest as calibrated, -42% slowed) is measured after one that
    keeps more: on this VM sarathi-serve (64) at P99 TBT 500 ms predicted 0.636 and measured 0.268 req/s."""
    k = Criteria(tbt_p99_ms=500)

    def result(config, capacity):
        probes = [Probe(capacity, True, None), Probe(capacity * 1.05, False, None, ["tbt"])]
        return tune.ConfigResult(config, k, [SearchResult(capacity, probes)])

    edge, steady, small, seq = (tune.Config("sarathi-serve", 64), tune.Config("chunked", 32),
                                tune.Config("chunked", 64), tune.Config("sequential", None))
    predicted = [result(edge, 0.636), result(steady, 0.578), result(small, 0.55), result(seq, 0.227)]
    slower = [result(edge, 0.368), result(steady, 0.506), result(small, 0.49), result(seq, 0.209)]
    assert [r.config for r in tune.ranked(predicted)] == [edge, steady, small, seq]
    assert [r.config for r in sim_first.margin_ranked(predicted, slower)] == [steady, small, edge, seq]
    s = replace(sim_settings(repeats=1), criteria=[k])
    assert sim_first.picks(predicted, s, 2, slower) == [steady, small, seq]
    assert sim_first.picks(predicted, s, 2) == [edge, steady, seq]  # without the slowed sim: by capacity
    # never searched slowed: last, whatever its capacity
    assert sim_first.margin_ranked(predicted, slower[1:])[-1].config == edge
    # the sim's own verdict and table (--sim-only) lead with the pick, and say what it keeps
    line = report.verdict(predicted, k, slower=slower)
    assert line == ("best within TBT p99 <= 500 ms: chunked, budget 32: 0.578 req/s, 2.55x sequential "
                    "(0.506 req/s with every step 10% longer)")
    assert [r.config for r in report._order(predicted, None, slower)] == [steady, small, edge, seq]  # the table's rows
    # measured results are ranked by what was measured, the slowed sim notwithstanding
    assert report.verdict(predicted, k, predicted, slower=slower).startswith("best within TBT p99 <= 500 ms: sarathi-serve")
    (its, pick), = sim_first.margin_picks(predicted, slower)
    assert (its.config, pick.config) == (edge, steady)


def test_the_default_table_has_the_deployers_columns_and_verbose_every_one():
    chosen = [tune.Config("sequential", None), tune.Config("chunked", 4)]
    predicted = tune.run_grid(FakeBackend(0.0, 0.1), chosen, settings()).results
    measured = sim_first.measure_picks(FakeBackend(0.0, 0.125), predicted, settings(), top_k=1).results
    plain, full = report.render_ranked(measured, 8.0, predicted), report.render_ranked(measured, 8.0, predicted, verbose=True)
    header = [h.strip() for h in plain.splitlines()[0].strip("|").split("|")]
    assert header == ["rank", "configuration", "capacity req/s", "sim req/s", "vs sequential", "limited by",
                      "P99 TBT ms", "P99 TTFT ms"]
    full_header = [h.strip() for h in full.splitlines()[0].strip("|").split("|")]
    assert set(header) < set(full_header) and {"interval", "tokens/s", "sim error", "probes"} <= set(full_header)

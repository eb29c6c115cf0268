"""tune's sim-first stage: the sim's top K measured on the real backend, predicted against measured.

The sim searches the whole grid (bench.tune.run_grid on the calibrated sim); these pick what to measure, measure
it from the predictions, search it again on the sim at the speed the measured steps ran, and compare the two.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from prefillbench.backends.base import Backend
from prefillbench.bench.pricing import Pricer
from prefillbench.bench.slo_pricing import prices_steps
from prefillbench.bench.tune import (Config, ConfigCallback, ConfigResult, GridResult, ProbeCallback, TuneSettings, by_criteria,
                                     ranked, run_grid)


def pick_for_measurement(order: list[ConfigResult], top_k: int, baseline: Config = Config("sequential", None)) -> list[Config]:
    """The first K configurations of `order` (the sim's predictions, best first) and the baseline, each once."""
    chosen = [r.config for r in order[:top_k]]
    chosen += [r.config for r in order if r.config == baseline and r.config not in chosen][:1]
    return chosen


def margin_ranked(predicted: list[ConfigResult], slower: list[ConfigResult]) -> list[ConfigResult]:
    """The predictions best first by the capacity each keeps with every step EDGE_SLOWDOWN times as long (`slower`,
    the same criteria), then as `ranked`; those never searched slowed go last. The calibration is known to about
    that much, and a configuration at the edge of its SLO keeps far less: ranked by what it keeps, the sim's pick
    is the one a slower minute or a calibration that far off does not take away (docs/history/2026-12-02)."""
    kept = {(r.config, r.criteria): r.capacity for r in slower}
    return sorted(ranked(predicted), key=lambda r: -kept.get((r.config, r.criteria), -1.0))


def picks(predicted: list[ConfigResult], settings: TuneSettings, top_k: int,
          slower: list[ConfigResult] | None = None) -> list[Config]:
    """What the measured stage measures: under each criteria the sim's top K (by margin_ranked where `slower` is
    given, else by capacity) and the baseline, each once; and where the grid holds a strategy that prices its steps
    (slo-budget), it and the sim's best fixed budget, so that the two are compared measured."""
    chosen: list[Config] = []
    for k in settings.criteria:
        mine = by_criteria(predicted, k)
        chosen += pick_for_measurement(margin_ranked(mine, by_criteria(slower, k)) if slower else ranked(mine), top_k,
                                       settings.baseline)
        adaptive = [r.config for r in mine if prices_steps(r.config.strategy)]
        fixed = [r.config for r in ranked(mine) if r.config.budget is not None][:1]
        chosen += adaptive + (fixed if adaptive else [])
    return list(dict.fromkeys(chosen))


def _predicted_starts(predicted: list[ConfigResult], settings: TuneSettings) -> dict[Config, float]:
    """Where a configuration's search starts after the sim's: its predicted capacity under the first criteria."""
    return {r.config: r.capacity for r in by_criteria(predicted, settings.criteria[0]) if r.capacity}


def measure_picks(real: Backend, predicted: list[ConfigResult], settings: TuneSettings, top_k: int,
                  on_probe: ProbeCallback | None = None, on_config: ConfigCallback | None = None,
                  deadline: float | None = None, on_picked: Callable[[list[Config]], None] | None = None,
                  price: Pricer | None = None, slower: list[ConfigResult] | None = None) -> GridResult:
    """The sim-first stage's second half: the sim's top K (and the baseline) under each criteria, measured on the
    real backend, each search starting at the sim's prediction for the first criteria; `price`: the sim's
    price of each measured step, kept beside its time (ConfigResult.step_speed); `slower`: the slowed sim's
    results, by which the picks are ranked (picks)."""
    chosen = picks(predicted, settings, top_k, slower)
    if on_picked is not None:
        on_picked(chosen)
    hints = _predicted_starts(predicted, settings)
    return run_grid(real, chosen, settings, on_probe, on_config, hints, deadline, "measured", price=price)


#: How much slower `slowed` makes every step: about the calibration's error on a step shape in serving, and this
#: kind of machine's drift over minutes (docs/history/2026-12-01e-decode-runs.md).
EDGE_SLOWDOWN = 1.10
#: A capacity that falls by more than this when steps run EDGE_SLOWDOWN times as long sits at the edge of its SLO.
EDGE_DROP = 0.25


def slowed(sim_at: Callable[[float], Backend], predicted: list[ConfigResult], configs: list[Config],
           settings: TuneSettings, slowdown: float = EDGE_SLOWDOWN, on_probe: ProbeCallback | None = None,
           jobs: int = 1) -> GridResult:
    """`configs` searched again on the sim with every step `slowdown` times as long, each from its prediction: how
    far a capacity moves when the calibration is that far off, or the machine that much slower. Most move by about
    the slowdown; one whose step with its decodes takes nearly the TBT SLO at any load falls off a cliff."""
    return run_grid(sim_at(slowdown), configs, settings, on_probe, hints=_predicted_starts(predicted, settings),
                    stage=f"sim {slowdown - 1:.0%} slower", jobs=jobs)


def capacity_change(predicted: ConfigResult, slower: ConfigResult) -> float:
    """The slowed sim's capacity over the prediction, minus 1 (NaN without a predicted capacity)."""
    return slower.capacity / predicted.capacity - 1 if predicted.capacity else math.nan


def at_the_edge(predicted: list[ConfigResult], slower: list[ConfigResult]) -> list[tuple[ConfigResult, ConfigResult]]:
    """(prediction, slowed) of each configuration whose capacity falls by more than EDGE_DROP on the slowed sim."""
    pred = {(r.config, r.criteria): r for r in predicted}
    pairs = [(pred[(r.config, r.criteria)], r) for r in slower if (r.config, r.criteria) in pred]
    return [(p, r) for p, r in pairs if capacity_change(p, r) < -EDGE_DROP]


def margin_picks(predicted: list[ConfigResult], slower: list[ConfigResult]) -> list[tuple[ConfigResult, ConfigResult]]:
    """Per criteria whose best predicted configuration is not the first by margin_ranked: (its slowed result, the
    slowed result of the margin's first). A capacity that a slower minute halves is poor advice however high it is."""
    out = []
    for k in dict.fromkeys(r.criteria for r in slower):
        mine, theirs = by_criteria(predicted, k), by_criteria(slower, k)
        slow = {r.config: r for r in theirs}
        best, pick = ranked(mine)[:1], margin_ranked(mine, theirs)[:1]
        # A pick ahead of the best was searched slowed (margin_ranked puts the unslowed last); the best may not be.
        if best and best[0].config != pick[0].config and best[0].config in slow:
            out.append((slow[best[0].config], slow[pick[0].config]))
    return out


def repredict(sim_at: Callable[[float], Backend], predicted: list[ConfigResult], measured: list[ConfigResult],
              settings: TuneSettings) -> list[ConfigResult]:
    """Each measured configuration searched again on the sim slowed to the speed its measured steps ran
    (`sim_at(step_speed)`), from the hint its measurement started at: the prediction with the machine's drift
    since the calibration taken out. Where the sim's scheduling is right, this finds the measured capacity."""
    hints = _predicted_starts(predicted, settings)
    out: list[ConfigResult] = []
    for m in by_criteria(measured, settings.criteria[0]):
        if not math.isnan(m.step_speed):
            out += run_grid(sim_at(m.step_speed), [m.config], settings, hints=hints, stage="sim at measured speed").results
    return out


@dataclass
class Comparison:
    """A configuration measured on the real backend beside the sim's prediction of the same probes."""

    predicted: ConfigResult
    measured: ConfigResult

    @property
    def error(self) -> float:
        """predicted / measured - 1 (NaN when the measurement found no capacity)."""
        return self.predicted.capacity / self.measured.capacity - 1 if self.measured.capacity else math.nan

    @property
    def error_range(self) -> tuple[float, float]:
        """The error against the measured interval's top and its bottom: the measured capacity is known only to lie
        in [low, high), so at a coarse precision the error is a range, not a number (-1 when high is unbounded)."""
        m = self.measured
        if not m.low:
            return math.nan, math.nan
        return self.predicted.capacity / m.high - 1, self.predicted.capacity / m.low - 1

    @property
    def error_text(self) -> str:
        """'+8..+17%', or '+17%' when the interval is one point at this precision; '-' without a measurement."""
        lo, hi = self.error_range
        if math.isnan(hi):
            return "-"
        if math.isinf(self.measured.high):  # every rate tried passed: the capacity, and so the error's bottom, is open
            return f"<={hi:+.0%}"
        return f"{hi:+.0%}" if f"{lo:+.0%}" == f"{hi:+.0%}" else f"{lo:+.0%}..{hi:+.0%}"


def compare_stages(predicted: list[ConfigResult], measured: list[ConfigResult]) -> list[Comparison]:
    """Pairs (prediction, measurement), best measured first."""
    pred = {(r.config, r.criteria): r for r in predicted}
    return [Comparison(pred[(m.config, m.criteria)], m) for m in ranked(measured) if (m.config, m.criteria) in pred]


def probe_speeds(results: list[ConfigResult]) -> list[float]:
    """Each priced probe's step time over the calibrated sim's price for the same steps, once per probe: how the
    machine's speed moved from probe to probe while it was measured."""
    speeds = {id(p): p.busy_s / p.priced_s for r in results for p in r.probes if p.priced_s > 0}
    return list(speeds.values())


def order_differs(comparisons: list[Comparison]) -> bool:
    """Whether the measured order of the measured configurations differs from the predicted one, past ties."""
    by_pred = sorted(comparisons, key=lambda c: -c.predicted.capacity)
    for i, a in enumerate(by_pred):
        for b in by_pred[i + 1:]:
            # a was predicted above b: a measured clearly below b is a reversal; a tie is not.
            if a.measured.capacity < b.measured.capacity and not a.measured.ties(b.measured):
                return True
    return False

"""What a strategy that prices its steps (Strategy.needs_price: slo-budget) is given: the run's price of a step, and
the step time to keep within.

Both belong to the run, not to the strategy, so they are made here and handed over by `Strategy.price_with`:

- the price: the cost model the run is calibrated with. On the sim, the sim's own (what it will charge for the step,
  as a busy engine pays it: CostModel.fast_seconds); on a real backend (gguf, torch), the cost model of its
  calibration (`--calibration FILE`, or tune's own sweep), priced as the calibrated sim prices it (its spec fit).
- the target: the run's TBT SLO (or its TPOT SLO, the mean of a request's TBTs, where no TBT is given; the lower of
  the two where both are), divided by 1 + margin, where the margin covers the model's error at the SLO's percentile:

      1 + margin = (1 + fit error) * exp(z * jitter)

  fit error: the calibration's p90 |error| over the steps it was fitted to (`p90_abs_error` of the form that prices
  the run: a step the model prices at P may take up to P * (1 + fit error) on nine shapes in ten); jitter: the spread
  of one shape's time from step to step (the calibration's `step_jitter`, a log standard deviation); z: the standard
  normal quantile at the SLO's percentile (2.33 at P99, at most 3.09, P99.9's), since the SLO is met or missed in the
  tail of that spread. The sim's uncalibrated prices have neither error: it charges exactly the price (margin 0).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from strategies import Strategy, make_strategy

from prefillbench.backends.sim.calibration import calibration_specs, load_calibration
from prefillbench.backends.sim.cost import Batch, CostModel
from prefillbench.backends.sim.fit_errors import error_stats
from prefillbench.backends.sim.specs import SimConfigError

#: The margin's tail stops at P99.9: a percentile of 100 (the worst TBT) would ask for an unbounded margin.
MOST_PERCENTILE = 99.9
#: A margin past this is said to be wide (the target under two-thirds of the SLO): a calibration that noisy (a busy
#: machine's, 2026-12-06: p90 |error| 214%, jitter 0.57, a margin of 1089%) spends the SLO on its own error. It only
#: words the line a run prints; the margin itself is applied whatever it is.
WIDE_MARGIN = 0.5


class SimPrice:
    """A step's price on a cost model, for a strategy to call with candidate steps: fast_seconds's sum where the model
    has one stage (what SimBackend.execute charges, not after an idle wait), step_cost's over the stages where it has
    more. A strategy prices many candidates beside the same decodes: their totals are worked out once per tuple."""

    __slots__ = ("cost", "_decodes", "_totals")

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self._decodes: Sequence[int] | None = None
        self._totals: tuple[int, int, dict[int, int] | None] = (0, 0, None)

    def __call__(self, chunks: Sequence[tuple[int, int, bool]], contexts: Sequence[int]) -> float:
        cost = self.cost
        if cost.pp != 1:
            return cost.seconds(Batch(tuple(chunks), tuple(contexts)))
        if contexts is not self._decodes:  # kept by reference, so that its id is not reused while compared
            windows = cost.windows
            self._decodes = contexts
            self._totals = (len(contexts), sum(contexts),
                            {w: sum(min(c, w) for c in contexts) for w in windows} if windows else None)
        n, total, window_ctx = self._totals
        emits = n
        shapes = []
        for start, tokens, last in chunks:
            shapes.append((start, tokens))
            emits += last
        return cost.fast_seconds(shapes, n, total, emits, window_ctx, False)


def prices_steps(strategy: str) -> bool:
    """Whether the strategy (as -s names it) chooses each step by its price against the SLO (slo-budget)."""
    return make_strategy(strategy).needs_price  # its rules' own (slo-budget) or its budget part's (· budget slo)


def step_limit_ms(tbt_ms: float | None, tpot_ms: float | None) -> float | None:
    """The SLO a step must keep within: the TBT limit, the TPOT limit where no TBT is given, the lower where both."""
    given = [v for v in (tbt_ms, tpot_ms) if v is not None]
    return min(given) if given else None


@dataclass(frozen=True)
class StepPricing:
    """The run's price of a step and how far it may be off: a cost model, where it comes from, and its errors."""

    cost: CostModel
    source: str  # where the prices come from, in words
    fit_error: float = 0.0  # the calibration's p90 |error| over its fitted steps; 0: the sim's own prices
    jitter: float = 0.0  # std of log(step time / price)

    def step_price(self) -> SimPrice:
        return SimPrice(self.cost)

    def margin(self, percentile: float) -> float:
        """The share the target stays under the SLO by (module docstring)."""
        z = NormalDist().inv_cdf(min(percentile, MOST_PERCENTILE) / 100) if percentile > 50 else 0.0
        return (1 + self.fit_error) * math.exp(z * self.jitter) - 1

    def target_s(self, limit_ms: float, percentile: float) -> float:
        return limit_ms / 1e3 / (1 + self.margin(percentile))

    def describe(self, tbt_ms: float | None, tpot_ms: float | None, percentile: float) -> str:
        """The line a run prints: the target, from which SLO and margin, priced by what."""
        limit = step_limit_ms(tbt_ms, tpot_ms)
        if limit is None:
            return ""
        which = "TBT" if limit == tbt_ms else "TPOT"
        m = self.margin(percentile)
        why = ("the sim's own prices, exact" if not (self.fit_error or self.jitter) else
               f"the calibration's p90 |error| {self.fit_error:.1%} and step jitter {self.jitter:.3f} at "
               f"p{min(percentile, MOST_PERCENTILE):g}")
        wide = (f"; a margin this wide leaves most of the SLO unused: calibrate on a quiet machine"
                if m > WIDE_MARGIN else "")
        return (f"slo-budget: each step's prompt tokens priced by {self.source} within {self.target_s(limit, percentile) * 1e3:.1f} "
                f"ms: the {which} SLO {limit:g} ms less a margin of {m:.1%} ({why}){wide}")


def priced(strategy: Strategy, pricing: StepPricing | None, tbt_ms: float | None, tpot_ms: float | None,
           percentile: float = 99.0) -> Strategy:
    """The strategy, handed its price and target where it chooses its steps by them (Strategy.needs_price); any other
    as it is. ValueError where it needs them and the run has no pricing or no TBT or TPOT SLO (the commands refuse
    that before a run; this keeps a library caller from running it unpriced)."""
    if not strategy.needs_price:
        return strategy
    limit = step_limit_ms(tbt_ms, tpot_ms)
    if limit is None:
        raise ValueError(f"{strategy.name} needs a TBT or TPOT SLO to price its steps against: give --slo tbt=MS")
    if pricing is None:
        raise ValueError(f"{strategy.name} prices its steps by the run's cost model, and this run has none: on a real "
                         "backend give --calibration FILE (prefillbench calibrate writes one)")
    strategy.price_with(pricing.step_price(), pricing.target_s(limit, percentile))
    return strategy


# ---- where the prices come from -------------------------------------------------------------------------------
def fit_error(cal: dict[str, Any], measured: bool) -> float:
    """A calibration's p90 |error| over its fitted steps, of the form that prices the run (`measured`: the measured
    curves' fit, else the spec fit); from its steps where the file predates the figure."""
    part = cal.get("measured") if measured else cal
    if not isinstance(part, dict):
        raise SimConfigError("the calibration holds no fit of the form that prices this run")
    if isinstance(part.get("p90_abs_error"), (int, float)):
        return float(part["p90_abs_error"])
    errors = [s["error"] for s in part.get("steps", []) if isinstance(s, dict) and isinstance(s.get("error"), (int, float))]
    if not errors:
        raise SimConfigError("the calibration holds no errors of its fit (p90_abs_error, or its steps'): run calibrate again")
    return error_stats(errors)["p90_abs_error"]


def of_sim(sim, cal: dict[str, Any] | None, source: str) -> StepPricing:
    """A sim backend's own prices (SimBackend: its cost model and GPU), with `cal` the calibration it was built with
    (None: presets or spec files, exact)."""
    if cal is None:
        return StepPricing(sim.cost, source)
    return StepPricing(sim.cost, source, fit_error(cal, sim.pricing is not None), float(sim.gpu.step_jitter))


def of_calibration(path: str) -> StepPricing:
    """A real backend's prices: its calibration file as the calibrated sim prices it (spec fit, no engine overheads,
    one device: SimBackend's default for a calibration)."""
    cal = load_calibration(path)
    model, gpu = calibration_specs(cal)
    if model is None or gpu is None:
        raise SimConfigError(f"calibration {path} names no model or device to price with: run calibrate again")
    gpu = gpu.with_calibration(cal["fitted"])
    return StepPricing(CostModel(model, gpu), f"calibration {path}", fit_error(cal, False), float(gpu.step_jitter))


def run_pricing(backend, calibration: str | None) -> StepPricing | None:
    """The pricing of a run on `backend`: the sim's own (calibrated by `calibration` where given), a step backend's
    calibration file, or None (a real backend without one)."""
    if backend.name == "sim":
        cal = load_calibration(calibration) if calibration else None
        return of_sim(backend, cal, f"the sim's cost model ({backend.device})")
    return of_calibration(calibration) if calibration else None


__all__ = ["MOST_PERCENTILE", "SimPrice", "StepPricing", "WIDE_MARGIN", "fit_error", "of_calibration", "of_sim", "priced",
           "prices_steps", "run_pricing", "step_limit_ms"]

"""tune's word on a strategy that chooses each step's budget by its price (slo-budget) against the best fixed budget:
its capacity within the SLO, its interval, and whether it beats, ties or loses.

A fixed budget is any configuration run at one token budget (chunked, sarathi-serve, vllm-v1, llama-server at each
--chunk-size); the best of them is the one tune would deploy without the adaptive one. Two capacities tie where their
intervals overlap (ConfigResult.ties), as everywhere in tune.
"""
from __future__ import annotations

from prefillbench.bench.slo_pricing import prices_steps
from prefillbench.bench.tune import ConfigResult, ranked
from prefillbench.report.capacity import capacity_text


def best_fixed(results: list[ConfigResult]) -> ConfigResult | None:
    """The highest capacity among the configurations at a fixed budget (one criteria's results)."""
    fixed = [r for r in results if r.config.budget is not None and not prices_steps(r.config.strategy)]
    return ranked(fixed)[0] if fixed else None


def outcome(adaptive: ConfigResult, fixed: ConfigResult) -> str:
    """'beats', 'ties' or 'loses to': by the capacity intervals (overlapping: a tie)."""
    if adaptive.ties(fixed):
        return "ties"
    return "beats" if adaptive.capacity > fixed.capacity else "loses to"


def _interval(r: ConfigResult) -> str:
    high = "inf" if r.high == float("inf") else f"{r.high:.3g}"
    return f"[{r.low:.3g}, {high})"


def _gain(adaptive: ConfigResult, fixed: ConfigResult) -> str:
    return f" ({adaptive.capacity / fixed.capacity - 1:+.0%})" if fixed.capacity else ""


def against_fixed(results: list[ConfigResult]) -> list[str]:
    """A line per adaptive configuration among one criteria's results: its capacity and interval beside the best fixed
    budget's, and which wins; none where the grid has no adaptive one or no fixed budget."""
    fixed = best_fixed(results)
    if fixed is None:
        return []
    lines = []
    for r in ranked([r for r in results if prices_steps(r.config.strategy)]):
        lines.append(f"{r.config.label} within {r.criteria.describe()}: {capacity_text(r.capacity, r.hit_bound, 3)} req/s "
                     f"{_interval(r)}; it {outcome(r, fixed)} the best fixed budget, {fixed.config.label}: "
                     f"{capacity_text(fixed.capacity, fixed.hit_bound, 3)} req/s {_interval(fixed)}{_gain(r, fixed)}")
    return lines


def win_text(best: ConfigResult, results: list[ConfigResult]) -> str:
    """For the verdict, where the best configuration is an adaptive one clear of every fixed budget: by how much, and
    which fixed budget comes nearest ('' otherwise: a tie is the verdict's own ties)."""
    if not prices_steps(best.config.strategy):
        return ""
    fixed = best_fixed(results)
    if fixed is None or outcome(best, fixed) != "beats":
        return ""
    return (f", {best.capacity / fixed.capacity:.2f}x the nearest fixed budget, {fixed.config.label} "
            f"({fixed.capacity:.3g} req/s)")

"""tune's word on speculative decoding (--spec off,K1,K2,...): at each scheduler and budget, every draft length's
capacity within the SLO beside speculation off, and where speculation stops paying.

A decode with K drafts takes 1 + K tokens of the step's budget (vLLM charges them like prompt tokens) and 1 + K query
rows of the GPU's work, while it gives 1 + (accepted drafts) tokens: at a light load the steps are short and the
extra tokens a step are nearly free, so the TBT between tokens falls; at a heavy load the drafts' verification
takes the budget the prompts would have had and the GPU time they would have used, and capacity within a TBT SLO
falls below speculation off's. Capacities whose intervals overlap tie, as everywhere in tune.
"""
from __future__ import annotations

from prefillbench.bench.spec_columns import spec_of
from prefillbench.bench.tune import ConfigResult
from prefillbench.report.adaptive import outcome
from prefillbench.report.capacity import capacity_text


def rules_of(strategy: str) -> str:
    """The scheduler without its speculation part ('vllm-v1 · spec eagle:3:accept=0.7' -> 'vllm-v1')."""
    return " · ".join(p.strip() for p in strategy.split("·") if not p.strip().startswith("spec "))


def _gain(r: ConfigResult, off: ConfigResult) -> str:
    return f"{r.capacity / off.capacity - 1:+.0%}" if off.capacity else "n/a"


def spec_lines(results: list[ConfigResult]) -> list[str]:
    """One criteria's results: a line per scheduler and budget with speculation off and on, then where it stops
    paying. None where the grid has no speculation, or no 'off' beside it."""
    groups: dict[tuple[str, int | None], dict[str, ConfigResult]] = {}
    for r in results:
        groups.setdefault((rules_of(r.config.strategy), r.config.budget), {})[spec_of(r.config.strategy)] = r
    lines, pays, stops = [], [], []
    for (rules, budget), by_spec in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        off = by_spec.get("off")
        on = sorted(((label, r) for label, r in by_spec.items() if label != "off"), key=lambda lr: lr[0])
        if off is None or not on:
            continue
        where = rules + (f", budget {budget}" if budget else "")
        cells = ", ".join(f"{label} {capacity_text(r.capacity, r.hit_bound, 3)} ({_gain(r, off)}, {outcome(r, off)})"
                          for label, r in on)
        best_label, best = max(on, key=lambda lr: lr[1].capacity)
        beats = outcome(best, off) == "beats"
        (pays if beats else stops).append(where)
        word = (f"speculation pays, most with {best_label}" if beats else
                "speculation does not pay: no draft length beats it (the drafts' verification takes the budget and "
                "the step time the prompts and plain decodes had)")
        lines.append(f"{where}: spec off {capacity_text(off.capacity, off.hit_bound, 3)} req/s; {cells}: {word}")
    if lines and stops:
        lines.append("speculation stops paying at " + "; ".join(stops)
                     + (f" (it pays at {'; '.join(pays)})" if pays else ""))
    return lines

"""Colours for plots: one hue family per strategy, its chunk sizes (or token budgets) as shades of it.

A family is a matplotlib sequential colormap, fixed per strategy, so a strategy
has the same hue on every chart and every backend; the shades of a family run
from dark (the smallest chunk size) to light. Strategies outside the table get
the remaining families in turn.
"""
from __future__ import annotations

from strategies import STRATEGIES

FAMILIES = ("Blues", "Oranges", "Greens", "Reds", "Purples", "YlOrBr", "Greys", "BuGn", "RdPu")
STRATEGY_FAMILY = {name: FAMILIES[i % len(FAMILIES)] for i, name in enumerate(STRATEGIES)}
# Where on the colormap the shades lie: not the near-white end, not the near-black one.
DARKEST, LIGHTEST = 0.9, 0.45

Hue = tuple[str, "int | None"]  # (strategy, chunk size)


def family(strategy: str, others: list[str]) -> str:
    if strategy in STRATEGY_FAMILY:
        return STRATEGY_FAMILY[strategy]
    free = [f for f in FAMILIES if f not in STRATEGY_FAMILY.values()] or list(FAMILIES)
    return free[others.index(strategy) % len(free)] if strategy in others else free[0]


def palette(hues: list[Hue]) -> dict[Hue, tuple[float, float, float, float]]:
    """An RGBA colour for each (strategy, chunk size): a family per strategy, a shade per chunk size."""
    from matplotlib import colormaps

    unknown = sorted({s for s, _ in hues if s not in STRATEGY_FAMILY})
    colours = {}
    for strategy in dict.fromkeys(s for s, _ in hues):
        sizes = sorted({c for s, c in hues if s == strategy}, key=lambda c: (c is not None, c or 0))
        cmap = colormaps[family(strategy, unknown)]
        for i, size in enumerate(sizes):
            where = DARKEST - (DARKEST - LIGHTEST) * i / (len(sizes) - 1) if len(sizes) > 1 else (DARKEST + LIGHTEST) / 2 + 0.1
            colours[(strategy, size)] = cmap(where)
    return colours

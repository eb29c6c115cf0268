"""Successive halving for tune's grids on the sim (rules x budget x cadence): a short round first, every configuration
searched once on fewer requests at a coarser precision; the configurations it shows dominated are dropped, and the
rest are searched in full, each starting at its short-round capacity.

A product grid multiplies (two rules, four budgets and three cadences are 24 searches), and most of its points lose
to a neighbour by far more than a short probe's error: a quarter of the requests at twice the precision bracket a
capacity within about 10% (issue 68's Mistral-7B grid: the dropped configurations' short capacities were 3-10% under
their full ones), so a configuration under KEEP_WITHIN of the best is dominated with twice that margin. Everything
within it is kept, and so are the baseline and any configuration the short round could not measure; no quota of
the grid is (a rule keeping the better half kept 28 of that grid's 54 where 16 were within 80%). Only the sim's stage halves (its probes are cheap and exact); the
measured stage takes the sim's picks as before.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from prefillbench.bench.tune import Config, GridResult, TuneSettings, run_grid

#: A configuration whose short-round capacity is below this share of the best one's (at every criteria) is dropped.
KEEP_WITHIN = 0.8
#: The short round's requests a probe: this share of the full round's, at least SHORT_MIN_REQUESTS (and at most the
#: full round's). Fewer let a probe over capacity end before its queue shows: at 75 requests (--requests 300) the
#: short round dropped the full grid's second configuration, tied with the best; at 250 the dropped were all under
#: 80% of the best in the full grid too (docs/history/2026-12-07-sim-speed.md).
SHORT_SHARE = 0.25
SHORT_MIN_REQUESTS = 250
#: Grids smaller than this are searched in full at once (a halving would save less than its short round costs).
HALVING_FROM = 8


@dataclass
class Halving:
    """What the short round kept and dropped, and the capacities it found (the full round's starting points)."""

    kept: list[Config]
    dropped: list[Config] = field(default_factory=list)
    hints: dict[Config, float] = field(default_factory=dict)
    short: GridResult | None = None

    def describe(self, requests: int) -> str:
        """One line: what was dropped, each with its short-round capacity (the best criteria's), and how to keep it."""
        if not self.dropped:
            return ""
        found: dict[Config, float] = {}
        for r in self.short.results if self.short is not None else []:
            found[r.config] = max(found.get(r.config, 0.0), r.capacity)
        return (f"successive halving: {len(self.dropped)} of {len(self.kept) + len(self.dropped)} configurations "
                f"dropped on short probes ({requests} requests each; below {KEEP_WITHIN:.0%} of the best; "
                f"--full-grid searches them all): "
                + ", ".join(f"{c.label} {found[c]:.3g} req/s" if c in found else c.label for c in self.dropped))


def short_settings(settings: TuneSettings) -> TuneSettings:
    """The short round's probes: fewer requests (a trace replays all of its rows: its arrivals and lengths are the
    workload, and a first part of it is another one), one seed, twice the precision."""
    trace = settings.test.workload is not None
    requests = settings.requests if trace else min(settings.requests, max(SHORT_MIN_REQUESTS,
                                                                            math.ceil(settings.requests * SHORT_SHARE)))
    return replace(settings, requests=requests, repeats=1, precision=min(2 * settings.precision, 0.25))


def keep(configs: list[Config], short: GridResult, baseline: Config | None) -> Halving:
    """The configurations to search in full, given the short round's results: those within KEEP_WITHIN of the best
    at any criteria, the baseline, and any the short round did not measure."""
    best: dict = {}
    for r in short.results:
        best[r.criteria] = max(best.get(r.criteria, 0.0), r.capacity)
    score: dict[Config, float] = {}
    for r in short.results:
        if best[r.criteria] > 0 and not r.interrupted:
            score[r.config] = max(score.get(r.config, 0.0), r.capacity / best[r.criteria])
    kept = [c for c in configs if c not in score or score[c] >= KEEP_WITHIN or c == baseline]
    hints = {r.config: r.searches[0].capacity for r in short.results if r.searches and r.searches[0].capacity > 0}
    return Halving(kept, [c for c in configs if c not in kept], hints, short)


def halve(backend, configs: list[Config], settings: TuneSettings, jobs: int = 1) -> Halving:
    """The short round on the sim and what it keeps; the whole grid where it is small or not the sim's."""
    if backend.name != "sim" or len(configs) < HALVING_FROM:
        return Halving(list(configs))
    short = run_grid(backend, configs, short_settings(settings), stage="sim", jobs=jobs)
    if short.stopped:
        return Halving(list(configs), short=short)
    return keep(configs, short, settings.baseline)


__all__ = ["HALVING_FROM", "KEEP_WITHIN", "Halving", "halve", "keep", "short_settings"]

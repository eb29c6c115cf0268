"""`compare`'s words: what each metric did, in words that match its numbers; the setups that differ
between the two runs; and whether the two ran on different backends.

A speedup above 1 is better (compare.speedup). A change beyond the threshold
is an improvement or a regression; inside it, no change worth the name.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from prefillbench.report.compare import METRIC_SHORT, Comparison, Entry, key_label

# Settings in a run's metadata that change what its numbers mean, by the name a reader knows them by.
SETUP_FIELDS = {"dtype": "dtype", "weights": "weights", "threads": "threads", "device": "device"}
# Metrics that are rates or shares: "higher"/"lower"; the rest (throughputs and times): "faster"/"slower".
_AMOUNTS = {"goodput_rps", "slo_met", "capacity_rps"}


@dataclass(frozen=True)
class Change:
    """One metric of one row: how many times better or worse, and where that falls against the threshold."""

    metric: str
    speedup: float  # above 1: better
    threshold: float  # percent

    @property
    def kind(self) -> str:
        """improvement, regression, within, or unknown (the figure does not apply)."""
        if self.speedup is None or math.isnan(self.speedup):
            return "unknown"
        limit = self.threshold / 100.0
        # compare.worse_by's rule in speedup terms: worse by more than the threshold is a regression.
        if 1.0 / self.speedup - 1.0 > limit:
            return "regression"
        if 1.0 - 1.0 / self.speedup > limit:
            return "improvement"
        return "within"

    def words(self) -> str:
        """'1.68x faster', '1.25x slower', '1.02x higher'."""
        good, bad = ("higher", "lower") if self.metric in _AMOUNTS else ("faster", "slower")
        if self.speedup >= 1.0:
            return f"{self.speedup:.2f}x {good}"
        return f"{1.0 / self.speedup:.2f}x {bad}"


def _changes(cmp: Comparison, metric: str) -> list[tuple[Entry, Change]]:
    return [(e, Change(metric, e.speedup[metric], cmp.threshold)) for e in cmp.entries]


def metric_sentence(cmp: Comparison, metric: str) -> str:
    """One metric across the compared rows, e.g. 'throughput 1.68x faster: improvement beyond the 10% threshold'."""
    name = METRIC_SHORT[metric] + (f"/{cmp.relative_to}" if cmp.relative_to else "")
    changes = [(e, c) for e, c in _changes(cmp, metric) if c.kind != "unknown"]
    t = f"{cmp.threshold:g}%"
    if not changes:
        return f"{name}: does not apply to these rows"
    if len(changes) == 1:
        (e, c), = changes
        what = {"improvement": f"improvement beyond the {t} threshold", "regression": f"regression beyond the {t} threshold",
                "within": f"within the {t} threshold"}[c.kind]
        return f"{name} {c.words()}: {what} ({key_label(e.key)})"
    parts = []
    for kind, verb in (("improvement", "improved"), ("regression", "regressed")):
        group = [(e, c) for e, c in changes if c.kind == kind]
        if group:
            e, c = max(group, key=lambda ec: abs(math.log(ec[1].speedup)))
            parts.append(f"{len(group)} {verb} beyond {t} (most: {c.words()}, {key_label(e.key)})")
    within = [c for _, c in changes if c.kind == "within"]
    if within:
        lo, hi = min(c.speedup for c in within), max(c.speedup for c in within)
        parts.append(f"{len(within)} within {t} ({lo:.2f}-{hi:.2f}x)")
    return f"{name} over {len(changes)} rows: " + ", ".join(parts)


def comparison_lines(cmp: Comparison) -> list[str]:
    return [metric_sentence(cmp, m) for m in cmp.metrics]


def setup_differences(base_meta: dict[str, Any], current_meta: dict[str, Any]) -> list[str]:
    """'dtype float32 vs bfloat16' for each setting the two runs' metadata give differently."""
    out = []
    for key, name in SETUP_FIELDS.items():
        a, b = base_meta.get(key), current_meta.get(key)
        if a is None or b is None or str(a) == str(b) or str(a) in ("", "nan") or str(b) in ("", "nan"):
            continue
        out.append(f"{name} {a} vs {b}")
    return out

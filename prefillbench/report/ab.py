"""The A/B job's statistics and its tables: per row and metric, the change's ratio to the base over paired rounds.

Per row and metric, each round gives log(change / base); whatever slowed the machine during a
round slowed both of its runs and cancels. The ratio is the mean of those logs turned back into
a ratio (a geometric mean), with a Student-t interval over the rounds. A row regressed on a
metric when its ratio is worse than the threshold AND the interval excludes 1: a big change
that noise could explain is not a regression, and neither is a real but small one.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from prefillbench.bench import stats
from prefillbench.bench.metrics import ResultRow
from prefillbench.report.compare import HIGHER, METRIC_LABELS, METRIC_SHORT, METRICS, key_label, worse_by
from prefillbench.report.exports import InputError
from prefillbench.report.tables import fmt_number, md_table, row_strategy_label

AB_METRICS = ["throughput", "ttft_p50_ms", "ttft_p99_ms", "tbt_p50_ms", "tbt_p99_ms"]
DEFAULT_GATED = ["throughput", "ttft_p50_ms", "tbt_p50_ms"]
DEFAULT_THRESHOLD = 10.0  # percent
BASE, CHANGE = "base", "change"
ALL_ROWS = ("all rows",)  # the key of the rows' geometric mean



@dataclass
class Delta:
    """One metric of one row: change / base over the paired rounds."""

    metric: str
    base: list[float]
    change: list[float]
    gated: bool
    threshold: float  # percent
    confidence: float = stats.DEFAULT_CONFIDENCE
    ratio: float = field(init=False)  # geometric mean of change/base
    low: float = field(init=False)  # interval of the ratio
    high: float = field(init=False)

    def __post_init__(self) -> None:
        logs = [math.log(c / b) for b, c in zip(self.base, self.change)]
        mean, _ = stats.mean_std(logs)
        half = stats.ci_half_width(logs, self.confidence)
        self.ratio, self.low, self.high = math.exp(mean), math.exp(mean - half), math.exp(mean + half)

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.metric] == HIGHER

    @property
    def worse(self) -> float:
        """How much worse the change is, as a fraction (negative: better)."""
        return worse_by(self.metric, 1.0, self.ratio)

    def _bounds(self) -> tuple[float, float]:
        """(the interval's end on the bad side, its end on the good side)."""
        return (self.low, self.high) if self.higher_is_better else (self.high, self.low)

    @property
    def excludes_one(self) -> bool:
        """The interval lies wholly on the bad side of 1 (NaN with one round: it cannot)."""
        _, good = self._bounds()
        return good < 1.0 if self.higher_is_better else good > 1.0

    @property
    def regressed(self) -> bool:
        return self.gated and self.worse > self.threshold / 100.0 and self.excludes_one

    @property
    def decided(self) -> bool:
        """More rounds would hardly change the verdict: the interval is wholly inside or beyond the threshold."""
        bad, good = self._bounds()
        limit = self.threshold / 100.0
        return worse_by(self.metric, 1.0, bad) <= limit or worse_by(self.metric, 1.0, good) > limit

    def cell(self) -> str:
        if math.isnan(self.low):
            return f"{100 * (self.ratio - 1):+.1f}%"
        return f"{100 * (self.ratio - 1):+.1f}% [{100 * (self.low - 1):+.1f}, {100 * (self.high - 1):+.1f}]"


@dataclass
class RowDelta:
    key: tuple
    base_row: ResultRow | None  # of the first round, for its labels; None for ALL_ROWS
    deltas: dict[str, Delta]  # metrics that apply to the row

    def label(self, field_name: str) -> str:
        if self.base_row is None:
            return "all rows (geometric mean)" if field_name == "strategy" else ""
        if field_name == "strategy":
            return row_strategy_label(self.base_row)
        return str(getattr(self.base_row, field_name))

    @property
    def regressed(self) -> list[Delta]:
        return [d for d in self.deltas.values() if d.regressed]

    @property
    def decided(self) -> bool:
        return all(d.decided for d in self.deltas.values() if d.gated)


@dataclass
class ABResult:
    rows: list[RowDelta]
    rounds: int
    metrics: list[str]
    gated: list[str]
    threshold: float
    confidence: float
    only_base: list[tuple]
    only_change: list[tuple]

    @property
    def regressions(self) -> list[RowDelta]:
        return [r for r in self.rows if r.regressed]

    @property
    def decided(self) -> bool:
        return all(r.decided for r in self.rows)


Round = tuple[dict[tuple, ResultRow], dict[tuple, ResultRow]]  # (base rows, change rows) by row key


def _applies(value: float) -> bool:
    return value is not None and not math.isnan(value) and value > 0


def _geomean(values: list[float]) -> float:
    return math.exp(math.fsum(map(math.log, values)) / len(values))


def analyse(
    rounds: list[Round],
    metrics: list[str] = AB_METRICS,
    gated: list[str] = DEFAULT_GATED,
    threshold: float = DEFAULT_THRESHOLD,
    confidence: float = stats.DEFAULT_CONFIDENCE,
) -> ABResult:
    """Per row present on both sides in every round, each metric's ratio and interval;
    with several rows, also their geometric mean ("all rows")."""
    if not rounds:
        raise InputError("no rounds to compare")
    first_base, first_change = rounds[0]
    common = [k for k in first_base if all(k in b and k in c for b, c in rounds)]
    if not common:
        raise InputError("the base and the working tree have no rows in common: did the preset's cases change?")
    # metric -> (row key -> (base values, change values) over the rounds), where the metric applies
    series: dict[str, dict[tuple, tuple[list[float], list[float]]]] = {m: {} for m in metrics}
    for key in common:
        for m in metrics:
            base = [getattr(b[key], m) for b, _ in rounds]
            change = [getattr(c[key], m) for _, c in rounds]
            if all(map(_applies, base + change)):
                series[m][key] = (base, change)
    if len(common) > 1:
        # A change that slows every case a little shows most clearly across all of them:
        # the rows' noise is independent, so their geometric mean is steadier than any one row.
        for m in metrics:
            if len(series[m]) == len(common):
                base = [_geomean([series[m][k][0][i] for k in common]) for i in range(len(rounds))]
                change = [_geomean([series[m][k][1][i] for k in common]) for i in range(len(rounds))]
                series[m][ALL_ROWS] = (base, change)
    keys = common + ([ALL_ROWS] if any(ALL_ROWS in by_key for by_key in series.values()) else [])
    # Bonferroni: the chance that noise alone fails the job stays below 1 - confidence however
    # many rows the preset has. The rows' mean, the figure a change that slows everything moves
    # most clearly, gets half of that chance; the rows share the other half. A row's metrics
    # come from the same runs and move together, so they share their row's level.
    alpha = 1.0 - confidence
    has_mean = any(ALL_ROWS in by_key for by_key in series.values())
    level = {key: 1.0 - (alpha / 2 / len(common) if has_mean else alpha / len(common)) for key in common}
    if has_mean:
        level[ALL_ROWS] = 1.0 - alpha / 2
    rows = []
    for key in common + ([ALL_ROWS] if has_mean else []):
        deltas = {m: Delta(m, *series[m][key], m in gated, threshold, level[key]) for m in metrics if key in series[m]}
        rows.append(RowDelta(key, first_base.get(key), deltas))
    return ABResult(
        rows,
        len(rounds),
        list(metrics),
        list(gated),
        threshold,
        confidence,
        [k for k in first_base if k not in first_change],
        [k for k in first_change if k not in first_base],
    )


# ---------------------------------------------------------------- printing


def _status(row: RowDelta) -> str:
    bad = row.regressed
    if not bad:
        return "ok"
    return "REGRESSION " + ", ".join(f"{METRIC_SHORT[d.metric]} {100 * (d.ratio - 1):+.1f}%" for d in bad)


def render_table(result: ABResult) -> str:
    """A markdown table: a row per case, the change in each metric with its interval."""
    varying = [f for i, f in enumerate(("model", "backend")) if len({r.key[i] for r in result.rows if r.base_row}) > 1]
    columns: list[tuple[str, Callable[[RowDelta], str], bool]] = [
        (f, lambda r, f=f: r.label(f), False) for f in varying + ["strategy", "test"]
    ]
    columns.append(("concurrency", lambda r: r.label("concurrency"), True))
    if "throughput" in result.metrics:
        for side, i in ((BASE, 0), (CHANGE, 1)):
            columns.append((f"throughput/s {side}", lambda r, i=i: _mean_cell(r, "throughput", i), True))
    for m in result.metrics:
        label = METRIC_LABELS[m].removesuffix("/s").removesuffix(" ms") + ("" if m in result.gated else " (not gated)")
        columns.append((label, lambda r, m=m: r.deltas[m].cell() if m in r.deltas else "-", True))
    columns.append(("status", _status, False))
    return md_table(columns, result.rows)


def _mean_cell(row: RowDelta, metric: str, side: int) -> str:
    d = row.deltas.get(metric)
    if d is None:
        return "-"
    return fmt_number(stats.mean_std(d.change if side else d.base)[0], 2)


def verdict(result: ABResult) -> str:
    what = f"{result.threshold:g}%"
    gated = ", ".join(METRIC_SHORT[m] for m in result.gated)
    n = len(result.regressions)
    rows = f"{len(result.rows)} row(s)" + (" with their mean" if any(r.key == ALL_ROWS for r in result.rows) else "")
    if n:
        return f"{n} of {rows} regressed beyond {what} ({gated}; {result.rounds} rounds)"
    return f"no regression beyond {what} in {rows} ({gated}; {result.rounds} rounds)"


def render_summary(result: ABResult, base_label: str, change_label: str, preset: list[str], seconds: float,
                   note: str = "") -> str:
    """Markdown for a CI job summary or a pull-request comment."""
    icon = ":x:" if result.regressions else ":white_check_mark:"
    conf = f"{100 * result.confidence:g}%"
    lines = [
        "## prefillbench: change vs base",
        "",
        f"{icon} **{verdict(result)}**",
        "",
        f"Change `{change_label}` against base `{base_label}`: the same preset run by each, "
        f"interleaved over {result.rounds} rounds on one machine ({seconds / 60:.1f} min in all). "
        f"A cell is the change's difference from the base (the geometric mean of the rounds' change/base ratios) "
        f"and its interval, {conf} for the table as a whole (Bonferroni: half of the {100 - 100 * result.confidence:g}% "
        f"to \"all rows\", the rows' geometric mean round by round, half shared by the rows). A row regressed where a gated metric "
        f"is more than {result.threshold:g}% worse and its interval excludes no change.",
        "",
        render_table(result).rstrip("\n"),
        "",
        f"Preset: `prefillbench run {' '.join(preset)}`",
    ]
    if note:
        lines += ["", note]
    for who, keys in (("base", result.only_base), ("change", result.only_change)):
        if keys:
            lines += ["", f"{len(keys)} row(s) only in the {who}, not compared: {', '.join(key_label(k) for k in keys)}"]
    return "\n".join(lines) + "\n"

"""`prefillbench ab BASE`: the working tree against a base commit, on the same machine, in one job.

A baseline file recorded on another machine can only gate ratios between
strategies; a change that slows every step alike keeps all its ratios. This
measures absolute numbers instead, the way llama.cpp's compare-llama-bench and
hyperfine do: the base and the change run the same preset on the same machine,
minutes apart, and only their ratio is judged.

* The base is checked out with `git worktree add --detach` into a temporary
  folder (removed afterwards). Each side runs `prefillbench run PRESET --export`
  in its own process with PYTHONPATH at its own tree: the installed
  dependencies are shared, only prefillbench's source differs.
* A round is one run of each side, back to back. Rounds alternate which side
  goes first (base change, change base, base change, ...), so drift that is
  linear in time cancels out of each pair, as `run --interleave` does for
  strategies.
* Per row and metric, each round gives log(change / base); whatever slowed the
  machine during a round slowed both of its runs and cancels. The ratio is the
  mean of those logs turned back into a ratio (a geometric mean), with a
  Student-t interval over the rounds.
* A row regressed on a metric when its ratio is worse than the threshold AND
  the interval excludes 1: a big change that noise could explain is not a
  regression, and neither is a real but small one.
* Rounds go on from --min-rounds to --max-rounds until every gated ratio's
  interval lies wholly on one side of the threshold, or the next round would
  overrun --max-seconds.

Exit 0: no regression; 1: a regression; 2: unusable input, or the base (or the
working tree) could not run; the reason is one line on stderr.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from prefillbench.bench import stats
from prefillbench.report.compare import HIGHER, METRIC_LABELS, METRIC_SHORT, METRICS, InputError, key_label, load_results, row_key, worse_by
from prefillbench.bench.metrics import ResultRow
from prefillbench.report.tables import fmt_number, md_table, row_strategy_label, write_atomic

# Small on purpose: each side runs it once per round, and short runs keep a round's two runs
# close in time. One thread: llama.cpp's threads spin-wait on each other, and with as many
# threads as cores any other process on the runner can slow a run several-fold (measured 7x
# on a shared 2-core machine), noise no pairing can cancel. About 15 s a run on a quiet 2-core CPU.
DEFAULT_PRESET = ["--backend", "auto", "-t", "1", "-p", "0", "-n", "0", "--pg", "64,16", "-c", "4",
                  "-s", "sequential,padded,chunked", "--chunk-size", "32", "-r", "1", "--interleave"]
AB_METRICS = ["throughput", "ttft_p50_ms", "ttft_p99_ms", "tbt_p50_ms", "tbt_p99_ms"]
DEFAULT_GATED = ["throughput", "ttft_p50_ms", "tbt_p50_ms"]
DEFAULT_THRESHOLD = 10.0  # percent
DEFAULT_MIN_ROUNDS = 5
DEFAULT_MAX_ROUNDS = 12
DEFAULT_MAX_SECONDS = 480.0
BASE, CHANGE = "base", "change"
ALL_ROWS = ("all rows",)  # the key of the rows' geometric mean

# `python -c` puts the current folder first on sys.path, ahead of PYTHONPATH: a run started
# from the change's checkout would import the change's prefillbench as the base. Drop it.
_LAUNCH = "import runpy, sys; sys.path[:] = [p for p in sys.path if p]; runpy.run_module('prefillbench', run_name='__main__', alter_sys=True)"


class SideFailed(RuntimeError):
    """One side's benchmark run failed: exit 2, naming the side."""


# ---------------------------------------------------------------- the two trees


@dataclass(frozen=True)
class Side:
    name: str  # BASE or CHANGE
    root: Path  # goes first on PYTHONPATH
    commit: str  # short SHA of the tree's HEAD
    dirty: bool = False  # uncommitted edits to tracked files

    @property
    def label(self) -> str:
        return f"{self.commit} + uncommitted edits" if self.dirty else self.commit

    @property
    def who(self) -> str:
        return "the base" if self.name == BASE else "the working tree"


def git(repo: Path, *args: str) -> str:
    """stdout of a git command in `repo`; InputError with git's own one-line reason."""
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise InputError("git is not installed") from None
    if out.returncode != 0:
        reason = (out.stderr.strip().splitlines() or [f"git {args[0]} failed"])[-1]
        raise InputError(f"git {args[0]}: {reason.removeprefix('fatal: ')}")
    return out.stdout.strip()


def change_side(repo: Path) -> Side:
    root = Path(git(repo, "rev-parse", "--show-toplevel"))
    if not (root / "prefillbench" / "__init__.py").is_file():
        raise InputError(f"{root}: not a prefillbench checkout (no prefillbench/ package)")
    dirty = bool(git(root, "status", "--porcelain", "--untracked-files=no"))
    head = git(root, "rev-parse", "--short", "HEAD")
    return Side(CHANGE, root, head, dirty)


@contextmanager
def base_checkout(repo: Path, ref: str) -> Iterator[Side]:
    """The base ref checked out in a temporary worktree, removed on the way out."""
    try:
        commit = git(repo, "rev-parse", "--verify", "--end-of-options", f"{ref}^{{commit}}") if ref.strip() else ""
    except InputError:
        commit = ""
    if not commit:
        raise InputError(f"base {ref!r} is not a commit of {repo}")
    folder = Path(tempfile.mkdtemp(prefix="prefillbench-base-"))
    tree = folder / "tree"
    git(repo, "worktree", "add", "--detach", "--quiet", str(tree), commit)
    try:
        if not (tree / "prefillbench" / "__init__.py").is_file():
            raise SideFailed(f"the base could not run: {ref} has no prefillbench/ package")
        yield Side(BASE, tree, git(repo, "rev-parse", "--short", commit))
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)


def run_side(side: Side, preset: list[str], export: Path, python: str = sys.executable) -> float:
    """One `prefillbench run` of the preset with `side`'s code; the seconds it took."""
    env = dict(os.environ)
    # Other prefillbench trees on an inherited PYTHONPATH (the caller's checkout) would fill in
    # for modules missing from this side's tree; keep the rest of the path as it is.
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not (Path(p) / "prefillbench" / "__init__.py").is_file()]
    env["PYTHONPATH"] = os.pathsep.join([str(side.root)] + inherited)
    cmd = [python, "-c", _LAUNCH, "run", *preset, "--no-progress", "--no-results-file", "--export", str(export)]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if out.returncode != 0 or not export.is_file():
        lines = [l for l in out.stderr.strip().splitlines() if l.strip()]
        reason = lines[-1].removeprefix("prefillbench: ").removeprefix("error: ") if lines else f"exit status {out.returncode}"
        raise SideFailed(f"{side.who} ({side.label}) could not run: {reason}")
    return seconds


def side_rows(side: Side, export: Path) -> dict[tuple, ResultRow]:
    """The rows of one side's export by key, after checking that the side's own code ran."""
    results = load_results(str(export))
    ran = str(results.meta.get("git_commit") or "")
    # Exports record the commit of the prefillbench they came from (older bases may not).
    if ran and not (ran.startswith(side.commit) or side.commit.startswith(ran)):
        raise SideFailed(f"{side.who} ran prefillbench from commit {ran}, not {side.commit}: check PYTHONPATH")
    return {row_key(r): r for r in results.rows}


def turn_order(round_index: int) -> tuple[str, str]:
    """Which side runs first in a round: base change, change base, base change, ..."""
    return (BASE, CHANGE) if round_index % 2 == 0 else (CHANGE, BASE)


# ---------------------------------------------------------------- statistics


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


def render_summary(result: ABResult, base: Side, change: Side, preset: list[str], seconds: float, note: str = "") -> str:
    """Markdown for a CI job summary or a pull-request comment."""
    icon = ":x:" if result.regressions else ":white_check_mark:"
    conf = f"{100 * result.confidence:g}%"
    lines = [
        "## prefillbench: change vs base",
        "",
        f"{icon} **{verdict(result)}**",
        "",
        f"Change `{change.label}` against base `{base.label}`: the same preset run by each, "
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


# ---------------------------------------------------------------- the job


@dataclass
class ABOptions:
    base_ref: str
    preset: list[str] = field(default_factory=lambda: list(DEFAULT_PRESET))
    repo: Path = Path(".")
    metrics: list[str] = field(default_factory=lambda: list(AB_METRICS))
    gated: list[str] = field(default_factory=lambda: list(DEFAULT_GATED))
    threshold: float = DEFAULT_THRESHOLD
    confidence: float = stats.DEFAULT_CONFIDENCE
    min_rounds: int = DEFAULT_MIN_ROUNDS
    max_rounds: int = DEFAULT_MAX_ROUNDS
    max_seconds: float = DEFAULT_MAX_SECONDS
    out: Path | None = None  # keep every round's exports here
    summary: Path | None = None

    def validate(self) -> None:
        if self.min_rounds < 2:
            raise InputError(f"--min-rounds must be at least 2 (an interval needs two rounds), got {self.min_rounds}")
        if self.max_rounds < self.min_rounds:
            raise InputError(f"--max-rounds ({self.max_rounds}) is below --min-rounds ({self.min_rounds})")
        if not 0 < self.confidence < 1:
            raise InputError(f"--confidence must lie between 0 and 100%, got {100 * self.confidence:g}%")
        unknown = [m for m in self.gated if m not in self.metrics]
        if unknown:
            raise InputError(f"--gate {unknown[0]} is not among the compared metrics ({', '.join(self.metrics)})")
        for flag in ("--export", "--export-requests", "-o", "--output", "--relative-to", "--verify"):
            if flag in self.preset:
                raise InputError(f"the preset may not set {flag}: the A/B job sets its own output")


def _log(text: str) -> None:
    print(f"prefillbench: {text}", file=sys.stderr, flush=True)


def run_rounds(options: ABOptions, base: Side, change: Side, folder: Path) -> tuple[ABResult, float, str]:
    """Interleaved rounds until the verdict is clear or the rounds or the time run out."""
    start = time.perf_counter()
    rounds: list[Round] = []
    sides = {BASE: base, CHANGE: change}
    note = ""
    for i in range(options.max_rounds):
        rows: dict[str, dict[tuple, ResultRow]] = {}
        took = {}
        for name in turn_order(i):
            export = folder / f"{name}-{i + 1}.csv"
            took[name] = run_side(sides[name], options.preset, export)
            rows[name] = side_rows(sides[name], export)
        rounds.append((rows[BASE], rows[CHANGE]))
        elapsed = time.perf_counter() - start
        _log(f"round {i + 1}: base {took[BASE]:.1f} s, change {took[CHANGE]:.1f} s ({elapsed:.0f} s in all)")
        if len(rounds) < options.min_rounds:
            continue
        result = analyse(rounds, options.metrics, options.gated, options.threshold, options.confidence)
        if result.decided:
            break
        if elapsed + elapsed / len(rounds) > options.max_seconds and len(rounds) < options.max_rounds:
            note = (f"Stopped after {len(rounds)} rounds: another would overrun the {options.max_seconds:g} s budget "
                    f"while some intervals still straddle the threshold.")
            break
    result = analyse(rounds, options.metrics, options.gated, options.threshold, options.confidence)
    return result, time.perf_counter() - start, note


def run_ab(options: ABOptions) -> int:
    options.validate()
    change = change_side(options.repo)
    keep = options.out
    folder = keep or Path(tempfile.mkdtemp(prefix="prefillbench-ab-"))
    folder.mkdir(parents=True, exist_ok=True)
    for stale in [*folder.glob(f"{BASE}-*.csv"), *folder.glob(f"{CHANGE}-*.csv")]:
        stale.unlink()  # an earlier job's rounds must not be read as this one's
    try:
        with base_checkout(change.root, options.base_ref) as base:
            _log(f"A/B: change {change.label} ({change.root}) against base {base.label}, "
                 f"{options.min_rounds}-{options.max_rounds} interleaved rounds")
            result, seconds, note = run_rounds(options, base, change, folder)
    finally:
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    sys.stdout.write(render_table(result))
    sys.stdout.flush()
    if note:
        _log(note)
    if options.summary is not None:
        write_atomic(options.summary, render_summary(result, base, change, options.preset, seconds, note))
    for who, keys in (("base", result.only_base), ("working tree", result.only_change)):
        if keys:
            _log(f"{len(keys)} row(s) only in the {who}, not compared: {key_label(keys[0])}{' ...' if len(keys) > 1 else ''}")
    _log(f"{verdict(result)}, {seconds:.0f} s")
    return 1 if result.regressions else 0

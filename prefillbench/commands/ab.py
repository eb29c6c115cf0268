"""`prefillbench ab BASE`: the working tree against a base commit, on the same machine, in one job.

A baseline file recorded on another machine can only gate ratios between
strategies; a change that slows every step alike keeps all its ratios. This
measures absolute numbers instead, the way llama.cpp's compare-llama-bench and
hyperfine do: the base and the change run the same preset on the same machine,
minutes apart, and only their ratio is judged (report.ab has the statistics).

* The base is checked out with `git worktree add --detach` into a temporary
  folder (removed afterwards). Each side runs `prefillbench run PRESET --export`
  in its own process with PYTHONPATH at its own tree: the installed
  dependencies are shared, only prefillbench's source differs.
* A round is one run of each side, back to back. Rounds alternate which side
  goes first (base change, change base, base change, ...), so drift that is
  linear in time cancels out of each pair, as `run --interleave` does for
  strategies.
* Rounds go on from --min-rounds to --max-rounds until every gated ratio's
  interval lies wholly on one side of the threshold, or the next round would
  overrun --max-seconds.

Exit 0: no regression; 1: a regression; 2: unusable input, or the base (or the
working tree) could not run; the reason is one line on stderr.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from prefillbench.bench.metrics import ResultRow
from prefillbench.commands.options import ABOptions
from prefillbench.report.ab import BASE, CHANGE, ABResult, Round, analyse, render_summary, render_table, verdict
from prefillbench.report.compare import key_label
from prefillbench.report.exports import InputError, load_results, row_key
from prefillbench.writers import write_atomic

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




# ---------------------------------------------------------------- the job


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
        write_atomic(options.summary, render_summary(result, base.label, change.label, options.preset, seconds, note))
    for who, keys in (("base", result.only_base), ("working tree", result.only_change)):
        if keys:
            _log(f"{len(keys)} row(s) only in the {who}, not compared: {key_label(keys[0])}{' ...' if len(keys) > 1 else ''}")
    _log(f"{verdict(result)}, {seconds:.0f} s")
    return 1 if result.regressions else 0

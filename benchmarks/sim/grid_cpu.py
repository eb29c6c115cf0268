"""`prefillbench tune`'s whole sim grid, one checkout against another (a git revision), alternated round by round.

The grid is issue 68's: Mistral-7B on an A100, pp1730+tg415 ±90%, P99 TBT 100 ms, every strategy at budgets
128-4096. Each round runs the command once under the old tree (`git archive REV`, unpacked in a temporary folder)
and once under the new one (the working tree by default), in alternating order, each a process of its own; it takes
each run's wall time and its CPU user seconds (its process and the --jobs workers: RUSAGE_CHILDREN), and its
configurations ranked by capacity (from `-o csv`). It prints every run, then the median new/old ratio of both times
and whether every run ranked the same configurations in the same order, and found the same capacities.

    python -m benchmarks.sim.grid_cpu --old 574b2eb                     # the grid before the speed work, against now
    python -m benchmarks.sim.grid_cpu --old 574b2eb --rounds 3 --jobs 1  # one process: CPU per configuration

Run it on a quiet machine: both times are the machine's, and another process's load changes them.
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.lib import cli

ROOT = Path(__file__).resolve().parents[2]
GRID = ["tune", "--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "a100", "--pg", "1730,415",
        "--len-spread", "0.9", "--slo", "tbt=100", "--chunk-size", "128,256,512,1024,2048,4096",
        "--no-progress", "-o", "csv"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--old", default="HEAD", help="a git revision of this repository (default: HEAD)")
    parser.add_argument("--new", default=".", help="a path to a checkout (default: this working tree)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2, help="tune's --jobs (2: as the issue timed it)")
    parser.add_argument("-s", "--strategies", default=None, help="tune's -s (default: its own, every strategy)")


def ranking(stdout: str) -> list[tuple[str, str, str]]:
    """(strategy, budget, capacity req/s) of every configuration of the command's table, the highest capacity first
    (capacities as printed: equal runs print equal floats)."""
    rows = [(r["strategy"], r["budget"], r["capacity_rps"]) for r in csv.DictReader(io.StringIO(stdout))
            if r.get("stage") == "sim"]
    return sorted(rows, key=lambda r: -float(r[2]))


def timed(tree: Path, args: argparse.Namespace) -> tuple[float, float, list[tuple[str, str]]]:
    """(wall s, CPU user s, ranking) of one run of the grid under `tree`."""
    cmd = [sys.executable, "-m", "prefillbench", *GRID, "--jobs", str(args.jobs)]
    if args.strategies:
        cmd += ["-s", args.strategies]
    env = dict(os.environ, PYTHONPATH=str(tree))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    user = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - before
    if out.returncode:
        raise SystemExit(f"{tree}: tune exited {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")
    return wall, user, ranking(out.stdout)


def main(args: argparse.Namespace) -> None:
    new = Path(args.new).resolve()
    with tempfile.TemporaryDirectory(prefix="grid_cpu_") as tmp:
        old = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.old], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        runs: dict[str, list[tuple[float, float, list]]] = {"old": [], "new": []}
        for r in range(args.rounds):
            order = [("old", old), ("new", new)] if r % 2 == 0 else [("new", new), ("old", old)]
            for name, tree in order:
                wall, user, ranks = timed(tree, args)
                runs[name].append((wall, user, ranks))
                print(f"round {r + 1} {name:>3}: {wall:7.1f} s wall, {user:7.1f} s CPU user, "
                      f"{len(ranks)} configurations, best {' '.join(ranks[0][:2]) if ranks else '-'}", flush=True)
    walls = [n[0] / o[0] for n, o in zip(runs["new"], runs["old"])]
    users = [n[1] / o[1] for n, o in zip(runs["new"], runs["old"])]
    print(f"new/old median: wall {statistics.median(walls):.3f} (range {min(walls):.3f}-{max(walls):.3f}), "
          f"CPU user {statistics.median(users):.3f} (range {min(users):.3f}-{max(users):.3f})")
    first = runs["old"][0][2]
    runs_all = runs["old"] + runs["new"]
    order = all([r[:2] for r in ranks] == [r[:2] for r in first] for _, _, ranks in runs_all)
    same = all(ranks == first for _, _, ranks in runs_all)
    print(f"ranking: {'the same in every run' if order else 'DIFFERS'}; capacities: "
          f"{'the same floats in every run' if same else 'differ'} ({len(first)} configurations)")


if __name__ == "__main__":
    cli.run(__name__)

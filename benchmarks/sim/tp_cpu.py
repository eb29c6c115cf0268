"""The sim's own CPU at TP > 1 against TP 1 on the same run (issue 68: it was 2.5x): each run in a fresh process
(the collective curves' fits and caches are a process's first-use cost, as a user's run pays them), rounds
alternating TP1, TPn, so load on the machine falls on both alike; the CPU seconds of each child and their ratio.
`--calls` adds each run's function-call count (cProfile, one run each), a figure the machine's load does not move.

    python -m benchmarks.sim.tp_cpu                     # qwen3-32b on H200, TP 1 against 2, 4 and 8, 5 rounds
    python -m benchmarks.sim.tp_cpu --tp 2 --rounds 9 --calls
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.lib import cli

ROOT = Path(__file__).resolve().parents[2]
TARGET = 1.3  # issue 68: TP > 1's CPU within 1.3x of TP 1's
CALLS = ("import cProfile, pstats, sys, io, contextlib\nfrom prefillbench.cli import main\npr = cProfile.Profile()\n"
         "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
         "    pr.enable(); main(sys.argv[1:]); pr.disable()\n"
         "print(sum(v[1] for v in pstats.Stats(pr).stats.values()))\n")


def run_argv(args: argparse.Namespace, tp: int) -> list[str]:
    return ["run", "--backend", "sim", "--sim-model", args.model, "--sim-gpu", args.gpu, "-p", "0", "-n", "0",
            "--pg", args.pg, "-s", "vllm-v1", "--chunk-size", "2048", "-r", "1", "--tp", str(tp), "-c",
            str(args.c), "--requests", str(4 * args.c), "--no-warmup", "--no-results-file", "--no-progress",
            "--no-verdict"]


def cpu_seconds(argv: list[str]) -> float:
    """User + system CPU of one child process running the CLI."""
    before = os.times()
    subprocess.run([sys.executable, "-m", "prefillbench", *argv], cwd=ROOT, check=True, capture_output=True)
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def calls(argv: list[str]) -> int:
    out = subprocess.run([sys.executable, "-c", CALLS, *argv], cwd=ROOT, check=True, capture_output=True, text=True)
    return int(out.stdout.split()[-1])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="qwen3-32b")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--pg", default="2048,256")
    parser.add_argument("-c", type=int, default=8, help="concurrency; 4c requests")
    parser.add_argument("--tp", default="2,4,8", help="the TPs set against TP 1")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", action="store_true", help="also count each run's function calls (cProfile)")


def main(args: argparse.Namespace) -> int:
    tps = [int(t) for t in args.tp.split(",")]
    cpu: dict[int, list[float]] = {t: [] for t in [1, *tps]}
    for _ in range(args.rounds):
        for tp in cpu:  # alternating: TP1, TPn, ... every round
            cpu[tp].append(cpu_seconds(run_argv(args, tp)))
    base = statistics.median(cpu[1])
    print(f"{args.model} on {args.gpu}, --pg {args.pg} -c {args.c}: CPU seconds a run, median of {args.rounds}")
    print(f"TP1: {base:.2f} s")
    worst = 0.0
    for tp in tps:
        m = statistics.median(cpu[tp])
        ratios = [x / y for x, y in zip(cpu[tp], cpu[1])]
        worst = max(worst, m / base)
        print(f"TP{tp}: {m:.2f} s, {m / base:.2f}x TP1's (per round {min(ratios):.2f}-{max(ratios):.2f}x)")
    if args.calls:
        base_calls = calls(run_argv(args, 1))
        for tp in tps:
            n = calls(run_argv(args, tp))
            print(f"function calls: TP{tp} {n:,} against TP1's {base_calls:,}: {n / base_calls:.3f}x")
    print(f"target: within {TARGET}x of TP1's: {'met' if worst <= TARGET else 'not met'} (worst {worst:.2f}x)")
    return 0


if __name__ == "__main__":
    cli.run(__name__)

"""The sim's simulated steps per second: one capacity probe of Sarathi-Serve's Mistral-7B / A100 workload per strategy.

What bounds `tune`'s grid on the sim is this loop (engine + strategy + cost model), so this is what to time
and profile. Each strategy runs one probe of `--requests` requests (pp1730+tg415, ±90%) arriving as a Poisson
process at `--rate`; the script prints the steps each took and steps per second of wall time.

    python -m benchmarks.sim.steps [--requests 1000] [--rate 2] [-s sequential,sarathi-serve]
    python -m benchmarks.sim.steps --profile   # cProfile of the loop, top functions by own time
    python -m benchmarks.sim.steps --grid      # tune's whole grid (7 strategies, 6 budgets)

Steps per second are per second of this process's CPU time (time.process_time), which another process's load
on the machine changes less than wall time; --grid prints wall time and the CPU time of its worker processes
(about twice the wall time a quiet 2-core machine needs with --jobs 2).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import time

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench import tune
from prefillbench.bench.capacity import Criteria
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, make_requests

from benchmarks.lib import cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("-s", "--strategies", default="sequential,chunked,sarathi-serve")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top 25 functions by own time")
    parser.add_argument("--grid", action="store_true", help="time tune's grid at P99 TBT 100 ms instead")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)


def main(args: argparse.Namespace) -> None:
    backend = SimBackend.load("mistral-7b", "a100")
    test = TestSpec(1730, 415, spread=0.9)
    if args.grid:
        return time_grid(backend, test, args)
    times = ArrivalSpec("poisson", args.rate).times(args.requests, 42, test)
    requests = make_requests(test, args.requests, backend.vocab_size, 42, times)
    profiler = cProfile.Profile() if args.profile else None
    for name in args.strategies.split(","):
        strategy = make_strategy(name, args.chunk)
        t0, c0 = time.perf_counter(), time.process_time()
        if profiler:
            profiler.enable()
        record = engine.run(backend, strategy, requests, 0)
        if profiler:
            profiler.disable()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        print(f"{name:>14}: {len(record.steps):7d} steps in {cpu:6.2f} s of CPU ({wall:6.2f} s wall): "
              f"{len(record.steps) / cpu:8.0f} simulated steps per CPU second ({record.wall:.0f} s simulated)")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def time_grid(backend: SimBackend, test: TestSpec, args: argparse.Namespace) -> None:
    from strategies import STRATEGIES

    configs = tune.grid(list(STRATEGIES), [128, 256, 512, 1024, 2048, 4096])
    settings = tune.TuneSettings(test, [Criteria(100)], args.requests, repeats=args.repeats)
    probes = []
    t0, c0 = time.perf_counter(), time.process_time()
    grid = tune.run_grid(backend, configs, settings, on_probe=lambda c, i, p: probes.append(p), jobs=args.jobs)
    wall, own = time.perf_counter() - t0, time.process_time() - c0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    early = sum(p.stopped_early for p in probes)
    print(f"{len(configs)} configurations, {len(probes)} probes ({early} stopped once their failure was certain), "
          f"{args.repeats} seeds each: {wall:.0f} s wall; CPU "
          f"{own:.0f} s here + {children.ru_utime + children.ru_stime:.0f} s in {args.jobs} workers")
    best = tune.ranked(grid.results)[0]
    seq = [r for r in grid.results if r.config.strategy == "sequential"][0]
    print(f"best: {best.config.label} {best.capacity:.3g} req/s, {best.capacity / seq.capacity:.2f}x sequential")


if __name__ == "__main__":
    cli.run(__name__)

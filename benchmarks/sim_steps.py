"""The sim's simulated steps per second: one capacity probe of Sarathi-Serve's Mistral-7B / A100 workload per strategy.

What bounds `tune`'s grid on the sim is this loop (engine + strategy + cost model), so this is what to time
and profile. Each strategy runs one probe of `--requests` requests (pp1730+tg415, ±90%) arriving as a Poisson
process at `--rate`; the script prints the steps each took and steps per second of wall time.

    PYTHONPATH=. .venv/bin/python benchmarks/sim_steps.py [--requests 1000] [--rate 2] [-s sequential,sarathi-serve]
    PYTHONPATH=. .venv/bin/python benchmarks/sim_steps.py --profile   # cProfile of the loop, top functions by own time
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, make_requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("-s", "--strategies", default="sequential,chunked,sarathi-serve")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top 25 functions by own time")
    args = parser.parse_args()
    backend = SimBackend.load("mistral-7b", "a100")
    test = TestSpec(1730, 415, spread=0.9)
    times = ArrivalSpec("poisson", args.rate).times(args.requests, 42, test)
    requests = make_requests(test, args.requests, backend.vocab_size, 42, times)
    profiler = cProfile.Profile() if args.profile else None
    for name in args.strategies.split(","):
        strategy = make_strategy(name, args.chunk)
        t0 = time.perf_counter()
        if profiler:
            profiler.enable()
        record = engine.run(backend, strategy, requests, 0)
        if profiler:
            profiler.disable()
        wall = time.perf_counter() - t0
        print(f"{name:>14}: {len(record.steps):7d} steps in {wall:6.2f} s: {len(record.steps) / wall:8.0f} simulated steps/s "
              f"({record.wall:.0f} s simulated)")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()

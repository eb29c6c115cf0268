"""The same workload on prefillbench's own engine driving llama.cpp step by step (`--backend gguf -s sarathi-serve`)
and on llama.cpp's own server (`--backend llama-server -s sarathi-serve`): same model, same llama.cpp, same threads,
same token budget, the two alternated case by case so the machine's drift falls on both alike.

  python -m benchmarks.server.against_gguf --budgets 32,64,256 --concurrency 1,4 --rounds 3

Per budget and concurrency: throughput, TTFT p50/p99 and TBT p50/p99 of each, the server's over the engine's as a
median ratio over the rounds with its range. `--rate R` adds an open loop at R req/s (near capacity: see
`prefillbench capacity`).

Where a TBT differs, the server's TBT p50 on its own clock (`timings_per_token`: the time between its tokens inside
the server, before HTTP and the client) tells a difference made in the server from one made on the way to the
client. `-t 1` leaves a core to the client and the server's HTTP thread: if the TBT ratio then falls to 1, the
difference was their work taking CPU from llama.cpp's compute threads.
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

from prefillbench.backends import load_backend
from prefillbench.bench.cases import BenchConfig, Case, run_case
from prefillbench.bench.workloads import make_tests

from benchmarks.lib import cli

FIGURES = ("throughput", "ttft_p50_ms", "ttft_p99_ms", "tbt_p50_ms", "tbt_p99_ms")


def server_clock_tbt_p50(runs) -> float:
    """TBT p50 on the server's own per-token clock (ms), every successful request of every run."""
    gaps = [np.diff(r.server_token_times) for run in runs for r in run.requests if r.server_token_times]
    return float(np.percentile(np.concatenate(gaps), 50)) if gaps else float("nan")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budgets", default="32,64,256")
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--pg", default="256,32", help="prompt,generated tokens")
    parser.add_argument("--requests", type=int, default=8, help="requests per case")
    parser.add_argument("--rate", type=float, default=None, help="also an open loop (poisson) at this rate")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-m", "--model", default=None)


def main(args: argparse.Namespace) -> None:
    p, g = (int(x) for x in args.pg.split(","))
    test = make_tests([], [], [(p, g)], 0.0)[0]
    gguf = load_backend("gguf", args.model, threads=args.threads)
    server = load_backend("llama-server", args.model, threads=args.threads)
    loads = [(c, None) for c in (int(x) for x in args.concurrency.split(","))]
    if args.rate:
        loads.append((0, args.rate))
    ratios: dict[tuple, dict[str, list[float]]] = {}
    figures: dict[tuple, dict[str, list[float]]] = {}
    try:
        for rnd in range(args.rounds):
            for budget in (int(b) for b in args.budgets.split(",")):
                for c, rate in loads:
                    arrival = "poisson" if rate else "closed"
                    config = BenchConfig([test], ["sarathi-serve"], [c], [budget], repetitions=1,
                                         requests=args.requests, seed=42 + rnd, arrival=arrival,
                                         rates=[rate] if rate else [])
                    case = Case(test, "sarathi-serve", c, budget, rate)
                    # alternate which goes first, round by round
                    order = [("gguf", gguf), ("llama-server", server)]
                    results = {name: run_case(b, case, config) for name, b in (order if rnd % 2 == 0 else order[::-1])}
                    rows = {name: r.row for name, r in results.items()}
                    key = (budget, c, rate)
                    extra = figures.setdefault(key + ("extra",), {})
                    extra.setdefault("server_clock_tbt_p50_ms", []).append(server_clock_tbt_p50(results["llama-server"].runs))
                    for f in FIGURES:
                        ratios.setdefault(key, {}).setdefault(f, []).append(getattr(rows["llama-server"], f) /
                                                                              getattr(rows["gguf"], f))
                        for name in rows:
                            figures.setdefault(key + (name,), {}).setdefault(f, []).append(getattr(rows[name], f))
                    print(f"round {rnd + 1} budget {budget} c={c}{f' {rate:g} req/s' if rate else ''}: " + ", ".join(
                        f"{f} {getattr(rows['gguf'], f):.1f} / {getattr(rows['llama-server'], f):.1f}" for f in FIGURES)
                        + f"; server clock TBT p50 {extra['server_clock_tbt_p50_ms'][-1]:.2f}", flush=True)
    finally:
        server.close()
        gguf.close()
    print("\n| budget | load | backend | throughput tok/s | TTFT p50 ms | TTFT p99 ms | TBT p50 ms | TBT p99 ms |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for key, by in ratios.items():
        budget, c, rate = key
        load = f"{rate:g} req/s" if rate else f"c={c}"
        for name in ("gguf", "llama-server"):
            med = {f: statistics.median(figures[key + (name,)][f]) for f in FIGURES}
            print(f"| {budget} | {load} | {name} | " + " | ".join(f"{med[f]:.1f}" for f in FIGURES) + " |")
        print(f"| {budget} | {load} | server/gguf, median [min, max] | " + " | ".join(
            f"{statistics.median(by[f]):.3f} [{min(by[f]):.3f}, {max(by[f]):.3f}]" for f in FIGURES) + " |")
    print("\n| budget | load | gguf TBT p50 ms | server TBT p50 ms, client clock | server TBT p50 ms, server clock |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for key in ratios:
        budget, c, rate = key
        load = f"{rate:g} req/s" if rate else f"c={c}"
        extra = figures[key + ("extra",)]
        print(f"| {budget} | {load} | {statistics.median(figures[key + ('gguf',)]['tbt_p50_ms']):.2f} | "
              f"{statistics.median(figures[key + ('llama-server',)]['tbt_p50_ms']):.2f} | "
              f"{statistics.median(extra['server_clock_tbt_p50_ms']):.2f} |")


if __name__ == "__main__":
    cli.run(__name__)

"""Where a run's time goes, by kind of step: does the decomposition add up to the measured run?

Runs one closed-loop workload under each strategy through the engine (as `prefillbench run` does,
after one untimed warm-up run) and sums the recorded steps by kind: prompt only, decode only, and
mixed (a prompt chunk carrying decodes). The kinds' totals plus the gaps between steps are the run's
wall time, so a strategy's gain or loss against another can be read off the rows. Against the
sequential run before it, each other strategy also gets a ceiling: its wall time if its prompt work
cost what sequential's did and its piggybacked decodes cost nothing.

    python -m benchmarks.runs.decomposition --backend torch -t 2 --pg 1024,16 -c 4 --requests 8 \
        -s sequential,chunked --chunk-size 256
"""
from __future__ import annotations

import argparse
from collections import defaultdict

from prefillbench import engine
from prefillbench.backends import load_backend
from prefillbench.bench.metrics import strategy_label
from prefillbench.models import default_model_path
from prefillbench.bench.workloads import TestSpec, make_requests
from strategies import make_strategy

from benchmarks.lib import cli


def kind(step: engine.StepRecord) -> str:
    if step.prefill_chunks and step.decode_contexts:
        return "mixed"
    return "prompt only" if step.prefill_chunks else "decode only"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="torch")
    parser.add_argument("-m", "--model", default=None)
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("--pg", default="1024,16", help="prompt and generation length")
    parser.add_argument("-c", "--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("-s", "--strategies", default="sequential,chunked")
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--compile", action="store_true", help="torch on CPU: decode-only steps through inductor graphs")


def main(args: argparse.Namespace) -> None:
    prompt_len, gen_len = (int(v) for v in args.pg.split(","))
    options = {"compile_decode": True} if args.compile else {}
    backend = load_backend(args.backend, args.model or default_model_path(), threads=args.threads, **options)
    requests = make_requests(TestSpec(prompt_len, gen_len), args.requests, backend.vocab_size, args.seed)
    print(f"# {backend.model_name} on {backend.label}: {args.requests} requests of pp{prompt_len}+tg{gen_len}, "
          f"concurrency {args.concurrency}")
    print("| strategy | wall s | kind | steps | tokens | total s | mean ms | share of wall |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    ceilings = []
    reference: dict[str, float] | None = None
    for name in args.strategies.split(","):
        strategy = make_strategy(name, args.chunk_size)
        engine.run(backend, strategy, requests, args.concurrency)  # warm-up: allocations, kernel choices
        record = engine.run(backend, strategy, requests, args.concurrency)
        by_kind: dict[str, list[engine.StepRecord]] = defaultdict(list)
        for step in record.steps:
            by_kind[kind(step)].append(step)
        gaps = record.wall - sum(s.seconds for s in record.steps)
        label = strategy_label(name, args.chunk_size if strategy.uses_chunk_size else None)
        totals = {"wall": record.wall, "gaps": gaps}
        for k in ("prompt only", "mixed", "decode only"):
            steps = by_kind.get(k, [])
            total = totals[k] = sum(s.seconds for s in steps)
            tokens = sum(n for s in steps for _, n in s.prefill_chunks) + sum(len(s.decode_contexts) for s in steps)
            mean = 1e3 * total / len(steps) if steps else 0.0
            print(f"| {label} | {record.wall:.2f} | {k} | {len(steps)} | {tokens} | {total:.2f} | {mean:.1f} | {total / record.wall:.1%} |")
        print(f"| {label} | {record.wall:.2f} | between steps | | | {gaps:.3f} | | {gaps / record.wall:.1%} |")
        if name == "sequential":
            reference = totals
        elif reference is not None:
            # The best this schedule can do against the sequential run before it: its prompt work at
            # sequential's cost, every piggybacked decode free, and only its own decode-only steps added.
            best = reference["prompt only"] + totals["decode only"] + totals["gaps"]
            ceilings.append(f"{label}: {reference['wall'] / record.wall:.3f}x sequential's throughput "
                            f"({record.wall:.2f} against {reference['wall']:.2f} s); its ceiling, with prompt work at "
                            f"sequential's cost and piggybacked decodes free, {reference['prompt only']:.2f} + "
                            f"{totals['decode only']:.2f} + {totals['gaps']:.3f} = {best:.2f} s: "
                            f"{reference['wall'] / best:.3f}x")
    for line in ceilings:
        print(line)


if __name__ == "__main__":
    cli.run(__name__)

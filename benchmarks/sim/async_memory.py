"""What async scheduling changes where memory binds: one workload on the sim, its engine choosing each step before the
last one's tokens are in (a finished request's KV blocks freed a step late: vLLM V1's default on GPUs, SGLang's
overlap loop) and after them, every other setting the same.

  python -m benchmarks.sim.async_memory --model llama-3.1-8b --gpu h100 --kv-cache-tokens 60000 --rate 8

Printed: for each strategy, both ways, achieved req/s, TTFT p50/p99, TBT p99, preemptions, peak KV use. The timing of
a step is the same both ways (the --sim-overheads engine's overlap of host work stays on); only when memory is seen
free differs. The sim is deterministic: the figures do not depend on the machine or its load.
"""
from __future__ import annotations

import argparse

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench.metrics import Load, summarize
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, make_requests
from strategies import make_strategy

from benchmarks.lib import cli


class SchedulesAfter(SimBackend):
    """The same engine, choosing each step only once the last one's tokens are in."""

    @property
    def schedules_ahead(self) -> bool:
        return False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--kv-cache-tokens", type=int, default=60000)
    parser.add_argument("--pg", default="2000,1000", help="prompt,generation tokens (spread ±50%%)")
    parser.add_argument("--rate", type=float, default=8.0, help="poisson arrivals per second")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("-s", "--strategies", default="vllm-v1")


def main(args: argparse.Namespace) -> int:
    prompt, gen = (int(x) for x in args.pg.split(","))
    test = TestSpec(prompt, gen, spread=0.5)
    arrivals = ArrivalSpec("poisson", args.rate).times(args.requests, 0, test)
    print(f"{args.model} on {args.gpu}, KV cache {args.kv_cache_tokens} tokens, pp{prompt}+tg{gen}±50%, "
          f"{args.requests} requests at {args.rate:g}/s, budget {args.budget}")
    print("| strategy | scheduling | achieved req/s | TTFT p50/p99 ms | TBT p99 ms | preempted | KV peak % |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in args.strategies.split(","):
        for label, cls in (("ahead (async)", SimBackend), ("after (sync)", SchedulesAfter)):
            backend = cls.load(args.model, args.gpu, sim_overheads="vllm")
            backend.kv_cache_tokens = args.kv_cache_tokens
            reqs = make_requests(test, args.requests, backend.vocab_size, 0, arrivals)
            run = engine.run(backend, make_strategy(name, args.budget), reqs, 0)
            row = summarize(test, [run], model=args.model, backend=backend.label, strategy=name, concurrency=0,
                            chunk_size=args.budget, load=Load("poisson", args.rate, None))
            print(f"| {name} | {label} | {row.achieved_rps:.2f} | {row.ttft_p50_ms:.0f}/{row.ttft_p99_ms:.0f} | "
                  f"{row.tbt_p99_ms:.1f} | {row.preemptions:.0f} | {row.kv_peak_pct:.0f} |")
    return 0


if __name__ == "__main__":
    cli.run(__name__)

"""Where multi-turn sessions wait: first turns against later turns (which resend their history), each strategy with
and without a host tier, at one rate of sessions on the sim. The rows give the TTFT of later turns at p50 only; this
splits the p99 into scheduling delay (waiting to be admitted) and the rest.

  python -m benchmarks.sim.session_turns --rate 1.2 -s vllm-v1,sglang,sglang-mixed --kv-host-cache 0,128

Printed per strategy and host tier: prefix hits, retractions or preemptions, TTFT p50/p99 and scheduling delay p99 of
first and of later turns, peak KV use. Deterministic: the figures do not depend on the machine.
"""
from __future__ import annotations

import argparse
import contextlib

import numpy as np

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench.sessions import SessionSpec
from prefillbench.bench.workloads import ArrivalSpec, make_requests, sessions_test
from strategies import make_strategy

from benchmarks.lib import cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--workload", default="sessions:n=600,turns=6,system=2048,message=512,answer=256,think=30")
    parser.add_argument("--rate", type=float, default=1.2, help="sessions started a second (poisson)")
    parser.add_argument("-s", "--strategies", default="vllm-v1,sglang,sglang-mixed")
    parser.add_argument("--budget", type=int, default=2048)
    parser.add_argument("--kv-host-cache", default="0,128", help="GiB below the GPU, one run each (0: none)")
    parser.add_argument("--kv-cache-tokens", type=int, default=None, help="the GPU's KV cache shrunk to N tokens")
    parser.add_argument("--kv-host-link", default=None, help="pcie (default), c2c or GB/s: what the tier's loads cross")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--no-output-reserve", action="store_true",
                        help="a counterfactual, not SGLang's rule: SGLang's strategies reserve nothing for the running "
                        "requests' future output (to see whether that reservation is what holds a prompt back)")


def ms(values: list[float], q: float) -> str:
    return f"{np.percentile(values, q):,.0f}" if values else "-"


@contextlib.contextmanager
def no_output_reserve():
    """SGLang's budget with no future output charged (sglang_budget's CLIP and future_tokens at 0), then as it was."""
    import strategies.sglang_budget as budget
    import strategies.sglang_radix as radix

    saved = budget.CLIP, budget.future_tokens, radix.future_tokens
    budget.CLIP = 0
    budget.future_tokens = radix.future_tokens = lambda seq: 0
    try:
        yield
    finally:
        budget.CLIP, budget.future_tokens, radix.future_tokens = saved


def main(args: argparse.Namespace) -> int:
    spec = SessionSpec.parse(args.workload)
    test = sessions_test(spec)
    print(f"{args.model} on {args.gpu}, {args.workload}, {args.rate:g} sessions/s, budget {args.budget}")
    print("| strategy | host GiB | prefix hits % | preempted | first turns TTFT p50/p99 ms | first sched p99 ms | "
          "later turns TTFT p50/p99 ms | later sched p99 ms | KV peak % |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.strategies.split(","):
        for gib in (float(x) for x in args.kv_host_cache.split(",")):
            backend = SimBackend.load(sim_model=args.model, sim_gpu=args.gpu, prefix_cache="on",
                                      kv_host_cache=gib or None, kv_host_link=args.kv_host_link if gib else None)
            backend.kv_cache_tokens = args.kv_cache_tokens
            arrivals = ArrivalSpec("poisson", args.rate).times(spec.n, args.seed, test)
            requests = make_requests(test, spec.n * spec.turns, backend.vocab_size, args.seed, arrivals)
            with no_output_reserve() if args.no_output_reserve else contextlib.nullcontext():
                run = engine.run(backend, make_strategy(name, args.budget), requests, 0)
            turns = {k: [r for r in run.requests if (r.turn > 0) == k] for k in (False, True)}
            ttft = {k: [1e3 * (r.token_times[0] - r.arrival) for r in rs] for k, rs in turns.items()}
            sched = {k: [1e3 * (r.first_scheduled - r.arrival) for r in rs] for k, rs in turns.items()}
            hits = sum(r.cached_tokens for r in run.requests) / sum(r.prompt_len for r in run.requests)
            print(f"| {name} ({args.budget}) | {gib:g} | {100 * hits:.1f} | {sum(r.preemptions for r in run.requests)} | "
                  f"{ms(ttft[False], 50)}/{ms(ttft[False], 99)} | {ms(sched[False], 99)} | "
                  f"{ms(ttft[True], 50)}/{ms(ttft[True], 99)} | {ms(sched[True], 99)} | {100 * run.kv_peak_fraction:.0f} |")
    return 0


if __name__ == "__main__":
    cli.run(__name__)

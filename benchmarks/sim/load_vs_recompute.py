"""When a load from a tier below the GPU loses to computing the tokens again: for each model and GPU, a run of cached
tokens priced both ways on the sim, and the link rate below which recomputing it is the cheaper (the host tier's own
choice, engine/host_tier.py `to_load`).

  python -m benchmarks.sim.load_vs_recompute
  python -m benchmarks.sim.load_vs_recompute --cases llama-3.1-8b:h100:1,llama-13b:a100:1 --tokens 512 --at 0,32768

A load moves tokens x the model's KV bytes per token per GPU over each GPU's own link; a recompute is the same
tokens as a lone prompt chunk starting `at` tokens into the prompt (so its attention reads `at` earlier tokens), at
the sim's default pricing for the GPU. The crossover rate is bytes over recompute seconds: a tier slower than it
(an NVMe drive's 3-7 GB/s, a 100 Gb/s NIC's 12.5) loses to recomputing; host memory over PCIe (32-64 GB/s) or
NVLink-C2C (450) wins everywhere here. Deterministic: the figures do not depend on the machine.
"""
from __future__ import annotations

import argparse

from prefillbench.backends.sim import host_tier as sim_host_tier
from prefillbench.backends.sim.backend import SimBackend

from benchmarks.lib import cli

#: model:gpu:tp, a dense GQA model at two sizes, an MHA model (no GQA: 5x the KV per token), MoE models with few
#: active parameters (little compute per token against their KV).
DEFAULT_CASES = ("llama-3.1-8b:h100:1,llama-3.1-70b:h100:4,mistral-7b:a100:1,llama-13b:a100:1,"
                 "qwen3-30b-a3b:h100:1,gpt-oss-20b:h100:1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", default=DEFAULT_CASES, help="model:gpu:tp, comma-separated")
    parser.add_argument("--tokens", type=int, default=512, help="tokens in the cached run")
    parser.add_argument("--at", default="0,8192,32768", help="where the run starts in its prompt, tokens")


def crossover(backend: SimBackend, tokens: int, at: int) -> tuple[float, float]:
    """(recompute seconds, the link rate in bytes/s a direction at which a load costs as much)."""
    seconds = sim_host_tier.recompute_seconds(backend, at, tokens)
    return seconds, tokens * backend.cost.kv_bytes_per_token_per_gpu() / seconds


def main(args: argparse.Namespace) -> int:
    starts = [int(x) for x in args.at.split(",")]
    print(f"A run of {args.tokens} cached tokens: computed again (ms), loaded over the card's PCIe (ms), and the link "
          "rate below which recomputing wins (GB/s a direction), by where the run starts in its prompt")
    print("| model | GPU | TP | KV KiB/token/GPU | " + " | ".join(f"recompute ms at {a}" for a in starts)
          + " | PCIe load ms | " + " | ".join(f"loses below GB/s at {a}" for a in starts) + " |")
    print("|---|---|---:|---:|" + "---:|" * (2 * len(starts) + 1))
    for case in args.cases.split(","):
        model, gpu, tp = case.split(":")
        backend = SimBackend.load(sim_model=model, sim_gpu=gpu, tp=int(tp))
        per_token = backend.cost.kv_bytes_per_token_per_gpu()
        found = [crossover(backend, args.tokens, a) for a in starts]
        load_ms = 1e3 * sim_host_tier.load_seconds(backend, args.tokens)
        print(f"| {model} | {backend.gpu.name} | {tp} | {per_token / 1024:.0f} | "
              + " | ".join(f"{1e3 * s:.2f}" for s, _ in found) + f" | {load_ms:.2f} | "
              + " | ".join(f"{bw / 1e9:.1f}" for _, bw in found) + " |")
    return 0


if __name__ == "__main__":
    cli.run(__name__)

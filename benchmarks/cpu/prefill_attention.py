"""A chunk's causal attention on the CPU: the compiled kernel (cpu_prefill_attention) against the SDPA calls it replaced.

First 30 layers of SmolLM2-135M's heads (9 query, 3 K/V, 64 wide) over one cache slot,
by chunk offset and length, the two alternated rep by rep: medians, and GFLOP/s counting
only the causal pairs. Then whole steps of the default model through the torch backend,
kernel on and off alternated, with the logits compared.

    python -m benchmarks.cpu.prefill_attention [--reps 9] [--threads 2] [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
import torch.nn.functional as F

from prefillbench.backends.torch.cpu import prefill_attention as cpu_prefill_attention
from prefillbench.backends.torch.attention import chunk_query_blocks
from prefillbench.step import PrefillChunk, Step

from benchmarks.lib import cli
from benchmarks.lib.both_ways import default_backend, kernel_switch, logit_column, print_both_ways
from benchmarks.lib.models import DIM, HEADS, KV_HEADS, LAYERS
from benchmarks.lib.timing import Clock, time_both_ways, time_interleaved

CASES = ((0, 128), (0, 256), (0, 512), (0, 1024), (256, 256), (768, 256), (1000, 24))


def sdpa_calls(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
    """The backend's SDPA path for one chunk: q [heads, T, D] -> [T, heads, D]."""
    out = q.new_empty(q.shape[1], HEADS, DIM)
    for b in chunk_query_blocks(start, q.shape[1], q.dtype, q.device):
        rows = slice(b.first, b.first + b.length)
        out[rows] = F.scaled_dot_product_attention(q[None, :, rows], keys[None, :, : b.kv_len], values[None, :, : b.kv_len],
                                                   attn_mask=b.mask, is_causal=b.mask is None, scale=DIM**-0.5,
                                                   enable_gqa=True)[0].transpose(0, 1)
    return out


def kernel_table(reps: int, clock: Clock, dtype: torch.dtype) -> None:
    print(f"# chunk attention, {LAYERS} layers of {HEADS}/{KV_HEADS} heads x {DIM}, {str(dtype).removeprefix('torch.')}, "
          f"{torch.get_num_threads()} threads, "
          f"{reps} interleaved reps; GFLOP/s of the causal pairs")
    print("| offset | length | kernel ms | SDPA ms | kernel / SDPA | kernel GFLOP/s | SDPA GFLOP/s | max abs diff |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for start, length in CASES:
        qkv = torch.randn(length, (HEADS + 2 * KV_HEADS) * DIM, dtype=dtype)
        q = qkv[:, : HEADS * DIM].view(length, HEADS, DIM).transpose(0, 1)  # as the backend's qkv product lays it
        keys, values = (torch.randn(KV_HEADS, start + length + 64, DIM, dtype=dtype) for _ in range(2))
        diff = float((cpu_prefill_attention.prefill_attention(q, keys, values, start, DIM**-0.5).float()
                      - sdpa_calls(q, keys, values, start).float()).abs().max())
        t = time_interleaved({
            "kernel": lambda: [cpu_prefill_attention.prefill_attention(q, keys, values, start, DIM**-0.5) for _ in range(LAYERS)],
            "sdpa": lambda: [sdpa_calls(q, keys, values, start) for _ in range(LAYERS)]}, reps, clock)
        kernel, sdpa = t["kernel"].median, t["sdpa"].median
        flops = LAYERS * HEADS * 4 * DIM * sum(start + i + 1 for i in range(length))
        print(f"| {start} | {length} | {kernel * 1e3:.1f} | {sdpa * 1e3:.1f} | {kernel / sdpa:.2f} | {flops / kernel / 1e9:.0f} | "
              f"{flops / sdpa / 1e9:.0f} | {diff:.1e} |")


def step_table(reps: int, clock: Clock, dtype: str) -> None:
    backend = default_backend(dtype, 1, 1100)
    rng = np.random.default_rng(0)
    tokens = tuple(int(t) for t in rng.integers(0, backend.vocab_size, 1024))
    steps = {"pp512": Step(prefills=(PrefillChunk(0, tokens[:512], 0, True),)),
             "chunk 256 at 768": Step(prefills=(PrefillChunk(0, tokens[768:], 768, True),))}
    run = kernel_switch(backend, cpu_prefill_attention)

    run(Step(prefills=(PrefillChunk(0, tokens[:768], 0, False),)), True)  # the cache the chunk at 768 attends to
    logits = logit_column(run, steps)
    times = time_both_ways(run, steps, reps, clock)
    print()
    print(f"# whole steps of {backend.model_name}, {dtype}, {torch.get_num_threads()} threads, {reps} interleaved reps")
    print_both_ways(times, "step", "kernel", "SDPA", logits)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    if cpu_prefill_attention.status():
        sys.exit(f"the prefill kernel is {cpu_prefill_attention.status()}")
    clock = Clock(torch.device("cpu"))
    kernel_table(args.reps, clock, getattr(torch, args.dtype))
    step_table(args.reps, clock, args.dtype)


if __name__ == "__main__":
    cli.run(__name__)

"""Decode attention on the CPU: the compiled kernel against SDPA and two matmuls, by context length.

30 layers of SmolLM2-135M's heads (9 query, 3 K/V, 64 wide) over a static cache,
2 threads; the three alternated rep by rep so that the machine's drift hits them
alike; medians, and the cache bytes read per second. With --steps, whole
backend steps of the default model instead (decodes at 1,024 positions, and a
256-token chunk with and without 3 decodes), the kernel on and off alternated.

    python -m benchmarks.cpu.decode_attention [--dtype bfloat16] [--reps 21] [--steps]
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from prefillbench.backends.torch.cpu import decode_attention as cpu_decode_attention
from prefillbench.backends.torch.attention import _matmul_attention, decode_mask

from benchmarks.lib import cli
from benchmarks.lib.both_ways import default_backend, kernel_switch, print_both_ways
from benchmarks.lib.models import DIM, HEADS, KV_HEADS, LAYERS
from benchmarks.lib.timing import Clock, time_both_ways, time_interleaved


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", action="store_true", help="time backend steps of the default model, kernel on and off")


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    if cpu_decode_attention.status():
        sys.exit(f"the kernel is {cpu_decode_attention.status()}")
    if args.steps:
        return steps(args)
    print(f"# decode attention, {LAYERS} layers of {HEADS}/{KV_HEADS} heads x {DIM}, {args.dtype}, "
          f"{torch.get_num_threads()} threads, {args.reps} interleaved reps; GB/s = cache bytes read per second")
    print("| decodes | positions | kernel ms | SDPA ms | matmuls ms | kernel GB/s | matmuls GB/s | kernel / best other |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    clock = Clock(torch.device("cpu"))
    for n in (1, 4, 16):
        for length in (32, 128, 512, 1024, 2048):
            slots = n + 1
            keys = [torch.randn(slots, KV_HEADS, length + 64, DIM, dtype=dtype) for _ in range(LAYERS)]
            values = [torch.randn(slots, KV_HEADS, length + 64, DIM, dtype=dtype) for _ in range(LAYERS)]
            q = torch.randn(n, HEADS, DIM, dtype=dtype)
            positions = torch.full((n,), length - 1)
            slot_ids = torch.arange(n)
            mask = decode_mask(positions, length, dtype)

            def kernel():
                for k, v in zip(keys, values):
                    cpu_decode_attention.decode_attention(q, k, v, slot_ids, positions, DIM**-0.5)

            def sdpa():
                for k, v in zip(keys, values):
                    F.scaled_dot_product_attention(q.unsqueeze(2), k[:n, :, :length], v[:n, :, :length], attn_mask=mask,
                                                   scale=DIM**-0.5, enable_gqa=True)

            def matmuls():
                for k, v in zip(keys, values):
                    _matmul_attention(q, k[:n, :, :length], v[:n, :, :length], mask, DIM**-0.5)

            t = {name: timing.median for name, timing in
                 time_interleaved({"kernel": kernel, "sdpa": sdpa, "matmuls": matmuls}, args.reps, clock).items()}
            read = LAYERS * 2 * n * KV_HEADS * length * DIM * dtype.itemsize
            print(f"| {n} | {length} | {t['kernel'] * 1e3:.2f} | {t['sdpa'] * 1e3:.2f} | {t['matmuls'] * 1e3:.2f} | "
                  f"{read / t['kernel'] / 1e9:.1f} | {read / t['matmuls'] / 1e9:.1f} | {t['kernel'] / min(t['sdpa'], t['matmuls']):.2f} |")


def steps(args: argparse.Namespace) -> None:
    """Backend steps with the kernel and with the matmul/SDPA path, alternated rep by rep; logits compared."""
    from prefillbench.step import DecodeToken, PrefillChunk, Step

    context = 1024
    # decode_plan=False: the plan calls the decode kernel whatever applies() says
    backend = default_backend(args.dtype, 17, context + 300, decode_plan=False)
    decodes = lambda n, first=0: tuple(DecodeToken(first + i, 1, context) for i in range(n))  # noqa: E731
    chunk = PrefillChunk(0, tuple(range(1000, 1256)), context, is_last=False)
    cases = {f"decode x{n}": Step(decodes=decodes(n)) for n in (1, 4, 16)}
    cases.update({"chunk": Step(prefills=(chunk,)), "chunk + 3 decodes": Step(prefills=(chunk,), decodes=decodes(3, 1)),
                  "3 decodes": Step(decodes=decodes(3, 1))})
    run = kernel_switch(backend, cpu_decode_attention)

    on, off = (run(cases["decode x16"], k, logits=True).logits for k in (True, False))
    diff = max(float(abs(on[s] - off[s]).max()) for s in on)
    times = time_both_ways(run, cases, args.reps, Clock(torch.device("cpu")))
    print(f"# backend steps, {backend.model_name}, {args.dtype}, {torch.get_num_threads()} threads, decodes at {context} positions, "
          f"{args.reps} interleaved reps; decode x16 logits, kernel against matmuls: max |diff| {diff:.1e}")
    print_both_ways(times, "step", "kernel", "matmuls/SDPA")
    for way, path in enumerate(("kernel", "matmuls")):
        extra = times["chunk + 3 decodes"][way].median - times["chunk"][way].median
        alone = times["3 decodes"][way].median
        print(f"piggyback, {path}: (chunk + 3 decodes) - chunk = {extra * 1e3:.1f} ms = {extra / alone:.2f} x the 3 decodes alone ({alone * 1e3:.1f} ms)")


if __name__ == "__main__":
    cli.run(__name__)

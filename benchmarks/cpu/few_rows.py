"""Decode steps with products of a few rows through cpu_few_rows' packed weights, against the torch kernels.

The torch backend's kernel tuner picks per weight shape and row count; this runs the
default model's steps with its choices and with the choices it makes when the packed
kernel is not a candidate, alternated rep by rep in one process: medians, the paired
median of the ratios, and the logits of each step compared. A second table times the
model's 121 weights alone (every product of one decode step, nothing else) and prints
the read speed each way against a plain read of as many bytes.

    python -m benchmarks.cpu.few_rows [--dtype bfloat16] [--reps 9] [--context 1024]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import torch


from prefillbench.backends.torch.cpu import few_rows as cpu_few_rows
from prefillbench.backends.torch import linear as torch_linear
from prefillbench.step import DecodeToken, PrefillChunk, Step

from benchmarks.lib import cli
from benchmarks.lib.both_ways import add_both_ways_arguments, compare_switch, switch_backend
from benchmarks.lib.timing import Clock, time_interleaved

PACKED = "few_rows_packed"


def choices_without_packed(kernels: torch_linear.LinearKernels) -> dict:
    """The tuner's choices had the packed kernel not been a candidate (re-timed where it had won)."""
    applies = torch_linear._applies
    torch_linear._applies = lambda name, layer, rows: name != PACKED and applies(name, layer, rows)
    try:
        other = dict(kernels.choice)
        for (kind, rows), name in kernels.choice.items():
            if name == PACKED:
                peer = kernels.layers[kind][0]
                x = torch.zeros(rows, peer.weight.shape[1], dtype=peer.weight.dtype)
                other[(kind, rows)] = kernels._pick(x, peer)
        return other
    finally:
        torch_linear._applies = applies


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_both_ways_arguments(parser, "positions each decode attends to; the chunk's offset")


def main(args: argparse.Namespace) -> None:
    # decode_plan=False: the plan multiplies decode-only steps through few_rows whatever the tuner chose
    backend = switch_backend(args, 8, 260, cpu_few_rows, "few-rows kernel is", decode_plan=False)
    kernels = backend.linear_kernels
    with_packed = dict(kernels.choice)
    if PACKED not in with_packed.values():
        sys.exit("the tuner chose the packed kernel for no weight here")
    without = choices_without_packed(kernels)
    rng = np.random.default_rng(0)
    chunk = PrefillChunk(0, tuple(int(t) for t in rng.integers(0, backend.vocab_size, 256)), args.context, is_last=False)

    def decodes(n: int, first: int = 0) -> tuple[DecodeToken, ...]:
        return tuple(DecodeToken(first + i, 1, args.context) for i in range(n))

    steps = {**{f"decode x{n}": Step(decodes=decodes(n)) for n in (1, 2, 3, 4, 8)},
             "chunk 256 + 3 decodes": Step(prefills=(chunk,), decodes=decodes(3, first=1))}

    def switch(packed: bool) -> None:
        kernels.choice = with_packed if packed else without

    compare_switch(backend, switch, steps, args, "packed", "torch kernels",
                   note=f"packed kernel chosen for: {', '.join(k for k, v in kernels.summary().items() if v == PACKED)}")
    clock = Clock(torch.device("cpu"))

    weights = [w for peers in kernels.layers.values() for w in peers]
    nbytes = sum(w.weight.numel() * w.weight.element_size() for w in weights)
    plain = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    print()
    print(f"every weight of a decode step ({len(weights)} weights, {nbytes / 1e6:.0f} MB), products alone:")
    print("| rows | packed ms | GB/s | torch kernels ms | GB/s | plain read of as many bytes ms | GB/s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for rows in (1, 2, 3, 4, 8):
        inputs = {k: torch.randn(rows, k, dtype=backend.dtype) for k in {w.weight.shape[1] for w in weights}}

        def products(choice: dict) -> None:
            kernels.choice = choice
            for w in weights:
                kernels.forward(inputs[w.weight.shape[1]], w)
            kernels.choice = with_packed

        timed = time_interleaved({"packed": lambda: products(with_packed), "torch": lambda: products(without),
                                  "read": lambda: plain.sum()}, args.reps, clock)
        cells = [f"{timed[k].median * 1e3:.1f} | {nbytes / timed[k].median / 1e9:.1f}" for k in ("packed", "torch", "read")]
        print(f"| {rows} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    cli.run(__name__)

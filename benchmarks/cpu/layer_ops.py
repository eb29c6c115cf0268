"""A layer's elementwise work through the compiled loops (cpu_layer_ops) against transformers' modules, whole steps.

Steps of the default model through the torch backend, the two ways alternated rep
by rep in one process (sets FusedDecoder.c_layer_ops); medians and the paired
median of the ratios; the logits of each step compared.

    python -m benchmarks.cpu.layer_ops [--dtype bfloat16] [--reps 9] [--context 1024]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


from prefillbench.backends.torch.cpu import layer_ops as cpu_layer_ops
from prefillbench.step import DecodeToken, PrefillChunk, Step

from benchmarks.lib import cli
from benchmarks.lib.both_ways import add_both_ways_arguments, compare_switch, switch_backend


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_both_ways_arguments(parser, "positions each decode attends to; the chunk's offset")


def main(args: argparse.Namespace) -> None:
    # decode_plan=False: the plan runs decode-only steps through the compiled loops whatever c_layer_ops says
    backend = switch_backend(args, 16, 520, cpu_layer_ops, "layer kernels are", decode_plan=False)
    if backend.fused is None or not backend.fused.c_layer_ops:
        sys.exit("this model's layers do not take the compiled loops")
    rng = np.random.default_rng(0)

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(0, backend.vocab_size, n))

    def decodes(n: int, first: int = 0) -> tuple[DecodeToken, ...]:
        return tuple(DecodeToken(first + i, 1, args.context) for i in range(n))

    chunk = PrefillChunk(0, tokens(256), args.context, is_last=True)
    steps = {
        "pp512": Step(prefills=(PrefillChunk(0, tokens(512), 0, True),)),
        "chunk 256": Step(prefills=(chunk,)),
        "chunk 256 + 3 decodes": Step(prefills=(chunk,), decodes=decodes(3, first=1)),
        **{f"decode x{n}": Step(decodes=decodes(n)) for n in (1, 4, 16)},
    }

    def switch(compiled: bool) -> None:
        backend.fused.c_layer_ops = compiled

    compare_switch(backend, switch, steps, args, "compiled loops", "torch ops")


if __name__ == "__main__":
    cli.run(__name__)

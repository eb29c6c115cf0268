"""Decode-only steps through cpu_decode_plan (one list of C calls per batch size) against the eager forward.

Steps of the default model through the torch backend, the two ways alternated rep by rep
in one process (sets TorchBackend.decode_plan); medians and the paired median of the
ratios; the logits of each step compared. The eager side is what runs with
PREFILLBENCH_DECODE_PLAN=0: the tuner's kernel per product, the fused layer's torch ops
and C calls one by one.

    python -m benchmarks.cpu.decode_plan [--dtype bfloat16] [--reps 9] [--context 1024]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


from prefillbench.backends.torch.cpu import decode_plan as cpu_decode_plan
from prefillbench.step import DecodeToken, PrefillChunk, Step

from benchmarks.lib import cli
from benchmarks.lib.both_ways import add_both_ways_arguments, compare_switch, switch_backend


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_both_ways_arguments(parser, "positions each decode attends to")


def main(args: argparse.Namespace) -> None:
    sizes = (1, 2, 4, cpu_decode_plan.MAX_BATCH)
    backend = switch_backend(args, max(sizes), 8)
    plan = backend.decode_plan
    if plan is None:
        sys.exit(f"the decode plan is {backend.decode_plan_note}")
    rng = np.random.default_rng(0)
    for slot in range(max(sizes)):  # real K/V to attend to: each slot's prompt prefilled
        prompt = tuple(int(t) for t in rng.integers(0, backend.vocab_size, args.context))
        backend.execute(Step(prefills=(PrefillChunk(slot, prompt, 0, is_last=True),)))
    steps = {f"decode x{n}": Step(decodes=tuple(DecodeToken(i, 1, args.context) for i in range(n))) for n in sizes}

    def switch(planned: bool) -> None:
        backend.decode_plan = plan if planned else None

    compare_switch(backend, switch, steps, args, "plan", "eager")


if __name__ == "__main__":
    cli.run(__name__)

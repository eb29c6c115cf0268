"""Causal prompts attended in query blocks against one SDPA call, through the torch backend (sets QUERY_BLOCKS_FOR).

Whole prompt steps of the default model, the two ways alternated rep by rep in one
process; medians and the paired median of the ratios; the logits of the last
prompt compared.

    python -m benchmarks.torch.query_blocks [--dtype bfloat16] [--tokens 300,512,768] [--reps 11]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from prefillbench.backends.torch.cpu import prefill_attention as cpu_prefill_attention
from prefillbench.backends.torch import attention as torch_attention
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.models import default_model_path
from prefillbench.step import PrefillChunk, Step

from benchmarks.lib import cli
from benchmarks.lib.both_ways import print_both_ways
from benchmarks.lib.timing import Clock, time_both_ways


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--tokens", default="300,512", help="prompt lengths")
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--threads", type=int, default=2)


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    # This compares two ways of calling SDPA: the compiled prefill kernel, which would attend fp32 prompts here, stays out.
    cpu_prefill_attention.applies = lambda *a: False
    lengths = [int(n) for n in args.tokens.split(",")]
    backend = TorchBackend.load(default_model_path(), device="cpu", dtype=args.dtype)
    backend.prepare(1, max(lengths) + 8, max(lengths) + 8)
    rng = np.random.default_rng(0)
    steps = {n: Step(prefills=(PrefillChunk(0, tuple(int(t) for t in rng.integers(0, backend.vocab_size, n)), 0, True),))
             for n in lengths}
    cut_for = torch_attention.QUERY_BLOCKS_FOR

    def run(step: Step, blocks: bool, logits: bool = False):
        torch_attention.QUERY_BLOCKS_FOR = range(1, 1 << 30) if blocks else range(0)
        try:
            return backend.execute(step, return_logits=logits)
        finally:
            torch_attention.QUERY_BLOCKS_FOR = cut_for

    last = steps[lengths[-1]]
    on, off = (run(last, b, logits=True).logits[0] for b in (True, False))
    times = time_both_ways(run, steps, args.reps, Clock(torch.device("cpu")))
    print(f"# prompt steps, {backend.model_name}, {args.dtype}, {torch.get_num_threads()} threads, {args.reps} interleaved reps, "
          f"query blocks of {torch_attention.QUERY_BLOCK}; pp{lengths[-1]} logits, blocks against one call: max |diff| "
          f"{float(np.abs(on - off).max()):.1e}; the backend cuts prompts of {cut_for.start}-{cut_for.stop - 1} tokens")
    print_both_ways(times, "prompt", "blocks", "one call")


if __name__ == "__main__":
    cli.run(__name__)

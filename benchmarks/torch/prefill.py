"""pp512 at concurrency 1: the PyTorch backend next to a plain transformers forward.

Both run the same model object in the same process, interleaved, so machine
noise hits both alike. Prints a table and the ratio (backend / plain).

    python -m benchmarks.torch.prefill [--model PATH] [--tokens 512] [--reps 5]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.models import default_model_path
from prefillbench.step import PrefillChunk, Step
from prefillbench.bench.workloads import random_prompt

from benchmarks.lib import cli
from benchmarks.lib.timing import Clock, time_interleaved


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)


def main(args: argparse.Namespace) -> None:

    backend = TorchBackend.load(args.model or default_model_path(), device="cpu", threads=args.threads)
    prompt = random_prompt(np.random.default_rng(0), args.tokens, backend.vocab_size)
    ids = torch.tensor([prompt])
    model = backend.model

    def ours() -> None:
        backend.prepare(1, args.tokens, args.tokens)
        backend.execute(Step(prefills=(PrefillChunk(0, prompt, 0, True),)))
        backend.release(0)

    @torch.inference_mode()
    def plain(logits_to_keep: int, use_cache: bool = False) -> None:
        # The stock model as transformers runs it: SDPA attention.
        model.config._attn_implementation = "sdpa"
        try:
            model(input_ids=ids, use_cache=use_cache, logits_to_keep=logits_to_keep)
        finally:
            model.config._attn_implementation = "prefillbench"

    contenders = {
        "prefillbench torch backend": ours,
        # Like ours, this one stores the prompt's K/V for the decode steps to come.
        "transformers forward with its KV cache, last logits only": lambda: plain(1, use_cache=True),
        "transformers forward, no cache, last logits only": lambda: plain(1),
        "transformers forward, no cache, all logits": lambda: plain(0),
    }
    times = time_interleaved(contenders, args.reps, Clock(torch.device("cpu")))

    print(f"pp{args.tokens}, concurrency 1, {backend.model_name}, {backend.weights}, {torch.get_num_threads()} threads, {args.reps} interleaved reps")
    print("| contender | median s | t/s | vs backend |")
    print("| --- | ---: | ---: | ---: |")
    base = times["prefillbench torch backend"].median
    for name, timing in times.items():
        med = timing.median
        print(f"| {name} | {med:.3f} | {args.tokens / med:.1f} | {med / base:.2f}x |")


if __name__ == "__main__":
    cli.run(__name__)

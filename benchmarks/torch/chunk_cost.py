"""A prompt as one step against the same prompt as chunks at their offsets, through the torch backend.

What a chunked schedule's prompt work costs against sequential's, on the default
model: the two alternated rep by rep in one process; medians, and each chunk's
own median (a chunk at offset p attends to p + its length positions).

    python -m benchmarks.torch.chunk_cost [--tokens 1024] [--chunk 256] [--reps 7] [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.models import default_model_path
from prefillbench.step import PrefillChunk, Step

from benchmarks.lib import cli
from benchmarks.lib.timing import Clock, time_interleaved


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--threads", type=int, default=2)


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    backend = TorchBackend.load(default_model_path(), device="cpu", dtype=args.dtype)
    backend.prepare(2, args.tokens + 8, 2 * (args.tokens + 8))
    rng = np.random.default_rng(0)
    tokens = tuple(int(t) for t in rng.integers(0, backend.vocab_size, args.tokens))
    whole = Step(prefills=(PrefillChunk(0, tokens, 0, True),))
    starts = range(0, args.tokens, args.chunk)
    chunks = [Step(prefills=(PrefillChunk(1, tokens[s : s + args.chunk], s, s + args.chunk >= args.tokens),)) for s in starts]
    per_chunk: list[list[float]] = [[] for _ in chunks]

    def run_chunks() -> None:
        for seconds, step in zip(per_chunk, chunks):
            t0 = time.perf_counter()
            backend.execute(step)
            seconds.append(time.perf_counter() - t0)

    times = time_interleaved({"whole": lambda: backend.execute(whole), "chunks": run_chunks}, args.reps, Clock(torch.device("cpu")))
    w, c = times["whole"].median, times["chunks"].median
    print(f"# {backend.model_name}, {args.dtype}, {torch.get_num_threads()} threads, {args.reps} interleaved reps")
    print(f"pp{args.tokens} as one step: {w * 1e3:.0f} ms; as {len(chunks)} chunks of {args.chunk}: {c * 1e3:.0f} ms, "
          f"{c / w:.3f}x (paired median {times['chunks'].paired_ratio(times['whole']):.3f})")
    print("each chunk, by offset: " + ", ".join(f"{s}: {statistics.median(v[1:]) * 1e3:.0f} ms" for s, v in zip(starts, per_chunk)))


if __name__ == "__main__":
    cli.run(__name__)

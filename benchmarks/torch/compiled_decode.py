"""--compile against eager: decode-only steps of the default model, one process, interleaved.

Prefills `m` sequences of P tokens, then times 21 decode steps of each backend in turn and
prints the largest logit difference. The compile (two graphs) is timed in prepare().

    python -m benchmarks.torch.compiled_decode 32 1,4   (prompt length, batch sizes)
"""
from __future__ import annotations

import argparse
import time

import torch

from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.models import default_model_path
from prefillbench.step import DecodeToken, PrefillChunk, Step

from benchmarks.lib import cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", type=int, help="prompt length P")
    parser.add_argument("batches", help="decode batch sizes, a comma list")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=21, help="decode steps timed per backend and batch size")


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    prompt, batches = args.prompt, [int(b) for b in args.batches.split(",")]
    eager = TorchBackend.load(default_model_path(), device="cpu", dtype="float32", threads=args.threads)
    comp = TorchBackend.load(default_model_path(), device="cpu", dtype="float32", threads=args.threads, compile_decode=True)
    t = time.time()
    eager.prepare(max(batches), prompt + 64, 2048)
    comp.prepare(max(batches), prompt + 64, 2048)
    print("prepare (compile)", round(time.time() - t, 1), "s", comp.metadata().get("compile"))
    for m in batches:
        seqs = list(range(100 * m, 100 * m + m))
        for b in (eager, comp):
            for s in seqs:
                b.execute(Step(prefills=(PrefillChunk(s, tuple(range(1, prompt + 1)), 0, True),)))
        pos = prompt

        def step(b: TorchBackend):
            return b.execute(Step(decodes=tuple(DecodeToken(s, 7, pos) for s in seqs)), return_logits=True)

        ra, rb = step(eager), step(comp)
        pos += 1
        err = max(abs(ra.logits[s] - rb.logits[s]).max() for s in seqs)
        te, tc = [], []
        for _ in range(args.steps):
            t = time.perf_counter()
            step(eager)
            te.append(time.perf_counter() - t)
            t = time.perf_counter()
            step(comp)
            tc.append(time.perf_counter() - t)
            pos += 1
        te.sort()
        tc.sort()
        mid = len(te) // 2
        print(f"M={m} pos {prompt}: err {err:.2e} eager {te[mid] * 1e3:.1f} ms compiled {tc[mid] * 1e3:.1f} ms -> "
              f"{m / tc[mid]:.0f} t/s, ratio {te[mid] / tc[mid]:.2f}", flush=True)
        for s in seqs:
            eager.release(s)
            comp.release(s)


if __name__ == "__main__":
    cli.run(__name__)

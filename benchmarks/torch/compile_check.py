"""Does torch.compile pay for a CPU decode step? Stock transformers, StaticCache, fp32, the default model.

    python -m benchmarks.torch.compile_check [--threads 2]
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch

from prefillbench.models import default_model_path

from benchmarks.lib import cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=2)


def main(args: argparse.Namespace) -> None:
    from transformers import AutoModelForCausalLM, StaticCache

    torch.set_num_threads(args.threads)
    p = Path(default_model_path())
    model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32).eval()
    cache = StaticCache(config=model.config, max_cache_len=64)
    ids = torch.tensor([[1, 2, 3, 4]])

    @torch.inference_mode()
    def prefill():
        cache.reset()
        return model(input_ids=ids, cache=cache, use_cache=True, cache_position=torch.arange(4)).logits

    def step(fwd: Callable, pos: int):
        return fwd(input_ids=torch.tensor([[5]]), cache=cache, use_cache=True, cache_position=torch.tensor([pos])).logits

    def bench(fwd: Callable, label: str) -> None:
        with torch.inference_mode():
            prefill()
            t0 = time.perf_counter()
            step(fwd, 4)
            first = time.perf_counter() - t0
            ts = []
            for pos in range(5, 40):
                t = time.perf_counter()
                step(fwd, pos)
                ts.append(time.perf_counter() - t)
        ts.sort()
        print(f"{label}: first call {first:.1f} s, median step {ts[len(ts) // 2] * 1e3:.1f} ms, min {ts[0] * 1e3:.1f} ms", flush=True)

    bench(model.forward, "eager")
    t0 = time.perf_counter()
    compiled = torch.compile(model.forward, dynamic=False)
    bench(compiled, "compiled")
    print(f"total compile+bench {time.perf_counter() - t0:.0f} s")
    bench(model.forward, "eager again")


if __name__ == "__main__":
    cli.run(__name__)

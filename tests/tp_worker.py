"""One tensor-parallel rank for the distributed tests: run under torchrun, write what it computed.

    torchrun --nproc-per-node 2 tests/tp_worker.py MODEL_DIR OUT_DIR

Every rank runs the same cases (strategy, chunk size, concurrency, number of
requests) through the engine with tp = world size, keeping logits, and writes
rank<N>.pt: the tokens and logits of every request, the steps' shapes and its
KV cache's shape.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

PROMPT_LENGTHS = (13, 7, 24, 1)  # different lengths in one run, one a single token
N_GEN = 5
#: (strategy, chunk size, concurrency, requests, seconds between arrivals or None): every strategy,
#: chunks that do and do not divide the prompts, a closed loop with more requests than sequences
#: in flight, and an open loop (arrivals on the clock; 0: no cap on the sequences in flight).
CASES = [
    ("sequential", 256, 2, 4, None),
    ("padded", 256, 4, 4, None),
    ("chunked", 4, 4, 4, None),
    ("chunked", 5, 3, 4, None),
    ("chunked", 32, 2, 4, None),
    ("chunked", 5, 3, 7, None),
    ("chunked", 5, 0, 4, 0.02),
]


def make_requests(n: int, seed: int = 1, arrival_gap_s: float | None = None):
    from prefillbench.sequence import Request

    rng = np.random.default_rng(seed)
    return [Request(tuple(int(t) for t in rng.integers(0, 512, size=PROMPT_LENGTHS[i % 4])), N_GEN,
                    None if arrival_gap_s is None else i * arrival_gap_s) for i in range(n)]


def run_cases(backend) -> list[dict]:
    """Each case's requests (tokens, logits) and steps (prefill chunks, decodes)."""
    from prefillbench import engine
    from strategies import make_strategy

    out = []
    for strategy, chunk, concurrency, n, gap in CASES:
        record = engine.run(backend, make_strategy(strategy, chunk), make_requests(n, arrival_gap_s=gap), concurrency,
                            keep_logits=True)
        out.append({
            "requests": [(r.tokens, np.stack(r.logits)) for r in record.requests],
            "token_times": [r.token_times for r in record.requests],
            "steps": [(s.prefill_chunks, s.decode_contexts) for s in record.steps],
        })
    return out


def main(model_dir: str, out_dir: str) -> None:
    import torch

    from prefillbench.backends import load_backend

    backend = load_backend("torch", model_dir, device="cpu", tp=int(os.environ["WORLD_SIZE"]))
    results = run_cases(backend)
    torch.save(
        {"cases": results, "kv_cache_shape": tuple(backend.cache.keys[0].shape), "metadata": backend.metadata(),
         "label": backend.label},
        Path(out_dir) / f"rank{backend.parallel.rank}.pt",
    )
    backend.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])

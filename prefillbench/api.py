"""The Python API: greedy generation through any strategy on any backend."""
from __future__ import annotations

from collections.abc import Sequence

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends import load_backend
from prefillbench.backends.base import Backend
from prefillbench.sequence import Request


def generate(
    prompts: Sequence[Sequence[int]],
    *,
    model: str | Backend | None = None,
    backend: str = "torch",
    strategy: str = "chunked",
    chunk_size: int = 256,
    concurrency: int | None = None,
    max_new_tokens: int = 16,
    device: str = "auto",
    dtype: str = "float32",
    kernels: str = "auto",
) -> list[list[int]]:
    """Greedy tokens for each prompt (a list of token ids), run through `strategy` on `backend`.

    `model` may also be an already loaded Backend, which is reused as it is. `kernels` (torch): "auto",
    the C kernels where they win; "torch", plain torch only.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    runner = model if isinstance(model, Backend) else load_backend(backend, model, device=device, dtype=dtype,
                                                                       **({} if kernels == "auto" else {"kernels": kernels}))
    requests = [Request(tuple(int(t) for t in p), max_new_tokens) for p in prompts]
    record = engine.run(runner, make_strategy(strategy, chunk_size), requests, concurrency or len(requests))
    return [r.tokens for r in record.requests]

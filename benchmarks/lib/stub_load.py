"""What the client's benchmarks send and to what: the project's stub server (prefillbench.backends.server.stub: tokens
streamed at a set pace, nothing scheduled), started for the benchmark and stopped with it, and a seeded Poisson open
loop for it."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from prefillbench.backends.server.process import ServerProcess, free_port
from prefillbench.sequence import Request


@contextmanager
def stub_server(token_ms: float) -> Iterator[str]:
    """The stub on a free port, pacing `token_ms` between a request's tokens; yields its URL."""
    port = free_port()
    server = ServerProcess([sys.executable, "-m", "prefillbench.backends.server.stub", "--port", str(port),
                            "--token-ms", str(token_ms)], f"http://127.0.0.1:{port}/health")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def open_loop(n: int, rate: float, prompt: int, tokens: int, seed: int = 7) -> list[Request]:
    """`n` requests of `prompt` tokens (distinct prompts: no prefix cache helps) asking `tokens` each, arriving as a
    Poisson process at `rate` a second from 0."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    arrivals = np.cumsum(gaps) - gaps[0]
    return [Request(tuple(range(i % 1000, i % 1000 + prompt)), tokens, float(t)) for i, t in enumerate(arrivals)]

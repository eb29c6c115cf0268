"""No request's recompute is priced above its uncached tokens (issue 70's target): with the engine's prefix cache
(vLLM's block cache, with or without a host tier below; SGLang's radix tree), the prompt tokens the steps carry, and
so the sim prices, are exactly each request's uncached prompt, the tokens its preemptions lost and found nowhere
(`recomputed`), and one token a preemption: the token it had sampled but not yet computed, now its prompt's last."""
from __future__ import annotations

import random

import pytest

from prefillbench import engine
from prefillbench.backends.prefix import PrefixSettings
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.sequence import Request
from strategies import make_strategy


def shared_prompt_requests(n=60, seed=3):
    """A 600-token system prompt, then 50-900 tokens of each request's own, 20-300 out, arriving 20 ms apart: under a
    3,000-token cache they preempt one another."""
    rng = random.Random(seed)
    system = tuple(rng.randrange(1000, 30000) for _ in range(600))
    return [Request(system + tuple(rng.randrange(1000, 30000) for _ in range(rng.randrange(50, 900))),
                    rng.randrange(20, 300), arrival_s=0.02 * i) for i in range(n)]


@pytest.mark.parametrize("strategy, host_gib", [("vllm-v1", None), ("vllm-v1", 1.0), ("sglang", None),
                                                ("sglang-mixed", None)])
def test_the_prompt_tokens_priced_are_the_uncached_ones_and_what_preemptions_lost(strategy, host_gib):
    backend = SimBackend(load_model_spec("mistral-7b"), load_gpu_spec("a100"), prefix=PrefixSettings(True, 16))
    backend.kv_cache_tokens = 3000
    backend.kv_host_gib = host_gib
    run = engine.run(backend, make_strategy(strategy, 512), shared_prompt_requests(), 0)
    reqs = run.requests
    preemptions = sum(r.preemptions for r in reqs)
    assert preemptions > 0 and sum(r.found_again for r in reqs) > 0  # the case bites: memory binds and caches help
    assert sum(r.cached_tokens for r in reqs) >= 600 * (len(reqs) - 1) // 2  # the system prompt is shared
    carried = sum(n for step in run.steps for _, n in step.prefill_chunks)
    uncached = sum(r.prompt_len - r.cached_tokens for r in reqs)
    assert carried == uncached + sum(r.recomputed for r in reqs) + preemptions

"""The prefix cache: blocks shared exactly when everything before them is, entries evicted least recently used
first without losing the blocks another entry shares, the hit rate a workload implies, and the sim running it:
prompts resume where the cache ends, budgets count only computed tokens, a prompt that waited finds what was
computed meanwhile."""
from __future__ import annotations

import pytest

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.prefix_cache import PrefixCache, block_hashes, implied_hits
from prefillbench.sequence import Request


def chain(tokens, block=2):
    return block_hashes(tuple(tokens), block)


def test_a_block_is_shared_only_with_everything_before_it():
    cache = PrefixCache(2)
    cache.insert(chain([1, 2, 3, 4, 5, 6]))
    assert cache.match(chain([1, 2, 3, 4, 9, 9]))[0] == 2
    assert cache.match(chain([1, 2, 7, 7, 5, 6]))[0] == 1  # blocks 3 = (5, 6) after another prefix is not cached
    assert cache.match(chain([9, 2, 3, 4]))[0] == 0
    assert cache.match(chain([1, 2, 3, 4, 5, 6]), limit=2)[0] == 2


def test_an_extended_entry_is_dropped_and_its_blocks_stay_with_the_longer_one():
    cache = PrefixCache(2)
    first = cache.insert(chain([1, 2, 3, 4]))
    longer = cache.insert(chain([1, 2, 3, 4, 5, 6]))
    assert longer.dropped == (first.entry,) and len(cache) == 3
    assert cache.match(chain([1, 2, 3, 4]))== (2, longer.entry)


def test_eviction_takes_the_least_recently_used_entry_and_keeps_shared_blocks():
    cache = PrefixCache(2, capacity=4)
    a = cache.insert(chain([1, 2, 3, 4]))  # blocks a0 a1
    b = cache.insert(chain([1, 2, 7, 8]))  # shares a0; adds b1
    cache.match(chain([1, 2, 3, 4]))  # a is used: b is now the least recent
    c = cache.insert(chain([5, 6, 9, 9]))  # 2 more blocks: 5 > 4, so b goes, and only its own block
    assert c.dropped == (b.entry,) and len(cache) == 4 and cache.evicted_blocks == 1
    assert cache.match(chain([1, 2, 3, 4])) == (2, a.entry)
    assert cache.match(chain([1, 2, 7, 8]))[0] == 1  # its first block, a's too, is still there


def test_the_implied_hit_rate_counts_earlier_prompts_blocks_and_never_the_last_token():
    prompts = [(1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 5, 6, 7, 8)]
    # the second finds one block (its last token, in block 2, is computed), the third one block (1, 2)
    assert implied_hits(prompts, 2) == (2 + 2, 14)


def _shared_requests(n=6, shared=256, own=64, gen=4):
    system = tuple(range(1000, 1000 + shared))
    return [Request(system + tuple(range(5000 + 100 * i, 5000 + 100 * i + own)), gen) for i in range(n)]


def _sim(prefix_cache="on", block=16):
    return SimBackend.load("llama-13b", "a100", prefix_cache=prefix_cache, prefix_block=block)


def test_on_the_sim_a_prompt_resumes_where_the_cache_ends_and_computes_only_the_rest():
    reqs = _shared_requests()
    backend = _sim()
    run = engine.run(backend, make_strategy("sequential"), reqs, 1)
    cached = [r.cached_tokens for r in run.requests]
    assert cached == [0] + [256] * 5  # the 256-token system prompt is 16 whole blocks
    computed = sum(n for step in run.steps for _, n in step.prefill_chunks)
    assert computed == sum(len(r.prompt) for r in reqs) - sum(cached)
    assert sum(step.cached for step in run.steps) == sum(cached)
    # every later prompt's first chunk starts at its cached length
    assert sorted({start for step in run.steps for start, _ in step.prefill_chunks}) == [0, 256]
    off = engine.run(_sim("off"), make_strategy("sequential"), reqs, 1)
    assert [r.cached_tokens for r in off.requests] == [None] * 6
    assert [r.tokens for r in off.requests] == [r.tokens for r in run.requests]  # the same tokens, cache or not
    assert run.wall < off.wall


def test_budgets_count_only_the_tokens_computed():
    reqs = _shared_requests(n=4, shared=512, own=40)
    run = engine.run(_sim(), make_strategy("chunked", 64), reqs, 1)
    lengths = [n for step in run.steps for _, n in step.prefill_chunks]
    assert max(lengths) <= 64
    # the first prompt in 64-token chunks (552 = 8 x 64 + 40), each later one in one 40-token chunk
    assert sum(lengths) == 552 + 3 * 40


def test_a_prompt_that_waited_finds_the_prefix_computed_meanwhile():
    # Both arrive at once; sequential runs the first prompt whole, and the second, admitted with nothing cached,
    # looks again when it starts (vLLM's scheduler does the same) and finds the shared blocks.
    reqs = _shared_requests(n=2)
    run = engine.run(_sim(), make_strategy("sequential"), reqs, 2)
    assert [r.cached_tokens for r in run.requests] == [0, 256]


def test_a_small_cache_evicts_and_hits_less_than_the_workload_implies():
    # Two system prompts alternating, each 64 blocks of 16: a cache of 80 blocks holds one, so each evicts the other.
    from prefillbench.backends.prefix import PrefixSettings
    from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
    a, b = tuple(range(1000, 2024)), tuple(range(3000, 4024))
    reqs = [Request((a if i % 2 == 0 else b) + (9000 + i,), 2) for i in range(6)]

    def cached(capacity):
        backend = SimBackend(load_model_spec("llama-13b"), load_gpu_spec("a100"),
                             prefix=PrefixSettings(True, 16, capacity))
        run = engine.run(backend, make_strategy("sequential"), reqs, 1)
        return [r.cached_tokens for r in run.requests], backend.metadata()

    assert cached(None)[0] == [0, 0, 1024, 1024, 1024, 1024]  # room for both
    small, meta = cached(80 * 16)
    assert small == [0] * 6 and meta["prefix_cache_evicted_blocks"] >= 4 * 64
    assert implied_hits([r.prompt for r in reqs], 16)[0] == 4 * 1024  # what a cache holding both would give

"""KV blocks as a cache, as vLLM V1 holds them with prefix caching on (engine/block_cache.py, read by vllm-v1): full
blocks named by chained hashes, shared by reference count, freed blocks kept with their hash and handed out again
least recently freed first, a request's blocks freed tail first, its last token always computed; and the engine
running vllm-v1 on it (hits decided by the memory, preempted requests finding their own blocks again)."""
from __future__ import annotations

import random

from prefillbench import engine
from prefillbench.backends.prefix import PrefixSettings
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.engine.block_cache import BlockCache
from prefillbench.engine.memory import KVMemory
from prefillbench.sequence import Request, Sequence
from strategies import make_strategy


def seq(i: int, prompt) -> Sequence:
    return Sequence(i, tuple(prompt), 4, 0.0)


SHARED = tuple(range(100, 148))  # three blocks of 16


def test_a_shared_prefix_is_held_once_and_each_sequence_computes_only_past_it():
    m = KVMemory(10 * 16, 16).cached()
    a, b = seq(0, SHARED + (1, 2, 3)), seq(1, SHARED + (4, 5, 6, 7))
    assert m.cache.computed_blocks(a) == []
    assert m.allocate(a, 0, len(a.prompt))
    assert m.held_blocks(0) == 4 and m.free_blocks == 6
    hit = m.cache.computed_blocks(b)
    assert len(hit) == 3  # the three full blocks; a's partial fourth is never cached
    assert m.allocate(b, 0, len(b.prompt) - 48, hit)
    assert m.held_blocks(1) == 4 and m.free_blocks == 5 and m.used == 5  # 3 shared + 1 + 1
    assert [m.cache.ref[x] for x in hit] == [2, 2, 2]
    # freeing one sharer returns only its own block; the shared three stay held
    assert m.free(0) == 1 and m.free_blocks == 6


def test_the_last_token_is_always_computed_even_when_every_block_is_cached():
    m = KVMemory(10 * 16, 16).cached()
    a = seq(0, SHARED[:32])
    m.allocate(a, 0, 32)
    b = seq(1, SHARED[:32])  # the same 32 tokens: both blocks cached, but the 32nd token's logits are needed
    assert len(m.cache.computed_blocks(b)) == 1


def test_freed_blocks_keep_their_hash_and_are_evicted_least_recently_freed_first_tail_first():
    m = KVMemory(6 * 16, 16).cached()
    a = seq(0, tuple(range(1000, 1048)))  # 3 full blocks
    b = seq(1, tuple(range(2000, 2048)))
    m.allocate(a, 0, 48)
    m.allocate(b, 0, 48)
    m.free(0)  # freed first: evicted first, its tail block before its head
    m.free(1)
    assert m.free_blocks == 6 and m.used == 0
    c = seq(2, tuple(range(3000, 3017)))  # takes 2 blocks: a's last two (its tail first), a keeps its first block
    m.allocate(c, 0, 17)
    assert m.cache.stats.evicted_blocks == 2
    a2, b2 = seq(3, tuple(range(1000, 1048)) + (9,)), seq(4, tuple(range(2000, 2048)) + (9,))
    assert len(m.cache.computed_blocks(a2)) == 1 and len(m.cache.computed_blocks(b2)) == 3
    # a block without a hash (c's partial one) goes back to the queue's head: handed out before any cached block
    m.free(2)
    d = seq(5, tuple(range(4000, 4010)))
    m.allocate(d, 0, 10)
    assert m.cache.stats.evicted_blocks == 2  # the partial block, not a cached one


def test_an_admission_that_does_not_fit_changes_nothing_and_a_free_hit_block_counts_against_the_free_ones():
    m = KVMemory(4 * 16, 16).cached()
    a = seq(0, SHARED)
    m.allocate(a, 0, 48)
    m.free(0)  # its three blocks free, cached
    b = seq(1, SHARED + tuple(range(40)))  # 88 tokens: 6 blocks, 3 of them the free cached ones
    hit = m.cache.computed_blocks(b)
    assert len(hit) == 3 and m.cache.blocks_to_allocate(1, 88, hit) == 6
    assert not m.allocate(b, 0, 40, hit, must_fit=88)  # the whole prompt must fit (full-ISL): 6 > 4
    assert m.free_blocks == 4 and m.held_blocks(1) == 0 and [m.cache.ref[x] for x in hit] == [0, 0, 0]
    assert m.allocate(b, 0, 8, hit)  # its first chunk alone fits: 3 hit + 1 new
    assert m.free_blocks == 0


# ---------------------------------------------------------------- the engine with vllm-v1 on it


def shared_workload(n=80, seed=3):
    rng = random.Random(seed)
    system = tuple(rng.randrange(1000, 30000) for _ in range(600))
    reqs, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(25.0)
        own = tuple(rng.randrange(1000, 30000) for _ in range(rng.randrange(50, 900)))
        reqs.append(Request(system + own, rng.randrange(100, 400), arrival_s=t))
    return reqs


def sim_run(reqs, cache: bool, kv_tokens=9000, step_by_step=False):
    backend = SimBackend(load_model_spec("mistral-7b"), load_gpu_spec("a100"), prefix=PrefixSettings(cache, 16))
    backend.kv_cache_tokens = kv_tokens
    if step_by_step:
        backend.run_decodes = lambda step, most, until: None
    return engine.run(backend, make_strategy("vllm-v1", 512), reqs, 0)


def test_vllm_v1_on_the_block_cache_shares_prefixes_preempts_and_finds_its_own_blocks_again():
    reqs = shared_workload()
    run = sim_run(reqs, True)
    cache = run.kv_cache
    assert all(r.tokens == o.tokens for r, o in zip(run.requests, sim_run(reqs, False, kv_tokens=None).requests))
    assert [len(r.tokens) for r in run.requests] == [q.n_gen for q in reqs]
    preempted = sum(r.preemptions for r in run.requests)
    assert preempted > 0 and cache.preempted_requests == preempted and cache.evicted_blocks > 0
    # a resumed request finds its own blocks again (most of them: its prefix is freed last), and recomputes the rest
    found = sum(r.found_again for r in run.requests)
    assert found == cache.preempted_hits > 0
    # the rows' prefix hits are the cache's first lookups, vLLM's vllm:prefix_cache_hits / _queries
    assert sum(r.cached_tokens for r in run.requests) == cache.hits
    assert cache.queries == sum(len(q.prompt) for q in reqs)
    # every request after the first finds the system prompt's 37 full blocks: running requests hold them
    assert all(r.cached_tokens >= 592 for r in run.requests[1:])
    # what a resumed request recomputes is what it lost less what it found: never negative, never all of it here
    assert all(r.recomputed >= 0 for r in run.requests)
    assert sum(r.recomputed for r in run.requests) < cache.preempted_queries - cache.preempted_hits
    # a chunk starts past its cached prefix (the sim prices none of the hit): first chunks start at a block's end
    assert sum(1 for s in run.steps for start, _ in s.prefill_chunks if start >= 592) >= len(reqs) - 1


def test_shared_blocks_counted_once_let_more_requests_run_than_a_copy_into_each():
    reqs = shared_workload()
    shared = sim_run(reqs, True)
    copied = sim_run(reqs, False)  # no cache: each request holds its whole prefix
    most = lambda run: max(len(s.decode_contexts) + len(s.prefill_chunks) for s in run.steps)
    assert most(shared) > most(copied)
    # more admitted, so more preempted as they grow, but each resumed one finds most of itself again: less recomputed,
    # and the whole trace served sooner
    assert sum(r.recomputed for r in shared.requests) < sum(r.recomputed for r in copied.requests)
    assert shared.end - shared.start < copied.end - copied.start


def test_decode_runs_on_the_block_cache_record_what_stepping_alone_does():
    reqs = shared_workload(50)
    runs, alone = sim_run(reqs, True), sim_run(reqs, True, step_by_step=True)
    assert sum(r.preemptions for r in alone.requests) > 0
    assert [(s.start, s.end, s.prefill_chunks, s.decode_contexts, s.preempted) for s in runs.steps] == [
        (s.start, s.end, s.prefill_chunks, s.decode_contexts, s.preempted) for s in alone.steps]
    assert runs.kv_cache == alone.kv_cache


def test_without_pressure_the_cache_changes_which_tokens_are_computed_not_the_order():
    reqs = shared_workload(30)
    run = sim_run(reqs, True, kv_tokens=10**6)
    assert sum(r.preemptions for r in run.requests) == 0 and run.kv_cache.evicted_blocks == 0
    assert all(r.cached_tokens >= 592 for r in run.requests[1:])  # the system prompt's 37 blocks, from the second on


def test_block_cache_stands_alone():
    c = BlockCache(3, 16)
    assert c.num_free == 3 and 0 not in c.free_queue  # block 0 is vLLM's null block

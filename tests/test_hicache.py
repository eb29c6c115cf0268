"""SGLang's HiCache below the radix cache (engine/hicache.py): each write policy's writes, the demotion of a written
node and the dropping of an unwritten one, host eviction least recently used first (write_back reclaiming duplicates
first), load back whole or not at all; and the sim's sglang strategies loading second turns from the host, the loads
priced over the card's PCIe link. tests/test_hicache_reference.py holds the same rules against SGLang's own cache."""
from __future__ import annotations


import pytest

from prefillbench import engine
from prefillbench.backends.prefix import PrefixSettings
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.engine.hicache import (LOAD_BACK_THRESHOLD, WRITE_BACK, WRITE_THROUGH, WRITE_THROUGH_SELECTIVE,
                                         HiRadixCache)
from strategies import make_strategy
from test_host_tier import sessions  # each session a 640-token prompt, its second turn resending it long after


class Seq:
    """The parts of a Sequence the cache reads."""

    def __init__(self, seq_id: int, prompt, generated=()) -> None:
        self.seq_id, self.prompt, self.generated, self.earlier = seq_id, tuple(prompt), list(generated), 0

    @property
    def request_prompt_len(self) -> int:
        return len(self.prompt) - self.earlier


def put(c: HiRadixCache, tokens, inserted: int = 0) -> None:
    """A request's tokens computed into fresh slots and put in the tree (its duplicates freed)."""
    tokens = tuple(tokens)
    c.alloc(len(tokens))
    c.available += c.insert(tokens, inserted)


def where(c: HiRadixCache, tokens) -> tuple[int, int]:
    """(GPU prefix, host hit) of a lookup of `tokens`."""
    rec = c.request(Seq(999, tokens))
    gpu = c.match(rec.seq)
    host = c.host_hit(999)
    c.reqs.pop(999)
    return gpu, host


A, B, C = tuple(range(100, 112)), tuple(range(200, 212)), tuple(range(300, 312))


def test_write_through_writes_as_it_inserts_and_an_evicted_written_node_stays_on_the_host():
    c = HiRadixCache(40, 100, WRITE_THROUGH)
    put(c, A)
    # written at once, locked on the GPU until the next pass acknowledges the write
    assert (c.host_available, c.protected_size, c.evictable_size) == (88, 12, 0)
    assert c.evict(12) == 0
    c.events()
    assert (c.protected_size, c.evictable_size) == (0, 12)
    assert c.evict(1) == 12 and c.available == 40  # demoted whole: its slots freed, the node kept host-only
    assert where(c, A + (1,)) == (0, 12) and c.hi.written_tokens == 12 and c.hi.demoted_tokens == 12


def test_write_back_writes_only_what_the_gpu_evicts():
    c = HiRadixCache(40, 100, WRITE_BACK)
    put(c, A)
    assert (c.host_available, c.evictable_size, c.hi.written_tokens) == (100, 12, 0)
    assert c.evict(1) == 12
    assert c.host_available == 88 and where(c, A + (1,)) == (0, 12)


def test_write_through_selective_writes_a_node_on_its_second_hit_and_drops_an_unwritten_one():
    c = HiRadixCache(40, 100, WRITE_THROUGH_SELECTIVE)
    put(c, A)
    assert c.host_available == 100
    c.evict(12)  # never written: dropped from the tree, nothing left to find
    assert where(c, A + (1,)) == (0, 0) and c.available == 40
    put(c, A)
    put(c, A)  # a second request's insert: the node's second hit writes it
    assert c.host_available == 88
    # the same request inserting again counts no hit past what it inserted before (cache_inserted_len)
    d = HiRadixCache(40, 100, WRITE_THROUGH_SELECTIVE)
    put(d, A)
    put(d, A, inserted=len(A))
    assert d.host_available == 100


def test_the_host_evicts_its_least_recently_used_leaf_as_a_write_falls_short():
    c = HiRadixCache(40, 24, WRITE_THROUGH)
    put(c, A)
    put(c, B)
    c.events()
    assert c.evict(24) == 24 and c.host_available == 0
    where(c, A + (1,))  # A touched: B is now the least recently used on the host
    put(c, C)  # its write needs 12 host tokens: B's copy goes
    assert where(c, B + (1,)) == (0, 0) and where(c, A + (1,)) == (0, 12)
    assert c.hi.host_evicted_tokens == 12 and c.host_available == 0


def test_a_host_hit_is_loaded_whole_locked_until_its_ack_and_a_short_one_is_computed_again():
    c = HiRadixCache(40, 100, WRITE_THROUGH, load_seconds=lambda n: 1e-3 * n)
    put(c, A)
    c.events()
    c.evict(12)
    rec = c.request(Seq(1, A + (1, 2)))
    assert c.match(rec.seq) == 0 and c.host_hit(1) == 12
    assert c.load_back(rec) == 12
    assert (rec.prefix_len, c.available, c.protected_size) == (12, 28, 12) and rec.last_node.key == A
    assert c.hi.loads == 1 and c.hi.load_seconds == pytest.approx(12e-3)
    assert where(c, A + (1,)) == (12, 0)  # back on the GPU, its host copy kept
    assert c.host_available == 88
    # below the threshold: found on the host, computed again
    short = tuple(range(500, 500 + LOAD_BACK_THRESHOLD - 1))
    d = HiRadixCache(40, 100, WRITE_THROUGH)
    put(d, short)
    d.events()
    d.evict(1)
    rec = d.request(Seq(2, short + (1,)))
    d.match(rec.seq)
    assert d.host_hit(2) == LOAD_BACK_THRESHOLD - 1
    assert d.load_back(rec) == 0 and d.hi.recomputed_tokens == LOAD_BACK_THRESHOLD - 1 and d.available == 40


def test_a_load_evicts_the_gpus_least_recently_used_leaves_for_its_slots_or_is_not_done():
    c = HiRadixCache(24, 100, WRITE_THROUGH)
    put(c, A)
    c.events()
    c.evict(12)
    put(c, B)
    put(c, C)
    c.events()
    assert c.available == 0
    rec = c.request(Seq(1, A + (1,)))
    c.match(rec.seq)
    assert c.load_back(rec) == 12 and where(c, B + (1,)) == (0, 12)  # B, the older, demoted for A's slots
    # with every GPU token locked there is no room: nothing loaded, the request computes its prompt
    d = HiRadixCache(24, 100, WRITE_THROUGH)
    put(d, A)
    d.events()
    d.evict(12)
    put(d, B)
    put(d, C)  # their writes' locks not yet acknowledged: nothing evictable
    rec = d.request(Seq(1, A + (1,)))
    d.match(rec.seq)
    assert d.load_back(rec) == 0 and d.available == 0 and d.hi.recomputed_tokens == 12


def test_write_back_reclaims_a_duplicate_host_copy_before_evicting_a_host_only_node():
    c = HiRadixCache(40, 24, WRITE_BACK)
    put(c, A)
    c.evict(12)
    put(c, B)
    c.evict(12)  # host full: A and B host-only
    rec = c.request(Seq(1, A + (1,)))
    c.match(rec.seq)
    assert c.load_back(rec) == 12
    c.lock(rec)  # the admitted request's lock, on the loaded node
    c.events()  # A on both tiers now: a duplicate
    put(c, C)
    assert c.evict(12) == 12  # C (A is locked) written back: 12 host tokens needed, A's host copy gives them
    assert where(c, B + (1,)) == (0, 12) and where(c, C + (1,)) == (0, 12)
    assert not rec.last_node.backuped and c.host_available == 0


def sim_run(reqs, strategy: str, host_gib=None):
    backend = SimBackend(load_model_spec("mistral-7b"), load_gpu_spec("a100"), prefix=PrefixSettings(True, 1))
    backend.kv_cache_tokens = 4000
    backend.kv_host_gib = host_gib
    return engine.run(backend, make_strategy(strategy, 512), reqs, 0)


@pytest.mark.parametrize("strategy", ["sglang", "sglang-mixed"])
def test_second_turns_load_their_history_from_the_host_where_the_gpu_lost_it(strategy):
    reqs = sessions()
    plain, hosted = sim_run(reqs, strategy), sim_run(reqs, strategy, host_gib=4)
    host = hosted.kv_cache.host
    later = slice(len(reqs) // 2, None)
    assert plain.kv_cache.host is None
    # without a tier the GPU lost most first turns' tokens; with one, each second turn finds its 640 on one tier
    assert sum(r.cached_tokens for r in plain.requests[later]) < 640 * 12
    assert all(r.cached_tokens >= 640 for r in hosted.requests[later])
    assert host.loaded_tokens >= 640 * 12 and host.loads >= 12
    # the loads' time: their tokens over the A100's PCIe 4.0 (linear, so the sum of the loads), added to the steps
    assert host.load_seconds == pytest.approx(host.loaded_tokens * 131072 / 32e9, rel=1e-9)
    ttft = lambda run: sorted(r.token_times[0] - r.arrival for r in run.requests[later])[len(reqs) // 4]
    assert ttft(hosted) < ttft(plain)
    # where a prefix comes from never changes what is generated
    assert [r.tokens for r in hosted.requests] == [r.tokens for r in plain.requests]

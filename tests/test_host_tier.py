"""A host tier below the GPU's KV blocks (engine/host_tier.py, vLLM's OffloadingConnector; the sim's pricing in
backends/sim/host_tier.py): blocks stored as computed, evicted least recently used first; a prefix the GPU lost found
on the host and loaded, or recomputed where that is priced cheaper; the load's time over the card's PCIe slot added
to the step that runs the request's first chunk."""
from __future__ import annotations

import random

import pytest

from prefillbench import engine
from prefillbench.backends.prefix import PrefixSettings
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim import host_tier as sim_host_tier
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.backends.sim.specs import SimConfigError
from prefillbench.engine.host_tier import HostTier
from prefillbench.engine.memory import KVMemory
from prefillbench.sequence import Request, Sequence
from prefillbench.step import PrefillChunk, Step
from strategies import make_strategy


def seq(i: int, prompt) -> Sequence:
    return Sequence(i, tuple(prompt), 4, 0.0)


def test_the_host_evicts_its_least_recently_used_readable_block_as_vllms_cpu_manager_does():
    host = HostTier(2)
    host.store(1)
    host.store(2)
    host.store(1)  # offered again: held already, left as it is (prepare_store touches nothing)
    host.store(3)
    assert list(host.blocks) == [2, 3] and host.stats.evicted_blocks == 1 and host.stats.stored_blocks == 3
    host.finished(0, [2, 9], 0)  # a finished request touches its blocks once the next step is chosen
    host.step_chosen()
    host.store(4)
    assert list(host.blocks) == [2, 4]
    # a store still being written is neither readable nor evictable: a lookup over it is deferred (None) and a
    # store that needs it evicted is skipped whole, to be offered again
    slow = HostTier(2, load_seconds=lambda n: 4.0, store_seconds=2.0)
    slow.store(1)
    assert slow.found([1], 0, 1) is None
    assert slow.store_run([5]) and not slow.store_run([6, 7]) and list(slow.blocks) == [1, 5]
    slow.now = 2.0
    assert slow.found([1, 5], 0, 2) == 2 and slow.store_run([6]) and list(slow.blocks) == [5, 6]
    # a load pins its blocks till it is done: another request's lookup over them is deferred, none is evicted
    slow.start_load(0, 0, 2, 16, [5, 6])
    slow.now = 4.0
    assert slow.found([5, 6], 0, 2) is None and not slow.store_run([8])
    assert not slow.load_done(0) and slow.next_done() == 6.0
    slow.now = 6.0
    assert slow.load_done(0) and slow.next_done() == 6.0  # done, not yet seen by a step: the next one, at once
    slow.loading[0].promoted = True
    assert slow.next_done() is None and slow.store_run([8]) and list(slow.blocks) == [6, 8]
    # one host link: loads issued together cross it one after another (the sim's); not serial, each from its issue
    link = HostTier(8, load_seconds=lambda n: n / 16)
    for h in range(4):
        link.store(h)
    link.now = 1.0
    assert [link.start_load(i, i, 1, 16, range(4)).done for i in range(3)] == [2.0, 3.0, 4.0]
    alone = HostTier(8, load_seconds=lambda n: n / 16, serial=False)
    for h in range(4):
        alone.store(h)
    alone.now = 1.0
    assert [alone.start_load(i, i, 1, 16, range(4)).done for i in range(3)] == [2.0, 2.0, 2.0]


def test_a_run_of_host_blocks_is_loaded_unless_recomputing_it_is_priced_cheaper():
    host = HostTier(10, load_seconds=lambda n: 1e-3 * n, recompute_seconds=lambda start, n: 2e-3 * n)
    for h in (11, 12, 13):
        host.store(h)
    chain = [10, 11, 12, 13, 14]
    assert host.found(chain, 1, 5) == 3 and host.to_load(chain, 1, 5, 16) == 3
    assert host.to_load(chain, 0, 5, 16) == 0  # the run starts at the GPU's end: block 10 is not there
    cheap = HostTier(10, load_seconds=lambda n: 1e-3 * n, recompute_seconds=lambda start, n: 0.5e-3 * n)
    for h in (11, 12, 13):
        cheap.store(h)
    assert cheap.to_load(chain, 1, 5, 16) == 0 and cheap.declined(chain, 1, 5, 16) == 48


def test_a_block_the_gpu_evicted_stays_on_the_host_and_is_found_past_the_gpus_hit():
    m = KVMemory(4 * 16, 16).cached()
    m.cache.host = HostTier(100)
    a = seq(0, range(1000, 1048))  # three full blocks, stored to the host once the step computing them is chosen
    m.allocate(a, 0, 48)
    m.cache.host.step_chosen()
    m.free(0)
    b = seq(1, range(2000, 2064))  # takes all four blocks: a's three evicted from the GPU
    m.allocate(b, 0, 64)
    m.cache.host.step_chosen()
    assert m.cache.stats.evicted_blocks == 3
    again = seq(2, tuple(range(1000, 1048)) + (7,))
    assert m.cache.computed_blocks(again) == []
    assert m.cache.host_blocks(again, 0) == 3
    # a host too small for both: b's four blocks stored after a's pushed a's out (LRU)
    m2 = KVMemory(4 * 16, 16).cached()
    m2.cache.host = HostTier(4)
    m2.allocate(seq(0, range(1000, 1048)), 0, 48)
    m2.cache.host.step_chosen()
    m2.free(0)
    m2.allocate(seq(1, range(2000, 2064)), 0, 64)
    m2.cache.host.step_chosen()
    assert m2.cache.host_blocks(again, 0) == 0 and m2.cache.host.stats.evicted_blocks == 3


def test_the_sim_sizes_the_tier_from_the_models_kv_bytes_and_prices_a_load_over_the_cards_pcie():
    h100 = SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h100", kv_host_cache=1)
    per_token = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16: 131,072 bytes
    assert h100.cost.kv_bytes_per_token_per_gpu() == per_token
    blocks, load, recompute = h100.host_tier(16)
    assert blocks == 1024 ** 3 // (per_token * 16) == 512
    assert load(1000) == pytest.approx(1000 * per_token / 64e9, rel=1e-12)  # PCIe 5.0 x16, 64 GB/s a direction
    a100 = SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="a100", kv_host_cache=1)
    assert a100.host_tier(16)[1](1000) == pytest.approx(1000 * per_token / 32e9, rel=1e-12)  # PCIe 4.0
    # an 8B model's prompt on an H100 computes slower than PCIe 5.0 moves its KV: loading wins
    assert recompute(4096, 1600) > load(1600)
    # TP 2: each GPU holds half of a token's KV, so 1 GiB across both holds as many blocks, loaded twice as fast
    tp2 = SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h100", tp=2, kv_host_cache=1)
    assert tp2.host_tier(16)[0] == 512 and tp2.host_tier(16)[1](1000) == pytest.approx(load(1000) / 2, rel=1e-12)
    assert SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h100").host_tier(16) is None
    for bad in ({"kv_host_cache": 0}, {"kv_host_cache": 1, "pp": 2}):
        with pytest.raises(SimConfigError, match="--kv-host-cache"):
            SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h100", **bad)


def test_a_steps_host_loads_are_added_to_its_time_whole():
    def step_time(loads):
        b = SimBackend(load_model_spec("llama-3.1-8b"), load_gpu_spec("h100"))
        b.prepare(4, 8192, 4096)
        b.execute(Step(prefills=(PrefillChunk(0, tuple(range(512)), 1600, False),), host_loads=loads))
        return b.now()

    assert step_time(((0, 1600),)) - step_time(()) == pytest.approx(1600 * 131072 / 64e9, rel=1e-9)


def sessions(n=24, seed=5):
    """Each session a 640-token prompt of its own, then a second turn holding it whole, long after: by then the
    small GPU cache has handed its blocks to the other sessions."""
    rng = random.Random(seed)
    firsts = [tuple(rng.randrange(1000, 30000) for _ in range(640)) for _ in range(n)]
    reqs = [Request(p, 32, arrival_s=0.05 * i) for i, p in enumerate(firsts)]
    reqs += [Request(p + tuple(rng.randrange(1000, 30000) for _ in range(64)), 32, arrival_s=10.0 + 0.05 * i)
             for i, p in enumerate(firsts)]
    return reqs


def sim_run(reqs, host_gib=None, recompute_cheaper=False):
    backend = SimBackend(load_model_spec("mistral-7b"), load_gpu_spec("a100"), prefix=PrefixSettings(True, 16))
    backend.kv_cache_tokens = 4000
    backend.kv_host_gib = host_gib
    if recompute_cheaper:  # the load-vs-recompute choice, forced the other way
        real = backend.host_tier
        backend.host_tier = lambda size: (real(size)[0], real(size)[1], lambda start, n: 0.0)
    return engine.run(backend, make_strategy("vllm-v1", 512), reqs, 0)


def test_second_turns_load_their_history_from_the_host_where_the_gpu_lost_it():
    reqs = sessions()
    plain, hosted = sim_run(reqs), sim_run(reqs, host_gib=4)
    host = hosted.kv_cache.host
    later = slice(len(reqs) // 2, None)
    # without a tier the GPU lost most first turns' blocks; with one, every second turn finds its 640 tokens
    # (40 full blocks) on the GPU or the host
    assert sum(r.cached_tokens for r in plain.requests[later]) < 640 * 12
    assert all(r.cached_tokens == 640 for r in hosted.requests[later])
    assert host.loaded_tokens > 0 and host.loaded_tokens % 16 == 0 and host.recomputed_tokens == 0
    assert host.loaded_tokens <= sum(r.cached_tokens for r in hosted.requests)  # a row's hits count the host's
    # the load time is the tier's tokens priced over the A100's PCIe 4.0 (linear: the sum of the loads)
    assert host.load_seconds == pytest.approx(host.loaded_tokens * 131072 / 32e9, rel=1e-9)
    ttft = lambda run: sorted(r.token_times[0] - r.arrival for r in run.requests[later])[len(reqs) // 4]
    assert ttft(hosted) < ttft(plain)
    # the same tokens either way: where a prefix comes from never changes what is generated
    assert [r.tokens for r in hosted.requests] == [r.tokens for r in plain.requests]
    # recomputing priced cheaper: the host's blocks found but computed again, none loaded, the plain run's steps
    declined = sim_run(reqs, host_gib=4, recompute_cheaper=True)
    assert declined.kv_cache.host.loaded_tokens == 0 and declined.kv_cache.host.recomputed_tokens > 0
    assert [s.prefill_chunks for s in declined.steps] == [s.prefill_chunks for s in plain.steps]


def test_the_host_link_prices_loads_at_its_rate_and_a_slow_tier_loses_to_recompute():
    per_token = 131072  # Llama-3.1-8B's KV bytes a token (above)
    c2c = SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h100", kv_host_cache=1, kv_host_link="c2c")
    assert c2c.host_tier(16)[1](1000) == pytest.approx(1000 * per_token / 450e9, rel=1e-12)
    assert "loads over NVLink-C2C at 450 GB/s" in sim_host_tier.words(c2c)
    nvme = SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h100", kv_host_cache=1, kv_host_link="2")
    _, load, recompute = nvme.host_tier(16)
    assert load(512) == pytest.approx(512 * per_token / 2e9, rel=1e-12)
    # at 2 GB/s a 512-token run at a prompt's start costs more to load than to compute again (15.6 ms against
    # 33.6: benchmarks.sim.load_vs_recompute), and the tier recomputes it; 32k tokens in, attention makes the
    # recompute dearer than the load
    assert recompute(0, 512) < load(512) < recompute(32768, 512)
    tier = HostTier(64, load, recompute)
    chain = list(range(100, 132))
    for h in chain:
        tier.store(h)
    assert tier.to_load(chain, 0, 32, 16) == 0 and tier.declined(chain, 0, 32, 16) == 512
    assert SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h100", kv_host_link="pcie").kv_host_link is None
    for bad in ("0", "-3", "nvme", "inf"):
        with pytest.raises(SimConfigError, match=f"--kv-host-link {bad}"):
            SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h100", kv_host_cache=1, kv_host_link=bad)


def test_kv_host_link_without_a_tier_is_named_as_ignored(run_cli):
    code, out, err = run_cli("run", "--backend", "sim", "--sim-model", "llama-3.1-8b", "--sim-gpu", "h100", "-p", "64",
                             "-n", "4", "-c", "1", "-r", "1", "--no-progress", "--kv-host-link", "c2c")
    assert code == 0 and "--kv-host-link c2c is ignored without --kv-host-cache (no host tier)" in err

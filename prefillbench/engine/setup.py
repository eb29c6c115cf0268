"""One engine's run set up on a step backend: its KV memory (paged, or whole lengths reserved; vLLM's block cache or
SGLang's radix tree where the engine's own prefix cache decides hits; a host tier below), the drafter, the backend
prepared and the strategy attached; and the admission that feeds it. engine.run sets one engine up, lockstep.py
each data-parallel rank.
"""
from __future__ import annotations

import sys

from strategies import Strategy

from prefillbench.backends.base import BackendError, StepBackend
from prefillbench.engine.admission import Admission, Feed, fit
from prefillbench.engine.drafts import proposer_for
from prefillbench.engine.hicache import DEFAULT_WRITE_POLICY
from prefillbench.engine.host_tier import HostTier
from prefillbench.engine.memory import KVMemory
from prefillbench.sequence import Request
from prefillbench.speculation import SpecConfig


def set_up(backend: StepBackend, strategy: Strategy, reqs: list[Request], asked: int, longest_prompt: int,
           max_seq_len: int, keep_logits: bool) -> tuple[int, KVMemory, bool, object]:
    """One engine's run set up on `backend`: the most sequences in flight, its KV memory, whether that memory is
    the engine's block cache, and the drafter (None: no speculation); the backend prepared, the strategy reset and
    attached. `asked`: the sequences the run asks to hold at once."""
    if strategy.kv_policy == "paged":
        # the strategy admits by free blocks and preempts: every request may wait in its queue, the engine's
        # max_num_seqs (where the backend stands for an engine) caps those running, as vLLM's does
        cap = asked
        memory = KVMemory(backend.kv_capacity_tokens(strategy.max_step_tokens(longest_prompt, cap)),
                          strategy.kv_block_size)
        if memory.total_blocks is not None and memory.blocks_for(max_seq_len) > memory.total_blocks:
            raise BackendError(f"not one sequence of {max_seq_len} tokens fits in {backend.room()} "
                               f"({memory.capacity_tokens:.0f} tokens)")
    else:
        # the whole length reserved as a sequence is admitted (Orca's, FasterTransformer's): at most what fits
        cap = fit(backend, strategy, asked, longest_prompt, max_seq_len)
        memory = KVMemory(backend.kv_capacity_tokens(strategy.max_step_tokens(longest_prompt, cap)), 1)
    spec = strategy.speculation
    proposer = _proposer(backend, spec, keep_logits, reqs) if spec is not None else None
    backend.speculate(spec)
    for line in strategy.speculation_warnings():  # what its engine warns of (vLLM's budget advice), once a process
        if line not in _SAID:
            _SAID.add(line)
            print(f"prefillbench: {line}", file=sys.stderr)
    # Each decode may carry its drafts beside its token: a step's bound grows by K per sequence (a strategy that
    # charges drafts to its budget stays within its own).
    drafts_room = 0 if spec is None else cap * max([spec.k, *(k for _, _, k in spec.k_by_batch)])
    # With a prefix cache, a strategy that reads blocks as its engine caches them (vllm-v1) has the engine's memory
    # decide the hits (engine/block_cache.py: shared blocks counted once), where the backend holds no KV of its own
    # to copy (the sim): it executes the chunks it is given, from past the cached prefix, its own cache not asked.
    engine_cache = (backend.caches_prefixes and backend.shares_kv_blocks and strategy.kv_policy == "paged"
                    and strategy.reads_block_cache and memory.total_blocks is not None and spec is None)
    if engine_cache:
        memory.cached()
    # the SGLang strategies read their engine's radix cache the same way (engine/radix_cache.py: a tree of token runs
    # shared by every request, LRU leaves evicted), its one-token pages the memory's
    radix_cache = (backend.caches_prefixes and backend.shares_kv_blocks and strategy.kv_policy == "paged"
                   and strategy.reads_radix_cache and memory.total_blocks is not None and spec is None)
    if radix_cache:
        memory.radix_cached()
    # a host tier below the cache's blocks (engine/host_tier.py: vLLM's OffloadingConnector), where the backend has one
    terms = backend.host_tier(memory.block_size)
    if terms is not None:
        if memory.cache is not None:
            memory.cache.host = HostTier(*terms)
            memory.cache.stats.host = memory.cache.host.stats
            if backend.hicache_write_policy is not None and "--hicache-write-policy" not in _SAID:
                _SAID.add("--hicache-write-policy")
                print(f"prefillbench: --hicache-write-policy {backend.hicache_write_policy} ignored by vllm-v1: its "
                      "connector stores every block as it is computed", file=sys.stderr)
        elif memory.radix is not None:
            # SGLang's HiCache below its radix cache (engine/hicache.py), one-token pages: the tier's blocks are tokens;
            # its write policy the backend's where it names one (--hicache-write-policy), else SGLang's default
            blocks, load_seconds, _ = terms
            memory.hi_cached(blocks, load_seconds, backend.hicache_write_policy or DEFAULT_WRITE_POLICY)
        elif "--kv-host-cache" not in _SAID:
            _SAID.add("--kv-host-cache")
            print("prefillbench: --kv-host-cache ignored: a host tier sits below vllm-v1's block cache or SGLang's "
                  "radix cache (the sim, --prefix-cache on, -s vllm-v1 or sglang/sglang-mixed, no --spec)",
                  file=sys.stderr)
    backend.kv_shared = engine_cache or memory.radix is not None
    backend.prepare(cap, max_seq_len, strategy.max_step_tokens(longest_prompt, cap) + drafts_room)
    strategy.reset()
    strategy.attach(memory, backend.engine_max_num_seqs, prefix_cache=backend.caches_prefixes)
    return cap, memory, engine_cache, proposer


#: The engines' warnings said already: a grid runs the same configuration many times.
_SAID: set[str] = set()


def _proposer(backend: StepBackend, spec: SpecConfig, keep_logits: bool, reqs: list[Request]):
    """The run's drafter (engine/drafts.py); BackendError where the backend cannot verify the method's drafts."""
    if spec.method not in backend.spec_methods:
        can = ", ".join(backend.spec_methods) or "no speculative decoding"
        raise BackendError(f"{backend.name} cannot run --spec {spec.label}: it runs {can}")
    if keep_logits or any(r.forced_tokens is not None for r in reqs):
        raise ValueError(f"--spec {spec.label} verifies drafts by the model's own greedy tokens: it cannot run "
                         "with forced tokens or kept logits (--verify)")
    return proposer_for(spec, backend.real_tokens, backend.context_length)


def admission_for(backend: StepBackend, strategy: Strategy, memory: KVMemory, reqs: list[Request], open_loop: bool,
                  cap: int, start: float, feed: Feed | None = None) -> Admission:
    """The admission of one engine set up by set_up: the backend's own prefix reuse where the engine's memory does
    not decide hits, and whole lengths reserved where the strategy does not page."""
    return Admission(reqs, open_loop, cap, start=start,
                     reuse=backend.reuse_prefix if backend.caches_prefixes and not backend.kv_shared else None,
                     accept=backend.accept_handoff, feed=feed,
                     reserve=memory if strategy.kv_policy != "paged" else None)


__all__ = ["admission_for", "set_up"]

"""KV blocks as a cache, as vLLM V1 holds them with prefix caching on (vLLM 0.32, one full-attention KV group).

A full block of `block_size` tokens is named by a hash chained over its tokens and every block before it
(`Request.block_hashes`, `kv_cache_utils.hash_block_tokens`): two sequences that share everything up to a block's end
share the block, counted by reference (`KVCacheBlock.ref_cnt`). A block whose last reference goes keeps its hash in
the free queue and is found again by a later hit until it is handed out again, least recently freed first
(`FreeKVCacheBlockQueue`); a request's blocks are freed tail first, so its prefix survives longest. Each rule names the
vLLM function it follows (`v1/core/block_pool.py` BlockPool, `v1/core/kv_cache_manager.py` KVCacheManager,
`v1/core/single_type_kv_cache_manager.py` SingleTypeKVCacheManager / FullAttentionManager).

Block ids are kept as vLLM numbers them (its block 0, the null block, is never handed out: `capacity_blocks` are
the others); which id a sequence gets never changes what is found, only the hashes and the queue's order do.
Nothing here knows of torch, llama.cpp or HTTP.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class CacheStats:
    """vLLM's PrefixCacheStats over a run (v1/metrics/stats.py): a request's first lookup counts in `queries`/`hits`
    (vllm:prefix_cache_queries / _hits), a preempted request's lookups apart (`preempted_*`); `evicted_blocks`: cached
    blocks whose hash was dropped as the block was handed out again (BlockPool._maybe_evict_cached_block)."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    evicted_blocks: int = 0
    #: the host tier's (engine/host_tier.py HostTierStats); None: no host tier. Its loads count in `hits` only as
    #: far as the GPU held them: vLLM counts a connector's hits apart (connector_prefix_cache_stats).
    host: object = None


class BlockCache:
    """The block pool, the free queue (eviction order, head first), the hash -> blocks map and each sequence's
    blocks and hash chain."""

    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        n = capacity_blocks + 1  # block 0 is vLLM's null block (BlockPool.__init__: popped from the queue at once)
        self.ref = [0] * n
        self.block_hash: list[int | None] = [None] * n
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, n))
        #: hash -> the blocks holding it (BlockHashToBlockMap), the first found first
        self.cached: dict[int, dict[int, None]] = {}
        self.req_blocks: dict[int, list[int]] = {}
        self.num_cached: dict[int, int] = {}  # full blocks of a sequence already hashed into the cache
        self.chains: dict[int, list[int]] = {}  # each sequence's full-block hashes so far
        self.seqs: dict[int, object] = {}  # seq_id -> its Sequence (its tokens name its blocks)
        self.stats = CacheStats()
        #: the host tier below (engine/host_tier.py: vLLM's OffloadingConnector); None: none
        self.host = None

    # ---- reading ------------------------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Free blocks, cached ones among them (BlockPool.get_num_free_blocks)."""
        return len(self.free_queue)

    def held(self, seq_id: int) -> int:
        return len(self.req_blocks.get(seq_id, ()))

    def _chain(self, seq, n_blocks: int) -> list[int]:
        """The hashes of `seq`'s first `n_blocks` full blocks (fewer where its tokens fill fewer), extended as it
        grows (vLLM hashes a request's blocks as its tokens come: Request.block_hashes)."""
        chain = self.chains.setdefault(seq.seq_id, [])
        size = self.block_size
        n_blocks = min(n_blocks, seq.n_tokens // size)
        if len(chain) < n_blocks:
            prompt, out, earlier = seq.prompt, seq.generated, seq.earlier
            h = chain[-1] if chain else None
            for i in range(len(chain), n_blocks):
                a, b = i * size, (i + 1) * size
                if b <= len(prompt):
                    tokens = prompt[a:b]
                else:  # past the prompt: its output (a preempted sequence's prompt holds its earlier output already)
                    tokens = prompt[a:] + tuple(out[earlier + max(a - len(prompt), 0):earlier + b - len(prompt)])
                h = hash((h, tokens))
                chain.append(h)
        return chain

    def computed_blocks(self, seq) -> list[int]:
        """The longest run of cached full blocks from the start of `seq`, never its last token (its logits are
        computed again: KVCacheManager.get_computed_blocks, max_cache_hit_length = num_tokens - 1;
        FullAttentionManager.find_longest_cache_hit stops at the first miss)."""
        chain = self._chain(seq, (seq.n_tokens - 1) // self.block_size)
        hit = []
        cached = self.cached
        for h in chain[:(seq.n_tokens - 1) // self.block_size]:
            blocks = cached.get(h)
            if not blocks:
                break
            hit.append(next(iter(blocks)))
        return hit

    def blocks_to_allocate(self, seq_id: int, tokens: int, hit: list[int] = ()) -> int:
        """Blocks `seq_id` takes from the free queue to hold `tokens` tokens in all, given the cached blocks it is
        admitted with (SingleTypeKVCacheManager.get_num_blocks_to_allocate: a hit block that is free still has to
        leave the queue, so it counts)."""
        new = max(-(-tokens // self.block_size) - len(hit) - self.held(seq_id), 0)
        return new + sum(1 for b in hit if self.ref[b] == 0)

    def host_blocks(self, seq, gpu_hit: int) -> int | None:
        """Full blocks of `seq` to load from the host tier past the `gpu_hit` blocks the GPU holds (none without a
        tier), up to its whole tokens (`_lookup_complete_chunks`: max_hit_size_tokens = num_tokens; a load of them
        all leaves its last token to compute, `_update_waiting_for_remote_kv`); None: one of them is still being
        stored (the lookup deferred, the request skipped this step)."""
        if self.host is None:
            return 0
        last = seq.n_tokens // self.block_size
        return self.host.to_load(self._chain(seq, last), gpu_hit, last, self.block_size)

    def record_host(self, seq, gpu_hit: int, n: int) -> None:
        """An admitted request's host lookup: `n` blocks loaded past `gpu_hit` (pinned while they load), or those
        declined."""
        host = self.host
        last = seq.n_tokens // self.block_size
        chain = self._chain(seq, last)
        if n:
            host.loaded(chain, gpu_hit, n, self.block_size)
        else:
            host.stats.recomputed_tokens += host.declined(chain, gpu_hit, last, self.block_size)

    def start_load(self, seq, gpu_hit: int, n: int):
        """`seq`'s `n` host blocks past `gpu_hit` loading from now (engine/host_tier.py HostTier.start_load)."""
        return self.host.start_load(seq.seq_id, gpu_hit, n, self.block_size,
                                    self._chain(seq, seq.n_tokens // self.block_size))

    # ---- changing -----------------------------------------------------------------------------------------------
    def record_lookup(self, seq, hit_tokens: int) -> None:
        """A lookup whose request was admitted (Scheduler.schedule records it only then: record_prefix_cache_stats)."""
        s = self.stats
        if seq.preemptions:
            s.preempted_requests += 1
            s.preempted_queries += seq.n_tokens
            s.preempted_hits += hit_tokens
        else:
            s.requests += 1
            s.queries += seq.n_tokens
            s.hits += hit_tokens

    def allocate(self, seq, computed: int, new_tokens: int, hit: list[int] = (), must_fit: int = 0,
                 reserved: int = 0, delay_cache: bool = False) -> bool:
        """KVCacheManager.allocate_slots for `seq`: `computed` tokens computed before this step (num_computed_tokens),
        `hit` the cached blocks it is admitted with, `new_tokens` to compute now; `must_fit`: the tokens that must fit
        as well (scheduler_reserve_full_isl's full_sequence_must_fit: the whole current sequence); `reserved`: free
        blocks to leave to others (an async load's admission: the in-flight prefills' reservation); `delay_cache`:
        the blocks not named by their hashes yet (an async load's: `delay_cache_blocks`, cached once the load is
        done, `cache_loaded`). False, changing nothing, where the free blocks do not cover it."""
        seq_id = seq.seq_id
        local = computed + len(hit) * self.block_size
        if must_fit and self.blocks_to_allocate(seq_id, must_fit, hit) > self.num_free:
            return False
        if self.blocks_to_allocate(seq_id, local + new_tokens, hit) > self.num_free - reserved:
            return False
        self.seqs[seq_id] = seq
        blocks = self.req_blocks.setdefault(seq_id, [])
        if hit:  # SingleTypeKVCacheManager.add_local_computed_blocks: touched (out of the queue), held, already cached
            ref, queue = self.ref, self.free_queue
            for b in hit:
                if ref[b] == 0:
                    del queue[b]
                ref[b] += 1
            blocks.extend(hit)
            self.num_cached[seq_id] = len(blocks)
        self._grow(seq_id, local + new_tokens)
        if not delay_cache:
            self._cache(seq, min(local + new_tokens, seq.n_tokens))
            if self.host is not None:  # scheduled: its computed prompt blocks offered to the host once the step is
                full = min(local + new_tokens, seq.request_prompt_len) // self.block_size  # chosen
                self.host.offer(seq_id, self._chain(seq, full), full)
        return True

    def cache_loaded(self, seq, tokens: int) -> None:
        """An async load done: its request's first `tokens` tokens named by their hashes (the scheduler's
        `_update_waiting_for_remote_kv` -> KVCacheManager.cache_blocks), found by later lookups from now on."""
        self._cache(seq, tokens)

    def remaining_blocks(self, seq) -> int:
        """Blocks `seq` still needs to hold its whole current sequence (Scheduler._request_remaining_blocks)."""
        return max(-(-seq.n_tokens // self.block_size) - self.held(seq.seq_id), 0)

    def grow(self, seq_id: int, tokens: int) -> None:
        """`seq_id` holds `tokens` tokens in all (the engine's own allocation of a step already allowed for, or a
        decode run's): new blocks from the queue, its full blocks cached."""
        self._grow(seq_id, tokens)
        seq = self.seqs.get(seq_id)
        if seq is not None:
            self._cache(seq, min(tokens, seq.n_tokens))

    def _grow(self, seq_id: int, tokens: int) -> None:
        """SingleTypeKVCacheManager.allocate_new_blocks -> BlockPool.get_new_blocks: from the queue's head, a cached
        block's hash dropped as it is handed out (its eviction)."""
        blocks = self.req_blocks.setdefault(seq_id, [])
        more = -(-tokens // self.block_size) - len(blocks)
        if more <= 0:
            return
        if more > len(self.free_queue):
            raise ValueError(f"cannot get {more} free blocks from the pool ({len(self.free_queue)} free)")
        queue, ref, block_hash, cached = self.free_queue, self.ref, self.block_hash, self.cached
        for _ in range(more):
            b, _ = queue.popitem(last=False)
            h = block_hash[b]
            if h is not None:  # BlockPool._maybe_evict_cached_block
                holders = cached[h]
                del holders[b]
                if not holders:
                    del cached[h]
                block_hash[b] = None
                self.stats.evicted_blocks += 1
            ref[b] = 1
            blocks.append(b)

    def _cache(self, seq, tokens: int) -> None:
        """SingleTypeKVCacheManager.cache_blocks -> BlockPool.cache_full_blocks: the full blocks among the first
        `tokens` named by their hashes (vLLM caches them as they are allocated, before they are computed)."""
        seq_id = seq.seq_id
        done = self.num_cached.get(seq_id, 0)
        full = tokens // self.block_size
        if done >= full:
            return
        chain = self._chain(seq, full)
        blocks, block_hash, cached = self.req_blocks[seq_id], self.block_hash, self.cached
        for i in range(done, full):
            b, h = blocks[i], chain[i]
            if block_hash[b] == h:
                continue
            block_hash[b] = h
            cached.setdefault(h, {})[b] = None
        self.num_cached[seq_id] = full

    def free(self, seq_id: int) -> int:
        """KVCacheManager.free -> BlockPool.free_blocks(reversed(blocks)): tail first; a block whose last reference
        goes returns to the queue, at its tail where it is cached (evicted last), at its head where not. The blocks
        it returned."""
        seq = self.seqs.get(seq_id)
        if self.host is not None and seq is not None and seq.finished:  # offered again, touched (HostTier.finished)
            self.host.finished(seq_id, list(self._chain(seq, seq.n_tokens // self.block_size)),
                               seq.request_prompt_len // self.block_size)
        blocks = self.req_blocks.pop(seq_id, None)
        self.num_cached.pop(seq_id, None)
        self.chains.pop(seq_id, None)  # a preempted sequence's tokens are its prompt again: hashed afresh
        self.seqs.pop(seq_id, None)
        if not blocks:
            return 0
        ref, block_hash, queue = self.ref, self.block_hash, self.free_queue
        first, last = [], []
        for b in reversed(blocks):
            ref[b] -= 1
            if ref[b] == 0:
                (first if block_hash[b] is None else last).append(b)
        for b in reversed(first):  # FreeKVCacheBlockQueue.prepend_n: in their order, before the head
            queue[b] = None
            queue.move_to_end(b, last=False)
        for b in last:
            queue[b] = None
        return len(first) + len(last)


__all__ = ["BlockCache", "CacheStats"]

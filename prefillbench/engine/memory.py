"""KV memory as an engine holds it: blocks of a fixed number of tokens, a capacity, what each sequence holds
(nano-vllm's BlockManager, without the policy: strategies decide admission and preemption by reading it, the engine
carries their decisions out).

A block is `block_size` tokens (vLLM's 16, SGLang's one-token pages); a sequence holding n tokens holds
ceil(n / block_size) blocks. Capacity is in blocks (None: unbounded, where a backend has no bound and none was
asked for). Nothing here knows of torch, llama.cpp or HTTP.
"""
from __future__ import annotations

import math

class OutOfMemory(RuntimeError):
    """A step asked for more blocks than are free: the strategy that chose it broke its own memory rule."""


class KVMemory:
    """The blocks of one engine's KV cache and who holds them."""

    __slots__ = ("block_size", "total_blocks", "held", "used", "peak", "cache", "radix")

    def __init__(self, capacity_tokens: int | None, block_size: int = 1) -> None:
        if block_size < 1:
            raise ValueError(f"a block holds at least one token, got {block_size}")
        self.block_size = block_size
        #: usable blocks; None: unbounded
        self.total_blocks = None if capacity_tokens is None else capacity_tokens // block_size
        self.held: dict[int, int] = {}  # seq_id -> blocks it holds
        self.used = 0
        self.peak = 0
        #: the blocks as a cache (engine/block_cache.py: vLLM's prefix caching, shared by reference, freed blocks
        #: kept until evicted); None: every sequence's blocks its own (`cached` turns it on)
        self.cache = None
        #: the slots as SGLang's radix cache holds them (engine/radix_cache.py: a tree of token runs shared by all
        #: requests, unlocked leaves evicted least recently used first); None: off (`radix_cached` turns it on)
        self.radix = None

    def cached(self) -> "KVMemory":
        """The same memory holding its blocks as vLLM's prefix cache does (a bounded one: the cache needs a pool)."""
        from prefillbench.engine.block_cache import BlockCache

        if self.total_blocks is not None:
            self.cache = BlockCache(self.total_blocks, self.block_size)
        return self

    def radix_cached(self) -> "KVMemory":
        """The same memory (one-token pages, bounded) holding its slots as SGLang's radix cache does."""
        from prefillbench.engine.radix_cache import RadixCache

        if self.total_blocks is not None and self.block_size == 1:
            self.radix = RadixCache(self.total_blocks)
        return self

    def hi_cached(self, host_tokens: int, load_seconds, write_policy: str) -> "KVMemory":
        """The radix cache with SGLang's HiCache below it (engine/hicache.py): a host pool of `host_tokens` tokens,
        loads priced by `load_seconds(tokens)`."""
        from prefillbench.engine.hicache import HiRadixCache

        if self.radix is not None:
            self.radix = HiRadixCache(self.total_blocks, host_tokens, write_policy, load_seconds)
        return self

    @property
    def host_tier(self):
        """The host tier below vLLM's block cache (engine/host_tier.py), which holds the loads in flight; None."""
        return self.cache.host if self.cache is not None else None

    @property
    def shares_prefixes(self) -> bool:
        """Whether the memory is a cache that decides prefix hits (vLLM's block cache or SGLang's radix tree)."""
        return self.cache is not None or self.radix is not None

    @property
    def cache_stats(self):
        """The cache's counters over the run (block_cache.CacheStats, radix_cache.RadixStats); None without one."""
        cache = self.cache if self.cache is not None else self.radix
        return None if cache is None else cache.stats

    # ---- what a strategy reads ----------------------------------------------------
    @property
    def free_blocks(self) -> float:
        if self.radix is not None:  # the allocator's free slots; the tree's evictable ones apart (radix.evictable_size)
            return self.radix.available
        if self.cache is not None:  # cached blocks no one holds are free too (evicted as they are handed out)
            return self.cache.num_free
        return math.inf if self.total_blocks is None else self.total_blocks - self.used

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold `tokens` tokens."""
        return -(-tokens // self.block_size)

    def held_blocks(self, seq_id: int) -> int:
        if self.radix is not None:  # the slots its row references, the tree's shared prefix among them
            return self.radix.committed(seq_id)
        if self.cache is not None:
            return self.cache.held(seq_id)
        return self.held.get(seq_id, 0)

    def needed(self, seq_id: int, tokens: int) -> int:
        """More blocks `seq_id` needs to hold `tokens` tokens in all (vLLM's get_num_blocks_to_allocate)."""
        # blocks_for and held_blocks written out: a paged strategy asks this of every running sequence every step
        # (two calls each, a fifth of vllm-v1's next_step on a tune probe)
        if self.radix is not None:
            return max(tokens - self.radix.committed(seq_id), 0)
        held = self.cache.held(seq_id) if self.cache is not None else self.held.get(seq_id, 0)
        more = -(-tokens // self.block_size) - held
        return more if more > 0 else 0

    @property
    def free_tokens(self) -> float:
        """Tokens the free blocks hold (SGLang's allocator.available_size() with one-token pages)."""
        return self.free_blocks * self.block_size

    @property
    def capacity_tokens(self) -> float:
        return math.inf if self.total_blocks is None else self.total_blocks * self.block_size

    # ---- what the engine does -------------------------------------------------------
    def grow(self, seq_id: int, tokens: int, strict: bool = True) -> None:
        """`seq_id` holds `tokens` tokens in all from now on (never fewer blocks than it held). `strict`: past the
        capacity is an error (a paged strategy's step); else recorded as it is (a reservation the engine sized)."""
        if self.radix is not None:  # the strategy allocated its step's slots as SGLang does; a decode run's here
            rec = self.radix.reqs.get(seq_id)
            if rec is None or tokens > rec.committed:
                from prefillbench.engine.radix_cache import OutOfSlots

                if rec is None:
                    raise OutOfMemory(f"sequence {seq_id} grew without a request in the radix cache")
                try:
                    self.radix.grow(rec.seq, tokens)
                except OutOfSlots as e:
                    raise OutOfMemory(f"sequence {seq_id}: {e}") from None
            self._note_radix_use()
            return
        more = self.needed(seq_id, tokens)
        if self.cache is not None:  # even with no block more: the blocks its new tokens filled are cached
            if self.cache.num_free < more:
                raise OutOfMemory(f"sequence {seq_id} needs {more} more KV block(s) of {self.block_size} tokens, "
                                  f"{self.cache.num_free} free of {self.total_blocks}")
            self.cache.grow(seq_id, tokens)
            self._note_use()
            return
        if not more:
            return
        if strict and self.total_blocks is not None and self.used + more > self.total_blocks:
            raise OutOfMemory(f"sequence {seq_id} needs {more} more KV block(s) of {self.block_size} tokens, "
                              f"{self.total_blocks - self.used} free of {self.total_blocks}")
        self.held[seq_id] = self.held.get(seq_id, 0) + more
        self.used += more
        if self.used > self.peak:
            self.peak = self.used

    def allocate(self, seq, computed: int, new_tokens: int, hit=(), must_fit: int = 0, reserved: int = 0,
                 delay_cache: bool = False) -> bool:
        """With the cache: vLLM's allocate_slots, carried out as its scheduler calls it (BlockCache.allocate: a later
        request of the same step finds the blocks an earlier one was given); False where they do not fit."""
        if not self.cache.allocate(seq, computed, new_tokens, hit, must_fit, reserved, delay_cache):
            return False
        self._note_use()
        return True

    def _note_use(self) -> None:
        """With the cache: blocks held are those out of the free queue (vLLM's usage), the peak among them."""
        self.used = self.total_blocks - self.cache.num_free
        if self.used > self.peak:
            self.peak = self.used

    def _note_radix_use(self) -> None:
        """With the radix cache: slots in use, the tree's evictable ones not among them (SGLang's token usage:
        max_total_num_tokens less available_size and evictable_size), the peak among them."""
        self.used = self.radix.used() - self.radix.evictable_size
        if self.used > self.peak:
            self.peak = self.used

    def step_done(self, step, live: dict, finishes: bool = True) -> None:
        """After a step's tokens are in, what SGLang's process_batch_result does to the radix cache, in the batch's
        order (prompt chunks, then decodes): a prompt whose last chunk ran is put in the tree
        (`checkpoint_kv_cache`) and a finished request's prompt and output are, its slots freed
        (`release_kv_cache`); `finishes` False leaves those to `free` (memory seen a step late). Nothing without it."""
        radix = self.radix
        if radix is None:
            return
        for c in step.prefills:
            seq = live.get(c.seq_id)
            rec = radix.reqs.get(c.seq_id)
            if not c.is_last or seq is None or rec is None:  # a middle chunk: the scheduler sets it aside next pass
                continue
            if seq.finished:
                if finishes:
                    radix.release(c.seq_id, checkpoint=True)
            else:
                radix.checkpoint(rec, rec.extend_end)
                rec.prefix_len = rec.extend_end
        if finishes:
            for d in step.decodes:
                seq = live.get(d.seq_id)
                if seq is not None and seq.finished:
                    radix.release(d.seq_id, checkpoint=True)
        self._note_radix_use()

    def free(self, seq_id: int) -> int:
        """Free every block of `seq_id` (finished, preempted or retracted); how many."""
        if self.radix is not None:  # a finished request not yet released (a retracted one was, by its strategy)
            before = self.radix.available
            self.radix.release(seq_id, checkpoint=True)
            self._note_radix_use()
            return self.radix.available - before
        if self.cache is not None:  # only the blocks no other sequence holds come free
            n = self.cache.free(seq_id)
            self.used -= n
            return n
        n = self.held.pop(seq_id, 0)
        self.used -= n
        return n

    def shrink(self, seq_id: int, tokens: int) -> int:
        """`seq_id` holds only its first `tokens` tokens from now on (speculative decoding's rejected drafts rolled
        back): the blocks left empty are freed (vLLM frees none, its rejected slots are overwritten by the next step's
        tokens; a block-exact engine would). How many. With the prefix cache a sequence's blocks may be shared: kept
        until it finishes."""
        if self.cache is not None or self.radix is not None:
            return 0
        held = self.held.get(seq_id, 0)
        n = max(held - self.blocks_for(tokens), 0)
        if n:
            self.held[seq_id] = held - n
            self.used -= n
        return n

    def peak_fraction(self) -> float:
        """The most blocks held at once, as a share of the capacity (nan where unbounded)."""
        return math.nan if not self.total_blocks else self.peak / self.total_blocks


__all__ = ["KVMemory", "OutOfMemory"]

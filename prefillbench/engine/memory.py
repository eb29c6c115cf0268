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

    __slots__ = ("block_size", "total_blocks", "held", "used", "peak")

    def __init__(self, capacity_tokens: int | None, block_size: int = 1) -> None:
        if block_size < 1:
            raise ValueError(f"a block holds at least one token, got {block_size}")
        self.block_size = block_size
        #: usable blocks; None: unbounded
        self.total_blocks = None if capacity_tokens is None else capacity_tokens // block_size
        self.held: dict[int, int] = {}  # seq_id -> blocks it holds
        self.used = 0
        self.peak = 0

    # ---- what a strategy reads ----------------------------------------------------
    @property
    def free_blocks(self) -> float:
        return math.inf if self.total_blocks is None else self.total_blocks - self.used

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold `tokens` tokens."""
        return -(-tokens // self.block_size)

    def held_blocks(self, seq_id: int) -> int:
        return self.held.get(seq_id, 0)

    def needed(self, seq_id: int, tokens: int) -> int:
        """More blocks `seq_id` needs to hold `tokens` tokens in all (vLLM's get_num_blocks_to_allocate)."""
        return max(self.blocks_for(tokens) - self.held.get(seq_id, 0), 0)

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
        more = self.needed(seq_id, tokens)
        if not more:
            return
        if strict and self.total_blocks is not None and self.used + more > self.total_blocks:
            raise OutOfMemory(f"sequence {seq_id} needs {more} more KV block(s) of {self.block_size} tokens, "
                              f"{self.total_blocks - self.used} free of {self.total_blocks}")
        self.held[seq_id] = self.held.get(seq_id, 0) + more
        self.used += more
        if self.used > self.peak:
            self.peak = self.used

    def free(self, seq_id: int) -> int:
        """Free every block of `seq_id` (finished, preempted or retracted); how many."""
        n = self.held.pop(seq_id, 0)
        self.used -= n
        return n

    def shrink(self, seq_id: int, tokens: int) -> int:
        """`seq_id` holds only its first `tokens` tokens from now on (speculative decoding's rejected drafts rolled
        back): the blocks left empty are freed (vLLM frees none, its rejected slots are overwritten by the next step's
        tokens; a block-exact engine would). How many. With the prefix cache a sequence's blocks may be shared: kept
        until it finishes."""
        if self.cache is not None:
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

"""A step backend's prefix cache for one run: which prompt blocks are cached, what each sequence reused, and the
counts the metadata reports. The blocks' KV is the backend's own business (the sim holds none; gguf tags
llama.cpp's cells with a sequence id per entry): `reuse` names the entry to copy from, `computed` the entries
made and dropped.

A cache lives for one run (`prepare` makes a new one): every run, warm-ups and repetitions alike, starts cold, so a
row's hit rate is its workload's own and a repetition does not find the one before it in the cache.
"""
from __future__ import annotations

from dataclasses import dataclass

from prefillbench.backends.prefix_cache import DEFAULT_BLOCK_SIZE, Inserted, PrefixCache, block_hashes

__all__ = ["DEFAULT_BLOCK_SIZE", "PrefixSettings", "PrefixStore"]


@dataclass(frozen=True)
class PrefixSettings:
    """--prefix-cache and --prefix-block as a backend takes them: on or off, and the block in tokens."""

    on: bool = False
    block: int = DEFAULT_BLOCK_SIZE
    capacity: int | None = None  # the most tokens cached; None: what the backend's KV memory holds

    def blocks(self, room_tokens: int) -> int:
        """The cache's capacity in blocks on a backend with room for `room_tokens` of KV."""
        return max(1, min(room_tokens, self.capacity or room_tokens) // self.block)

    @classmethod
    def from_options(cls, prefix_cache: str | None, prefix_block: int | None) -> "PrefixSettings":
        if prefix_cache not in (None, "on", "off"):
            raise ValueError(f"--prefix-cache is on or off, got {prefix_cache!r}")
        block = DEFAULT_BLOCK_SIZE if prefix_block is None else prefix_block
        if block < 1:
            raise ValueError(f"--prefix-block must be at least 1 token, got {block}")
        return cls(prefix_cache == "on", block)


class PrefixStore:
    """The run's cache, each live sequence's block chain, how far each is cached, and which sequences not started
    yet wait on which block (a cache is consulted when a prompt starts, vLLM's way: a prompt that arrived while
    another with its prefix was still computing finds that prefix once it is cached)."""

    def __init__(self, block: int, capacity: int | None = None, max_entries: int | None = None) -> None:
        self.cache = PrefixCache(block, capacity, max_entries)
        self.block = block
        self.chains: dict[int, tuple[int, ...]] = {}
        self.known: dict[int, int] = {}  # blocks of each live sequence's chain the cache holds, as last seen
        self.limit: dict[int, int] = {}  # the most blocks a sequence may reuse (its last token is always computed)
        self.entry: dict[int, int | None] = {}  # the entry an unstarted sequence would copy its prefix from
        self.wanting: dict[int, set[int]] = {}  # a block's hash -> unstarted sequences whose next block it is
        self.improved: set[int] = set()  # unstarted sequences to look again: their next block cached, or their entry gone
        self.users: dict[int, set[int]] = {}  # an entry -> the unstarted sequences that would copy from it
        self.queried = 0  # prompt tokens of the sequences admitted
        self.hits = 0  # of those, tokens found cached when they started

    def reuse(self, seq_id: int, prompt: tuple[int, ...]) -> int:
        """A sequence admitted: the tokens of its prompt found cached (whole blocks, never its last token); the
        entry holding them is `entry[seq_id]` until it starts."""
        chain = self.chains[seq_id] = block_hashes(prompt, self.block)
        self.limit[seq_id] = (len(prompt) - 1) // self.block
        self.known[seq_id] = 0
        self.queried += len(prompt)
        return self._look(seq_id)

    def _look(self, seq_id: int) -> int:
        chain, before = self.chains[seq_id], self.known[seq_id]
        blocks, entry = self.cache.match(chain, self.limit[seq_id])
        self._use(seq_id, entry)
        self.known[seq_id] = blocks
        self.hits += (blocks - before) * self.block
        if before < len(chain):
            self.wanting.get(chain[before], set()).discard(seq_id)
        if blocks < self.limit[seq_id]:
            self.wanting.setdefault(chain[blocks], set()).add(seq_id)
        return blocks * self.block

    def _use(self, seq_id: int, entry: int | None) -> None:
        """Whose entry an unstarted sequence would copy from (None: none, or it has started)."""
        old = self.entry.get(seq_id)
        if old is not None:
            self.users.get(old, set()).discard(seq_id)
        if entry is not None:
            self.users.setdefault(entry, set()).add(seq_id)
        self.entry[seq_id] = entry

    def refreshed(self) -> dict[int, int]:
        """The unstarted sequences whose cached prefix changed since they looked (a prompt sharing it computed
        more, or the entry it was in was evicted): seq_id -> tokens cached now."""
        out = {}
        for seq_id in self.improved:
            before = self.known[seq_id]
            tokens = self._look(seq_id)
            if tokens != before * self.block:
                out[seq_id] = tokens
        self.improved.clear()
        return out

    def computed(self, seq_id: int, end: int) -> Inserted | None:
        """A sequence's prompt computed up to `end`: it has started (it stops waiting on blocks), and its full
        blocks are cached (None: no new full block)."""
        if seq_id in self.entry:  # its first chunk: what it found is fixed now
            self._use(seq_id, None)
            del self.entry[seq_id]
            chain, known = self.chains[seq_id], self.known[seq_id]
            if known < len(chain):
                self.wanting.get(chain[known], set()).discard(seq_id)
            self.improved.discard(seq_id)
        blocks = min(end // self.block, len(self.chains[seq_id]))
        known = self.known[seq_id]
        if blocks <= known:
            return None
        self.known[seq_id] = blocks
        inserted = self.cache.insert(self.chains[seq_id][:blocks], known)
        for h in inserted.new:
            waiting = self.wanting.pop(h, None)
            if waiting:
                self.improved |= waiting
        for gone in inserted.dropped:
            self.improved |= self.users.pop(gone, set())
        return inserted

    def release(self, seq_id: int) -> None:
        if seq_id in self.entry:  # finished (or dropped) before it started: nothing to wait on any more
            self.computed(seq_id, 0)
        for table in (self.chains, self.known, self.limit):
            table.pop(seq_id, None)

    def metadata(self) -> dict[str, object]:
        return {"prefix_cache_block": self.block, "prefix_cache_capacity_blocks": self.cache.capacity,
                "prefix_cache_queried_tokens": self.queried, "prefix_cache_hit_tokens": self.hits,
                "prefix_cache_evicted_blocks": self.cache.evicted_blocks}

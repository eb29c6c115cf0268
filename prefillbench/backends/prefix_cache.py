"""A block-granular cache of prompt prefixes, as vLLM's automatic prefix caching keeps one.

A prompt is cut into blocks of `block_size` tokens; a full block is cached under a hash of its tokens and of every
token before it (the previous block's hash chained in), so two prompts share a cached block exactly when they share
everything up to its end. The cached blocks form a tree; each leaf is an *entry*, the prefix from the first block
to that leaf, which is what a backend stores (llama.cpp: one sequence id tagging those KV cells, shared with the
entries that branch off it). Lookups and insertions touch entries; eviction drops the least recently used entry's
blocks that no other entry holds, until the cache holds at most `capacity` blocks and `max_entries` entries.

What a backend does with an entry is its own business: `match` names the entry holding a matched prefix,
`insert` names the entry it made and the entries it dropped (dominated by the new one, or evicted).
The same object, fed requests in order and never evicting, gives the hit rate a workload implies (`implied_hits`).
"""
from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

#: vLLM's default block size (`--block-size 16`) is a KV page; its prefix cache hashes the same blocks. Mooncake's
#: traces hash 512-token blocks. The default here is vLLM's; a trace's own block size replaces it.
DEFAULT_BLOCK_SIZE = 16


@dataclass(slots=True)
class _Node:
    parent: int | None  # the hash of the block before; None for a prompt's first block
    children: set[int] = field(default_factory=set)
    entry: int | None = None  # a leaf's entry


@dataclass(frozen=True)
class Inserted:
    """What `insert` changed: the entry that now holds the prompt's cached prefix (None: nothing new was cached),
    and the entries dropped, whose storage the backend frees (their blocks still held by others stay)."""

    entry: int | None
    dropped: tuple[int, ...] = ()
    new: tuple[int, ...] = ()  # the hashes of the blocks it added


@functools.lru_cache(maxsize=1024)
def block_hashes(prompt: tuple[int, ...], block_size: int) -> tuple[int, ...]:
    """The chained hash of each full block of `prompt`: block i's hash covers every token up to its end.
    Python hashes a tuple of ints the same in every process (no hash randomisation for ints). Kept: a capacity
    search replays one seed's prompts at every rate, and each probe hashed them again, twice (its cache and the
    rate they imply), a sixth of a sim probe of the Mooncake sample."""
    out, h = [], None
    for i in range(0, len(prompt) - len(prompt) % block_size, block_size):
        h = hash((h, prompt[i:i + block_size]))
        out.append(h)
    return tuple(out)


class PrefixCache:
    """Blocks cached by chained hash (`block_hashes`), entries (the tree's leaves) least recently used first.
    Callers hash a prompt once and pass its chain: a long prompt is inserted chunk by chunk."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE, capacity: int | None = None,
                 max_entries: int | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"the cache's block size must be at least 1 token, got {block_size}")
        if capacity is not None and capacity < 1:
            raise ValueError(f"the cache must hold at least one block, got {capacity}")
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"the cache must hold at least one entry, got {max_entries}")
        self.block_size = block_size
        self.capacity = capacity  # most blocks held; None: no bound
        self.max_entries = max_entries
        self.nodes: dict[int, _Node] = {}
        self.entries: OrderedDict[int, int] = OrderedDict()  # entry -> its leaf's hash, least recently used first
        self.next_entry = 0
        self.evicted_blocks = 0  # blocks dropped to make room, over the cache's life

    def __len__(self) -> int:
        """Blocks held."""
        return len(self.nodes)

    def match(self, chain: tuple[int, ...], limit: int | None = None) -> tuple[int, int | None]:
        """How many leading blocks of `chain` (at most `limit`) are cached, and an entry that holds them all (None:
        none is cached); that entry becomes the most recently used."""
        depth, last = 0, None
        for h in chain[:limit]:
            node = self.nodes.get(h)
            if node is None:
                break
            depth, last = depth + 1, node
        if last is None:
            return 0, None
        return depth, self._touch(last)

    def _touch(self, node: _Node) -> int:
        """The entry of a leaf at or below `node` (any leaf holds the whole prefix to it), now the most recent."""
        while node.entry is None:
            node = self.nodes[next(iter(node.children))]
        self.entries.move_to_end(node.entry)
        return node.entry

    def insert(self, chain: tuple[int, ...], known: int = 0) -> Inserted:
        """Cache the blocks of `chain` (a prompt computed that far). `known`: how many leading blocks the caller
        found cached or inserted before (a hint: they are checked, since they may have been evicted since)."""
        if not chain:
            return Inserted(None)
        nodes = self.nodes
        start = known if 0 < known <= len(chain) and chain[known - 1] in nodes else 0
        while start < len(chain) and chain[start] in nodes:
            start += 1
        if start == len(chain):  # all cached already: a use
            self._touch(nodes[chain[-1]])
            return Inserted(None)
        entry = self.next_entry
        self.next_entry += 1
        dropped = []
        parent = chain[start - 1] if start else None
        if parent is not None:
            grown = nodes[parent]
            if grown.entry is not None:  # a leaf extended: its entry's prefix is inside the new one's
                del self.entries[grown.entry]
                dropped.append(grown.entry)
                grown.entry = None
            grown.children.add(chain[start])
        for i in range(start, len(chain)):
            nodes[chain[i]] = _Node(parent, {chain[i + 1]} if i + 1 < len(chain) else set())
            parent = chain[i]
        nodes[chain[-1]].entry = entry
        self.entries[entry] = chain[-1]
        dropped += self._evict(keep=entry)
        return Inserted(entry, tuple(dropped), tuple(chain[start:]))

    def _evict(self, keep: int) -> list[int]:
        dropped = []
        while ((self.capacity is not None and len(self.nodes) > self.capacity)
               or (self.max_entries is not None and len(self.entries) > self.max_entries)):
            victim = next((e for e in self.entries if e != keep), None)
            if victim is None:
                break
            self._drop(victim)
            dropped.append(victim)
        return dropped

    def _drop(self, entry: int) -> None:
        """Take `entry` out: its blocks back to the first one another entry's prefix shares."""
        h: int | None = self.entries.pop(entry)
        while h is not None:
            node = self.nodes[h]
            if node.children:
                break
            del self.nodes[h]
            self.evicted_blocks += 1
            if node.parent is not None:
                self.nodes[node.parent].children.discard(h)
            h = node.parent


def implied_hits(prompts: Iterable[tuple[int, ...]], block_size: int, capacity: int | None = None) -> tuple[int, int]:
    """(cached, total) prompt tokens if every prompt found the blocks earlier ones left, in order, in a cache of
    `capacity` blocks (None: one that never evicts): the hit rate a workload's own structure implies, with no
    prompt overlapping another. Like a backend, it computes each prompt's last token whatever is cached."""
    cache = PrefixCache(block_size, capacity)
    cached = total = 0
    for prompt in prompts:
        chain = block_hashes(prompt, block_size)
        cached += cache.match(chain, (len(prompt) - 1) // block_size)[0] * block_size
        total += len(prompt)
        cache.insert(chain)
    return cached, total

"""KV memory as SGLang's radix cache holds it (SGLang 0.5.23, `srt/mem_cache/radix_cache.py` RadixCache with
one-token pages, its allocator `TokenToKVPoolAllocator` and `srt/mem_cache/common.py`'s request-side calls).

Every computed token's KV is a slot of one pool of `capacity` tokens. A tree of token runs (a node's `key`) is shared
by all requests: a request whose tokens start with a path of the tree finds that many tokens computed
(`match_prefix`), locks the path while it runs (`inc_lock_ref`: a locked node is `protected`, an unlocked one
`evictable`), and its own KV past it is a row of private slots until the tree takes it over (`checkpoint`: a prompt
whose prefill ended, a chunk set aside, a finished request's prompt and output). Allocation evicts unlocked leaves,
least recently used first (`evict`: the node touched longest ago, its parent in turn once it is a childless unlocked
leaf), only as far as the pool is short (`evict_to_free`); eviction drops whole nodes, so it may free more than asked.

Recency is a counter, not a clock: each lookup and insert takes the next value for every node on its path, each node
made (a split's upper half, an insert's new leaf) the one after (SGLang reads `time.monotonic()` at the same points;
only their order decides what is evicted). The reference run (benchmarks/engine/sglang_reference.py) gives SGLang's
tree the same counter so two nodes never tie.

Which strategy reads it, and how the scheduler's calls line up, is strategies/sglang_radix.py; the engine's memory
(engine/memory.py) owns one where a run asks for SGLang's cache. Nothing here knows of torch, llama.cpp or HTTP.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from prefillbench.sequence import tokens_of


class OutOfSlots(RuntimeError):
    """An allocation larger than the free and evictable slots: the scheduler that asked broke its own rule."""


class Node:
    """A run of tokens in the tree (TreeNode): children by their first token."""

    __slots__ = ("children", "parent", "key", "lock_ref", "last_access")

    def __init__(self, parent: "Node | None", key: tuple[int, ...], tick: int) -> None:
        self.children: dict[int, Node] = {}
        self.parent = parent
        self.key = key
        self.lock_ref = 0
        self.last_access = tick


@dataclass
class RequestKV:
    """What SGLang's Req keeps of its KV (`prefix_len`, `last_node`, `lock`, `kv.cache_protected_len`,
    `kv.kv_committed_len`, `extend_end`), and its Sequence (its tokens are its prompt and output)."""

    seq: object
    prefix_len: int = 0  # tokens matched in the tree, or computed before this round
    last_node: Node | None = None
    lock: Node | None = None  # the node its lock holds (None: none)
    protected: int = 0  # its first `protected` tokens are the tree's (cache_protected_len)
    committed: int = 0  # tokens whose KV slots its row holds (kv_committed_len)
    extend_end: int = 0  # where its current round of prompt ends


@dataclass
class RadixStats:
    """Over a run: tokens evicted (`evicted_blocks`, one-token pages, the column vLLM's block cache fills), and the
    host tier's counters (engine/hicache.py HiCacheStats; None: no HiCache)."""

    evicted_blocks: int = 0
    host: object = None


class RadixCache:
    """The tree, the pool's free slots (`available`) and each request's KV."""

    #: the tree's nodes (engine/hicache.py's carry a host copy's state too)
    node_class = Node
    #: whether a host tier sits below (engine/hicache.py HiRadixCache)
    hicache = False

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity = capacity_tokens
        self.available = capacity_tokens  # TokenToKVPoolAllocator.available_size()
        self.tick = 0
        self.root = self.node_class(None, (), 0)
        self.root.lock_ref = 1  # never evicted (RadixCache.reset)
        self.evictable_size = 0
        self.protected_size = 0
        self.evictable_leaves: set[Node] = set()
        self.reqs: dict[int, RequestKV] = {}
        self.stats = RadixStats()

    def _now(self) -> int:
        self.tick += 1
        return self.tick

    # ---- the tree (RadixCache's own methods) ----------------------------------------------------------------------
    def match_prefix(self, tokens, limit: int | None = None) -> tuple[int, Node]:
        """The longest path of the tree that `tokens[:limit]` starts with: its length and last node, every node on
        it touched; a match ending inside a node splits it there (`match_prefix`, `_match_prefix_helper`)."""
        key = tuple(tokens if limit is None else tokens[:limit])
        if not key:
            return 0, self.root
        now = self._now()
        node = self.root
        node.last_access = now
        matched = 0
        while matched < len(key):
            child = node.children.get(key[matched])
            if child is None:
                break
            child.last_access = now
            n = _common(child.key, key, matched)
            if n < len(child.key):
                node = self._split(child, n)
                matched += n
                break
            node = child
            matched += n
        return matched, node

    def insert(self, tokens) -> int:
        """Put `tokens` in the tree (`insert`, `_insert_helper`): the path it shares touched (split where it parts),
        the rest a new leaf, evictable; how many tokens were there already."""
        key = tuple(tokens)
        now = self._now()
        node = self.root
        node.last_access = now
        if not key:
            return 0
        matched = 0
        while matched < len(key):
            child = node.children.get(key[matched])
            if child is None:
                break
            child.last_access = now
            n = _common(child.key, key, matched)
            matched += n
            node = self._split(child, n) if n < len(child.key) else child
        if matched < len(key):
            leaf = self.node_class(node, key[matched:], self._now())
            node.children[key[matched]] = leaf
            self.evictable_size += len(leaf.key)
            self._update_leaf(node)
            self._update_leaf(leaf)
        return matched

    def _split(self, child: Node, n: int) -> Node:
        """`child` cut after its first `n` tokens: a new node above it holds them (`_split_node`: it takes the
        child's locks, and a time of its own, made now)."""
        upper = self.node_class(child.parent, child.key[:n], self._now())
        upper.lock_ref = child.lock_ref
        upper.children = {child.key[n]: child}
        child.parent.children[child.key[0]] = upper
        child.parent = upper
        child.key = child.key[n:]
        return upper

    def inc_lock_ref(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            self._update_leaf(node)
            node = node.parent

    def dec_lock_ref(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node.lock_ref -= 1
            self._update_leaf(node)
            node = node.parent

    def _update_leaf(self, node: Node) -> None:
        """`_update_leaf_status`: an unlocked node without children is an evictable leaf."""
        if node.lock_ref > 0 or node.children:
            self.evictable_leaves.discard(node)
        else:
            self.evictable_leaves.add(node)

    def evict(self, num_tokens: int) -> int:
        """Unlocked leaves, least recently used first, until `num_tokens` are freed or none is left (`evict`: a
        parent left childless and unlocked joins them); the tokens freed."""
        heap = [(n.last_access, id(n), n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            self.available += len(x.key)
            freed += len(x.key)
            parent = x.parent
            del parent.children[x.key[0]]  # _delete_leaf
            self.evictable_size -= len(x.key)
            self.evictable_leaves.discard(x)
            self._update_leaf(parent)
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        self.stats.evicted_blocks += freed
        return freed

    # ---- the allocator (allocator/base.py, token.py) --------------------------------------------------------------
    def evict_to_free(self, num_tokens: int) -> None:
        """`evict_to_free_tokens`: evict what the free slots fall short of `num_tokens`."""
        short = num_tokens - self.available
        if short > 0:
            self.evict(short)

    def alloc(self, num_tokens: int) -> None:
        """`alloc_token_slots`: evict as short, then take the slots."""
        self.evict_to_free(num_tokens)
        if num_tokens > self.available:
            raise OutOfSlots(f"{num_tokens} KV slots asked, {self.available} free and "
                             f"{self.evictable_size} evictable of {self.capacity}")
        self.available -= num_tokens

    def check_decode(self, num_tokens: int) -> bool:
        """`check_decode_capacity`: whether the next decode's slots fit, evicting what they fall short by."""
        self.evict_to_free(num_tokens)
        return self.available >= num_tokens

    # ---- a request's KV (mem_cache/common.py, Req, RadixCache.checkpoint) -----------------------------------------
    def request(self, seq) -> RequestKV:
        rec = self.reqs.get(seq.seq_id)
        if rec is None:
            rec = self.reqs[seq.seq_id] = RequestKV(seq)
        return rec

    def match(self, seq, limit: int | None = None) -> int:
        """`match_kv_cache`: the request's prefix in the tree (its whole tokens, or their first `limit`), kept as
        its prefix and last node; the length."""
        rec = self.request(seq)
        rec.prefix_len, rec.last_node = self.match_prefix(tokens_of(seq), limit)
        return rec.prefix_len

    def lock(self, rec: RequestKV) -> None:
        """The request takes its lock on its last node (PrefillAdder._commit_prefill_admission)."""
        rec.lock = rec.last_node
        self.inc_lock_ref(rec.lock)

    def checkpoint(self, rec: RequestKV, up_to: int) -> None:
        """RadixCache.checkpoint: its first `up_to` tokens into the tree (split at the prompt's end, so an output
        can be evicted without its prompt), its slots of tokens the tree held already freed, its lock moved to the
        new last node, the tree's part of its row `up_to` long."""
        key = tokens_of(rec.seq)[:up_to]
        matched = self._insert_request(rec.seq, key)
        if matched > rec.protected:  # free_segment(kv_indices[cache_protected_len:prefix_len]): duplicates
            self.available += matched - rec.protected
        _, node = self.match_prefix(key)
        rec.protected = len(key)
        if rec.lock is not None:
            self.dec_lock_ref(rec.lock)
        rec.last_node = rec.lock = node
        self.inc_lock_ref(node)

    def _insert_request(self, seq, key: tuple[int, ...]) -> int:
        """A request's tokens `key` put in the tree, split at its prompt where they run past it; how many the tree
        held already."""
        matched = self.insert(key)
        prompt = seq.request_prompt_len
        if 0 < prompt < len(key):
            self.insert(key[:prompt])
        return matched

    def release(self, seq_id: int, checkpoint: bool) -> bool:
        """`release_kv_cache`: a finished request's tokens into the tree first (`checkpoint`; a retracted one's
        not), its slots past the tree's part freed, its lock dropped. Whether it held any."""
        rec = self.reqs.pop(seq_id, None)
        if rec is None:
            return False
        owned = rec.committed
        if checkpoint:
            self.checkpoint(rec, owned)
        if owned > rec.protected:
            self.available += owned - rec.protected
        if rec.lock is not None:
            self.dec_lock_ref(rec.lock)
        return True

    def forget(self, seq_id: int) -> None:
        """A waiting request's lookups, dropped (it left without running: nothing of it is held)."""
        rec = self.reqs.get(seq_id)
        if rec is not None and rec.lock is None and not rec.committed:
            del self.reqs[seq_id]

    def committed(self, seq_id: int) -> int:
        rec = self.reqs.get(seq_id)
        return 0 if rec is None else rec.committed

    def grow(self, seq, tokens: int) -> None:
        """The request's row holds `tokens` slots from now on (more allocated, evicting as short)."""
        rec = self.request(seq)
        if tokens > rec.committed:
            self.alloc(tokens - rec.committed)
            rec.committed = tokens

    def used(self) -> int:
        return self.capacity - self.available


def _common(a: tuple[int, ...], key: tuple[int, ...], offset: int) -> int:
    """Tokens `a` shares with `key[offset:]` from their start (RadixKey.match_at)."""
    n = min(len(a), len(key) - offset)
    i = 0
    while i < n and a[i] == key[offset + i]:
        i += 1
    return i


__all__ = ["Node", "OutOfSlots", "RadixCache", "RadixStats", "RequestKV"]

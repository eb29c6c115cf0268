"""A host tier below SGLang's radix cache, as SGLang 0.5.23's HiCache holds it (`--enable-hierarchical-cache`): the
tree's nodes keep a host copy (L2) below their GPU slots (L1). In 0.5.23 HiCache is UnifiedRadixCache.init_hicache
(`srt/mem_cache/unified_radix_cache.py`) over its tree core (`mem_cache/unified_cache/unified_tree_core.py`, the FULL
component `unified_cache/components/full.py`); the scheduler's calls are PrefillAdder.add_one_req
(`managers/schedule_policy.py`) and Scheduler._process_hicache_events (`managers/scheduler.py`). Every rule below
names the function it follows; benchmarks/engine/sglang_hicache.py drives SGLang's own cache on the same operations,
and `sglang_steps --hicache` SGLang's own scheduler over it (tests/test_hicache_reference.py compares both).

- **A node's tiers.** A node holds its tokens' GPU slots, a host copy (`backuped`), or both. GPU eviction of a node
  with a host copy *demotes* it: its slots are freed, the node stays in the tree host-only (`evicted`)
  (UnifiedTreeCore.evict_device_leaf -> _demote). A GPU-evictable leaf is a node on the GPU, unlocked, none of whose
  children is on the GPU (`_is_device_leaf`); least recently used first, its parent pushed once it becomes one
  (FullComponent._evict_device_next_node).
- **Write policy** (`--hicache-write-policy`, default `write_through`; UnifiedRadixCache.init_hicache sets
  `write_through_threshold` 1, 2 for `write_through_selective`): an insert counts a hit on each node it walks past
  the tokens the request inserted before (`InsertParams.inserted_len`, the request's `cache_inserted_len`) and on its
  new leaf; a node reaching the threshold without a host copy is written, its unwritten ancestors first
  (`_inc_hit_count_and_check`, `_build_backup_kv_action`), locked on the GPU until the write's ack, which the next
  scheduler pass takes (`writing_check` from `check_hicache_events`, first thing in `get_next_batch_to_run`). A
  written-through node evicted from the GPU without a copy (its write failed for room) is dropped
  (`_delete_unbacked_device_leaf`). `write_back` writes nothing on insert: a GPU leaf is written as it is evicted,
  then demoted (`_evict_components`: `_execute_and_commit_kv_backup(write_back=True)`, `writing_check(write_back=True)`,
  `_demote`); where the host cannot make room it is dropped (`drop_subtree_no_host`).
- **Host eviction** (`evict_host` -> UnifiedTreeCore.drive_host_eviction -> FullComponent.drive_host_eviction): a
  write short of host room evicts host leaves (host-only, with no children, unlocked), least recently used first, as
  far as it is short; the write fails if they do not free enough (`_execute_kv_backup`). Under write_back, host
  copies of nodes back on the GPU are reclaimed first, in the order they became such duplicates, GPU-evictable
  leaves spared in a first pass (`_reclaim_full_host_duplicates`).
- **Load back** (PrefillAdder.add_one_req -> UnifiedRadixCache.init_load_back -> load_back): a match walks host-only
  nodes too; the request's prefix is its GPU part (`device_prefix_len`), the rest its host hit. Once the candidate
  passes the budget (its total counted from its GPU prefix: the host hit needs slots too), the host part is loaded
  whole or not at all: not below `load_back_threshold` (10) tokens, nor where evicting cannot free its slots; the
  nodes are back on the GPU (their host copies kept), locked until the load's ack (`loading_check`, next pass), and
  the request's prompt starts past them. What is not loaded is computed again.

Capacity: the host pool in tokens (the sim's --kv-host-cache GiB over the KV bytes of a token, as SGLang's
`--hicache-size` is GB over a rank's bytes per token; `--hicache-ratio` would be a multiple of the GPU pool).
Recency is radix_cache.py's counter. Nothing here knows of torch, llama.cpp or HTTP.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable

from prefillbench.engine.radix_cache import Node, RadixCache, RequestKV, _common
from prefillbench.sequence import tokens_of

WRITE_THROUGH, WRITE_THROUGH_SELECTIVE, WRITE_BACK = "write_through", "write_through_selective", "write_back"
WRITE_POLICIES = (WRITE_THROUGH, WRITE_THROUGH_SELECTIVE, WRITE_BACK)
#: --hicache-write-policy's default, SGLang's (arg_groups/fields/memory.py)
DEFAULT_WRITE_POLICY = WRITE_THROUGH
#: UnifiedRadixCache.init_hicache: `load_back_threshold`, the fewest host tokens worth loading
LOAD_BACK_THRESHOLD = 10


class HiNode(Node):
    """A tree node with its host side (UnifiedTreeNode: `evicted`, `backuped`, `hit_count`, `host_lock_ref`)."""

    __slots__ = ("evicted", "backuped", "hit_count", "host_lock", "host_top", "loading")

    def __init__(self, parent, key, tick) -> None:
        super().__init__(parent, key, tick)
        self.evicted = False  # its GPU slots freed (host-only)
        self.backuped = False  # a host copy held
        self.hit_count = 0
        self.host_lock = 0
        self.host_top = False  # the top of a host-lock segment (its `host_uuid`)
        self.loading = None  # write_back: the deepest node of its load not yet acknowledged (`load_back_pending_id`)


@dataclass
class HiCacheStats:
    """Over a run: tokens loaded back from the host (host hits), the loads and their priced seconds, host tokens found
    but computed again (below the threshold or no room), tokens written to the host, tokens the host evicted, and GPU
    evictions that kept the node on the host (demoted). `loaded_tokens`/`load_seconds` fill the row's
    host_hit_tokens/host_load_s as the vLLM tier's do."""

    loaded_tokens: int = 0
    loads: int = 0
    load_seconds: float = 0.0
    recomputed_tokens: int = 0
    written_tokens: int = 0
    host_evicted_tokens: int = 0
    demoted_tokens: int = 0


class HiRadixCache(RadixCache):
    """The radix cache with a host pool of `host_capacity` tokens below it."""

    node_class = HiNode
    hicache = True

    def __init__(self, capacity_tokens: int, host_tokens: int, write_policy: str = DEFAULT_WRITE_POLICY,
                 load_seconds: Callable[[int], float] = lambda n: 0.0) -> None:
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"a HiCache write policy is one of {', '.join(WRITE_POLICIES)}, got {write_policy!r}")
        if host_tokens < 1:
            raise ValueError(f"a HiCache host pool holds at least one token, got {host_tokens}")
        super().__init__(capacity_tokens)
        self.host_capacity = host_tokens
        self.host_available = host_tokens
        self.write_policy = write_policy
        self.write_back = write_policy == WRITE_BACK
        self.threshold = 2 if write_policy == WRITE_THROUGH_SELECTIVE else 1
        self.load_seconds = load_seconds
        self.host_leaves: set[HiNode] = set()
        self.duplicates: dict[int, HiNode] = {}  # write_back: nodes on both tiers, in the order they became so
        self.writing: list[HiNode] = []  # written-through nodes locked until the next pass's ack
        self.loading: list[HiNode] = []  # loads (their deepest node) until their ack
        self.inserted: dict[int, int] = {}  # seq_id -> its cache_inserted_len
        self._best: dict[int, tuple[HiNode, int]] = {}  # seq_id -> its last match's deepest node and host tokens
        self.hi = HiCacheStats()
        self.stats.host = self.hi

    # ---- sizes and leaves ---------------------------------------------------------------------------------------
    def inc_lock_ref(self, node) -> None:
        """A lock moves only GPU-resident tokens from evictable to protected (a host-only node has none)."""
        while node is not self.root:
            if node.lock_ref == 0 and not node.evicted:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            self._update_leaf(node)
            node = node.parent

    def dec_lock_ref(self, node) -> None:
        while node is not self.root:
            if node.lock_ref == 1 and not node.evicted:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node.lock_ref -= 1
            self._update_leaf(node)
            node = node.parent

    def _update_leaf(self, node) -> None:
        """`_update_evictable_leaf_sets`: a GPU leaf (`_is_device_leaf`) and a host leaf (`_is_host_leaf`)."""
        if node is self.root:
            return
        if not node.evicted and node.lock_ref == 0 and all(c.evicted for c in node.children.values()):
            self.evictable_leaves.add(node)
        else:
            self.evictable_leaves.discard(node)
        if node.evicted and node.backuped and not node.children and node.lock_ref == 0 and node.host_lock == 0:
            self.host_leaves.add(node)
        else:
            self.host_leaves.discard(node)

    def _split(self, child, n: int):
        """The upper half takes the child's tiers, hits and host locks too (`_split_node`,
        FullComponent.redistribute_on_node_split)."""
        upper = super()._split(child, n)
        upper.evicted, upper.backuped = child.evicted, child.backuped
        upper.hit_count, upper.host_lock = child.hit_count, child.host_lock
        upper.host_top, child.host_top = child.host_top, False  # the segment grows up through the new node
        upper.loading = child.loading
        self._track(upper)
        return upper

    # ---- the tree -----------------------------------------------------------------------------------------------
    def insert(self, tokens, inserted_len: int = 0) -> int:
        """`insert` (UnifiedTreeCore's walk): host-only nodes on the path take the request's slots back
        (`_unevict_node_on_insert`), hits counted past `inserted_len` and written through at the threshold
        (`_finish_insert_walk_node`, `_should_backup_after_insert`). The tokens the GPU held already (their slots
        the request's duplicates)."""
        key = tuple(tokens)
        now = self._now()
        node = self.root
        node.last_access = now
        if not key:
            return 0
        matched = on_gpu = 0
        while matched < len(key):
            child = node.children.get(key[matched])
            if child is None:
                break
            child.last_access = now
            n = _common(child.key, key, matched)
            if n < len(child.key):
                child = self._split(child, n)
            if child.evicted:
                self._unevict(child)
            else:
                on_gpu = matched + n
            matched += n
            node = child
            if matched > inserted_len and self._hit(node):
                self._write_through(node)
        if matched < len(key):
            leaf = self.node_class(node, key[matched:], self._now())
            node.children[key[matched]] = leaf
            self.evictable_size += len(leaf.key)
            self._update_leaf(node)
            self._update_leaf(leaf)
            if len(key) > inserted_len and self._hit(leaf):
                self._write_through(leaf)
        return on_gpu

    def _hit(self, node) -> bool:
        """`_inc_hit_count_and_check`: whether the node is due a write-through."""
        if node.evicted or self.write_back:
            return False
        node.hit_count += 1
        return not node.backuped and node.hit_count >= self.threshold

    def _write_through(self, node) -> None:
        """The node and its unwritten ancestors, top down, written and locked until their ack; the first that finds
        no host room ends it (`_build_backup_kv_action`, `_execute_and_commit_kv_backup`)."""
        chain = [node]
        up = node.parent
        while up is not self.root and not up.backuped:
            chain.append(up)
            up = up.parent
        for x in reversed(chain):
            if x.backuped:
                continue
            if not self._write(x):
                return
            self.inc_lock_ref(x)
            self.writing.append(x)

    def _write(self, node) -> bool:
        """A host copy of `node`, host leaves evicted as the pool is short (`_execute_kv_backup`); False where
        they do not free enough."""
        n = len(node.key)
        if self.host_available < n:
            short = n - self.host_available
            if self.evict_host(short) < short:
                return False
        self.host_available -= n
        node.backuped = True
        self.hi.written_tokens += n
        self._update_leaf(node)
        return True

    def _unevict(self, node, loaded: bool = False) -> None:
        """Slots back on the GPU for a host-only node (by an insert, or a load: commit_load_back, whose ack tracks
        it): counted evictable or protected as it is locked; its host copy kept (a duplicate)."""
        node.evicted = False
        if node.lock_ref > 0:
            self.protected_size += len(node.key)
        else:
            self.evictable_size += len(node.key)
        if not loaded:
            self._track(node)
        self._update_leaf(node)
        self._update_leaf(node.parent)

    def _track(self, node) -> None:
        """`_update_duplicate_tracking` (write_back's reclaim reads it): a node on both tiers, not loading, joins the
        duplicates where it is not in them already (a stale entry keeps its place), one that is not leaves."""
        if not self.write_back:
            return
        if not node.evicted and node.backuped and node.loading is None:
            self.duplicates.setdefault(id(node), node)
        else:
            self.duplicates.pop(id(node), None)

    def events(self) -> None:
        """check_hicache_events at the top of a pass: every write's and load's ack taken (a copy done by then: the
        stand-in runs them whole), their locks dropped (`writing_check`, `loading_check`)."""
        writing, self.writing = self.writing, []
        for node in writing:
            self.dec_lock_ref(node)
        loading, self.loading = self.loading, []
        for node in loading:
            self.dec_lock_ref(node)
            self._host_unlock(node)
            x = node
            while x is not self.root:  # finish_load_back: the loaded nodes (split ones too) duplicates from now
                if x.loading is node:
                    x.loading = None
                    self._track(x)
                x = x.parent

    # ---- eviction -----------------------------------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """GPU leaves, least recently used first, until `num_tokens` are freed (`_evict_components`): one with a host
        copy demoted, one without written first (write_back) or dropped (write-through)."""
        heap = [(n.last_access, id(n), n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            if x not in self.evictable_leaves:
                continue
            parent = x.parent
            if x.backuped:
                freed += self._demote(x)
            elif self.write_back:
                if self._write(x):
                    self._track(x)  # the write's ack (finish_write_through) sees it on both tiers, then the demote
                    freed += self._demote(x)
                else:
                    freed += self._drop(x)
            else:
                freed += self._drop(x)
            if parent in self.evictable_leaves:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        self.stats.evicted_blocks += freed
        return freed

    def _demote(self, node) -> int:
        n = len(node.key)
        node.evicted = True
        self.available += n
        self.evictable_size -= n
        self.hi.demoted_tokens += n
        self._update_leaf(node)
        self._update_leaf(node.parent)
        return n

    def _drop(self, node) -> int:
        """A GPU leaf without a host copy deleted with what hangs below it (host-only nodes: their copies freed)."""
        n = len(node.key)
        self.available += n
        self.evictable_size -= n
        self._cut(node)
        return n

    def _cut(self, node) -> None:
        for child in list(node.children.values()):
            self._cut(child)
        if node.backuped:
            self.host_available += len(node.key)
        parent = node.parent
        del parent.children[node.key[0]]
        self.evictable_leaves.discard(node)
        self.host_leaves.discard(node)
        self.duplicates.pop(id(node), None)
        self._update_leaf(parent)

    def evict_host(self, num_tokens: int) -> int:
        """`evict_host`: host leaves, least recently used first, until `num_tokens` host tokens are free (write_back
        reclaiming duplicates first); the host tokens freed."""
        freed = 0
        if self.write_back:
            freed = self._reclaim_duplicates(num_tokens)
        heap = [(n.last_access, id(n), n) for n in self.host_leaves]
        heapq.heapify(heap)
        while freed < num_tokens and heap:
            _, _, x = heapq.heappop(heap)
            if x not in self.host_leaves:
                continue
            n = len(x.key)
            parent = x.parent
            self.host_available += n
            freed += n
            self.hi.host_evicted_tokens += n
            del parent.children[x.key[0]]
            self.host_leaves.discard(x)
            self.duplicates.pop(id(x), None)
            self._update_leaf(parent)
            if parent in self.host_leaves:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return freed

    def _reclaim_duplicates(self, num_tokens: int) -> int:
        """`_reclaim_full_host_duplicates`: host copies of nodes also on the GPU freed, oldest duplicate first; a
        first pass spares GPU-evictable leaves (they are about to be demoted), a second takes them."""
        freed = 0
        for spare in (True, False):
            for key, node in list(self.duplicates.items()):
                if freed >= num_tokens:
                    return freed
                if node.evicted or not node.backuped:  # stale: swept
                    del self.duplicates[key]
                    continue
                if (spare and node in self.evictable_leaves) or node.host_lock or node.loading is not None:
                    continue
                node.backuped = False
                self.host_available += len(node.key)
                freed += len(node.key)
                self.hi.host_evicted_tokens += len(node.key)
                del self.duplicates[key]
                self._update_leaf(node)
        return freed

    # ---- a request's KV -----------------------------------------------------------------------------------------
    def match(self, seq, limit: int | None = None) -> int:
        """`match_prefix` walking host-only nodes too: the request's prefix and last node are its GPU part
        (`device_prefix_len`, `last_device_node`), the rest its host hit (`host_hit_length`, `best_match_node`)."""
        rec = self.request(seq)
        matched, best = self.match_prefix(tokens_of(seq), limit)
        node, host = best, 0
        while node is not self.root and node.evicted:
            host += len(node.key)
            node = node.parent
        rec.prefix_len, rec.last_node = matched - host, node
        self._best[seq.seq_id] = (best, host)
        return rec.prefix_len

    def host_hit(self, seq_id: int) -> int:
        """The host tokens the request's last match found past its GPU prefix."""
        return self._best.get(seq_id, (None, 0))[1]

    def load_back(self, rec: RequestKV) -> int:
        """init_load_back for an admitted candidate: its host hit loaded onto the GPU (`load_path`); the request's last
        node becomes the deepest loaded one, its prefix past them. The tokens loaded."""
        best, host = self._best.get(rec.seq.seq_id, (None, 0))
        if not host:
            return 0
        loaded = self.load_path(rec.last_node, best, host)
        if loaded:
            rec.last_node = best
            rec.prefix_len += loaded
        return loaded

    def load_path(self, last, best, host: int) -> int:
        """`load_back`: the `host` tokens of the host-only nodes from below `last` down to `best` loaded whole, or not
        at all: not below the threshold, nor where evicting cannot free their slots (`_load_back_transfers`, the
        path GPU-locked and host-locked meanwhile). Loaded nodes stay locked until the next pass's ack."""
        path = []
        node = best
        while node is not last:
            path.append(node)
            node = node.parent
        self._host_lock(best)
        self.inc_lock_ref(best)
        ok = host >= max(1, LOAD_BACK_THRESHOLD)
        if ok and self.available < host:
            self.evict(host - self.available)
            ok = self.available >= host
        if not ok:
            self.dec_lock_ref(best)
            self._host_unlock(best)
            self.hi.recomputed_tokens += host
            return 0
        self.available -= host
        for x in reversed(path):
            x.loading = best if self.write_back else None  # commit_load_back: pinned against reclaim until the ack
            self._unevict(x, loaded=True)
        # the load's own lock replaces the ancestors' (dec_lock_ref, then inc_lock_ref for _OngoingLoadBack): the
        # same node, so one lock held until the ack
        self.loading.append(best)
        self.hi.loaded_tokens += host
        self.hi.loads += 1
        self.hi.load_seconds += self.load_seconds(host)
        return host

    def _host_lock(self, node) -> None:
        """FullComponent.acquire_component_lock(lock_host=True): only the node itself (a one-node segment, which a
        split of it extends upward) is pinned on the host."""
        if not node.backuped and not self.write_back:
            return
        node.host_top = True
        node.host_lock += 1
        self._update_leaf(node)

    def _host_unlock(self, node) -> None:
        """release_component_lock(lock_host=True): the segment from `node` up to its top."""
        while node is not self.root:
            if not node.backuped and not self.write_back:
                return
            node.host_lock -= 1
            self._update_leaf(node)
            if node.host_top:
                return
            node = node.parent

    def _insert_request(self, seq, key: tuple[int, ...]) -> int:
        """RadixCache.checkpoint's insert with `checkpoint_into_tree`'s hit counting: the insert counts hits past the
        request's `cache_inserted_len`, which grows to the key's length; the prompt's own insert counts none."""
        inserted = self.inserted.get(seq.seq_id, 0)
        matched = self.insert(key, inserted)
        self.inserted[seq.seq_id] = max(inserted, len(key))
        prompt = seq.request_prompt_len
        if 0 < prompt < len(key):
            self.insert(key[:prompt], prompt)
        return matched

    def release(self, seq_id: int, checkpoint: bool) -> bool:
        held = super().release(seq_id, checkpoint)
        self.inserted.pop(seq_id, None)
        self._best.pop(seq_id, None)
        return held

    def host_used(self) -> int:
        return self.host_capacity - self.host_available


__all__ = ["DEFAULT_WRITE_POLICY", "HiCacheStats", "HiNode", "HiRadixCache", "LOAD_BACK_THRESHOLD", "WRITE_BACK",
           "WRITE_POLICIES", "WRITE_THROUGH", "WRITE_THROUGH_SELECTIVE"]

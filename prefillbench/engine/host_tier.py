"""A host tier below the engine's GPU blocks, as vLLM 0.32's OffloadingConnector holds it (`--kv-offloading-size`,
the native CPU backend), its scheduler side only.

- Stores: every full block the GPU cache names is stored to the host as it is computed (the connector's
  `OffloadingConnectorScheduler._build_store_jobs`, distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py:
  each scheduled request's new full blocks, after the step that computes them). A GPU eviction drops the block from
  the GPU only: its copy on the host stays until the host evicts it.
- The host evicts least recently used first (v1/kv_offload/cpu/policies/lru.py `LRUCachePolicy`): a store or a load
  touches a block (`OffloadingManager.touch`, v1/kv_offload/base.py).
- At admission, past the prefix the GPU holds (`get_computed_blocks`), the run of full blocks found on the host is
  loaded (`OffloadingConnectorScheduler.get_num_new_matched_tokens` -> `_lookup`: the longest run of consecutive hits,
  never the request's last token). vLLM always loads what it finds; here the loaded run is recomputed instead where
  the backend prices recomputing it below loading it (`recompute_seconds` below `load_seconds`: the sim's cost model
  against its host link), which is this tool's rule, not vLLM's: the load no longer costs the batch a step's time,
  but the loading request still waits for it, and that wait against its recompute is what the rule weighs.
- The load is asynchronous, as vLLM runs it (`load_kv_async`): the request gets its blocks at admission and waits
  (RequestStatus.WAITING_FOR_REMOTE_KVS, the scheduler's kv-holding queue) while the other requests' steps run; it is
  scheduled, from past the loaded tokens, at the first step that starts once its load is done (the worker's
  finished_recving, `_update_waiting_for_remote_kv`). `loading` holds the loads in flight, in admission order, each
  with the time it is done: its `load_seconds` after the later of its admission and the end of the load before it
  (`serial`: one host link, loads crossing it one after another; off, each load its own `load_seconds` from its
  admission: vllm_offload_steps' "finished N steps after" rule).

Capacity in blocks of the GPU cache's size (vLLM's offloaded block is a multiple of the GPU block; one here).
Nothing here knows of torch, llama.cpp or HTTP.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable


@dataclass
class HostTierStats:
    """Over a run: tokens loaded from the host at admission (host hits), tokens found there but recomputed because
    recomputing was priced cheaper, blocks stored and blocks the host evicted."""

    loaded_tokens: int = 0
    loads: int = 0
    load_seconds: float = 0.0  # the loads' time as the backend priced them (load_seconds)
    recomputed_tokens: int = 0
    stored_blocks: int = 0
    evicted_blocks: int = 0


@dataclass
class Load:
    """A load in flight: `blocks` host blocks past the GPU's `gpu_hit`, done at time `done`."""

    gpu_hit: int
    blocks: int
    done: float
    #: seen done by a step's scheduling (the request WAITING again, its blocks cached), scheduled or not
    promoted: bool = False


class HostTier:
    """Block hashes held in host memory, least recently used first, and the loads in flight.

    Each block held maps to the time it can be read and evicted (its store done) and the time the loads reading it
    are done (it is pinned till then): CPUOffloadingManager's `is_ready` and `ref_cnt` on a clock."""

    def __init__(self, capacity_blocks: int, load_seconds: Callable[[int], float] = lambda n: 0.0,
                 recompute_seconds: Callable[[int, int], float] | None = None, serial: bool = True,
                 store_seconds: float = 0.0) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"a host tier holds at least one block, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        #: tokens -> seconds to load them over the host link
        self.load_seconds = load_seconds
        #: (start token, tokens) -> seconds to compute them again from `start`; None: always load (vLLM)
        self.recompute_seconds = recompute_seconds
        #: hash -> [ready at, pinned until], least recently used first
        self.blocks: OrderedDict[int, list[float]] = OrderedDict()
        self.stats = HostTierStats()
        #: one link, loads crossing it one after another (False: each load alone, from its admission)
        self.serial = serial
        #: seconds from a store's issue to its block being readable (the sim: 0, stores are not priced; the proof
        #: against vLLM: its worker's steps)
        self.store_seconds = store_seconds
        #: seq_id -> its load in flight (or done and not yet scheduled), in admission order
        self.loading: dict[int, Load] = {}
        #: the engine's clock at the step being chosen (set by the engine before it asks its strategy)
        self.now = 0.0
        self._link_free = 0.0  # when the last load issued is done crossing the link
        self._finished: list[tuple[int, list[int], int]] = []  # finished requests: (seq_id, hashes, prompt blocks)
        self._offers: list[tuple[int, list[int], int]] = []  # the step's scheduled requests: (seq_id, hashes, blocks)
        #: seq_id -> the blocks of its prompt offered and stored, or found held (next_stored_chunk_idx)
        self.stored_to: dict[int, int] = {}

    def _evictable(self, state: list[float]) -> bool:
        return state[0] <= self.now and state[1] <= self.now

    def store(self, block_hash: int) -> None:
        """One computed block offered for storing (`store_run` of one)."""
        self.store_run([block_hash])

    def offer(self, seq_id: int, chain: list[int], blocks: int) -> None:
        """A request scheduled this step whose first `blocks` full prompt blocks are computed once it ran: offered
        for storing once the step is chosen (`step_chosen`), from where its last stored offer ended."""
        self._offers.append((seq_id, chain, blocks))

    def store_run(self, hashes: list[int]) -> bool:
        """A request's blocks computed by a step offered for storing at once (CPUOffloadingManager.prepare_store):
        those held already are left as they are (not touched); the others stored (most recently used, readable
        `store_seconds` on), the least recently used readable unpinned blocks not among `hashes` evicted to make
        room, or none of them stored where those are too few."""
        blocks = self.blocks
        new = [h for h in dict.fromkeys(hashes) if h not in blocks]
        if not new:
            return True
        over = len(blocks) + len(new) - self.capacity_blocks
        if over > 0:
            protected = set(hashes)
            victims = []
            for h, state in blocks.items():
                if len(victims) == over:
                    break
                if h not in protected and self._evictable(state):
                    victims.append(h)
            if len(victims) < over:
                return False  # prepare_store returns None: the store is skipped, offered again next time
            for h in victims:
                del blocks[h]
            self.stats.evicted_blocks += over
        ready = self.now + self.store_seconds
        for h in new:
            blocks[h] = [ready, 0.0]
        self.stats.stored_blocks += len(new)
        return True

    def found(self, chain: list[int], first: int, last: int) -> int | None:
        """How many consecutive blocks of `chain` from index `first` (up to `last`, excluded) the host holds; None
        where one of them is still being stored (`_maximal_prefix_lookup`: HIT_PENDING) or loaded for another request
        (`_lookup_complete_chunks`: `_chunks_being_loaded`): the lookup deferred, the request skipped this step."""
        n = 0
        blocks = self.blocks
        pending = False
        now = self.now
        for h in chain[first:last]:
            state = blocks.get(h)
            if state is None:
                break
            pending = pending or state[0] > now or state[1] > now
            n += 1
        return None if pending else n

    def to_load(self, chain: list[int], first: int, last: int, block_size: int) -> int | None:
        """Blocks to load past the GPU's `first`: the host's run, or none where recomputing it is priced cheaper;
        None where the lookup is deferred. Changes nothing (`loaded` does, once the request is admitted)."""
        n = self.found(chain, first, last)
        if n and self.recompute_seconds is not None and (
                self.recompute_seconds(first * block_size, n * block_size) < self.load_seconds(n * block_size)):
            return 0
        return n

    def declined(self, chain: list[int], first: int, last: int, block_size: int) -> int:
        """Tokens the host held past `first` that `to_load` chose to recompute."""
        n = self.found(chain, first, last)
        return n * block_size if n and not self.to_load(chain, first, last, block_size) else 0

    def loaded(self, chain: list[int], first: int, n: int, block_size: int) -> None:
        """`n` blocks from `first` loaded for an admitted request: counted (pinned by `start_load`)."""
        self.stats.loaded_tokens += n * block_size
        self.stats.loads += 1
        self.stats.load_seconds += self.load_seconds(n * block_size)

    def finished(self, seq_id: int, chain: list[int], prompt_blocks: int) -> None:
        """A finished request: its prompt's blocks offered once more and all its blocks touched, its first most
        recently used, once the next step is chosen (OffloadingConnectorScheduler.build_connector_meta: its
        finished_req_ids' stores, then on_request_finished, LRUCachePolicy)."""
        self._finished.append((seq_id, chain, prompt_blocks))

    def step_chosen(self) -> None:
        """The end of a step's scheduling (`_build_store_jobs`): each scheduled request's prompt blocks past its
        last stored offer offered in schedule order (`offload_prompt_only`, on by default), then the requests
        finished before the step; a store done, or with nothing new, moves the request's offer on, one skipped
        leaves it for the next; then the finished requests touch their blocks."""
        stored_to = self.stored_to
        for seq_id, chain, n in self._offers + self._finished:
            first = stored_to.get(seq_id, 0)
            if n > first and self.store_run(chain[first:n]):
                stored_to[seq_id] = n
        blocks = self.blocks
        for seq_id, chain, _ in self._finished:
            for h in reversed(chain):
                if h in blocks:
                    blocks.move_to_end(h)
            stored_to.pop(seq_id, None)
        self._offers.clear()
        self._finished.clear()

    def start_load(self, seq_id: int, gpu_hit: int, n: int, block_size: int, chain=()) -> Load:
        """A load of `n` blocks past `gpu_hit` issued now for `seq_id` (its blocks pinned till it is done): when it
        is done."""
        begin = max(self.now, self._link_free) if self.serial else self.now
        load = Load(gpu_hit, n, begin + self.load_seconds(n * block_size))
        if self.serial:
            self._link_free = load.done
        for h in chain[gpu_hit:gpu_hit + n]:
            state = self.blocks[h]
            state[1] = max(state[1], load.done)
        self.loading[seq_id] = load
        return load

    def load_done(self, seq_id: int) -> bool:
        """Whether `seq_id`'s load is done by now (the first step that starts after it schedules the request)."""
        return self.loading[seq_id].done <= self.now

    def next_done(self) -> float | None:
        """When the next load not yet seen done by a step is done (None: none): the engine waits for it with nothing
        else to run."""
        # one done already but not yet seen by a step (a load priced at nothing): the next step, at once
        times = [max(load.done, self.now) for load in self.loading.values() if not load.promoted]
        return min(times) if times else None


__all__ = ["HostTier", "HostTierStats", "Load"]

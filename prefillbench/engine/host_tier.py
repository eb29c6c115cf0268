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
  never the request's last token); the request waits while they load (WAITING_FOR_REMOTE_KVS). vLLM always loads
  what it finds; here the loaded run is recomputed instead where the backend prices recomputing it below loading it
  (`recompute_seconds` below `load_seconds`: the sim's cost model against its host link), which is this tool's rule,
  not vLLM's.

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


class HostTier:
    """Block hashes held in host memory, least recently used first."""

    def __init__(self, capacity_blocks: int, load_seconds: Callable[[int], float] = lambda n: 0.0,
                 recompute_seconds: Callable[[int, int], float] | None = None) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"a host tier holds at least one block, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        #: tokens -> seconds to load them over the host link
        self.load_seconds = load_seconds
        #: (start token, tokens) -> seconds to compute them again from `start`; None: always load (vLLM)
        self.recompute_seconds = recompute_seconds
        self.blocks: OrderedDict[int, None] = OrderedDict()  # hash -> None, least recently used first
        self.stats = HostTierStats()

    def store(self, block_hash: int) -> None:
        """A computed block stored (or, already held, touched); the least recently used evicted past capacity."""
        blocks = self.blocks
        if block_hash in blocks:
            blocks.move_to_end(block_hash)
            return
        blocks[block_hash] = None
        self.stats.stored_blocks += 1
        if len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
            self.stats.evicted_blocks += 1

    def found(self, chain: list[int], first: int, last: int) -> int:
        """How many consecutive blocks of `chain` from index `first` (up to `last`, excluded) the host holds."""
        n = 0
        blocks = self.blocks
        for h in chain[first:last]:
            if h not in blocks:
                break
            n += 1
        return n

    def to_load(self, chain: list[int], first: int, last: int, block_size: int) -> int:
        """Blocks to load past the GPU's `first`: the host's run, or none where recomputing it is priced cheaper.
        Changes nothing (`loaded` does, once the request is admitted)."""
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
        """`n` blocks from `first` loaded for an admitted request: touched (most recently used), counted."""
        for h in chain[first:first + n]:
            self.blocks.move_to_end(h)
        self.stats.loaded_tokens += n * block_size
        self.stats.loads += 1
        self.stats.load_seconds += self.load_seconds(n * block_size)


__all__ = ["HostTier", "HostTierStats"]

"""The torch backend's prefix cache: the cache's entries (prefillbench.backends.prefix_cache) as rows of its static KV
cache, copied.

The torch backend keeps a sequence's KV in a row of its own (gpt-fast's static cache, packed.KVCache: every
attention kernel here reads one row per sequence, contiguous), not in blocks a table points into, so a cached prefix
cannot be shared by pointing at it as vLLM's block tables do. It is copied instead:
- a prompt's computed full blocks are cached by copying its row's first positions into a free entry row;
- a prompt that starts after a cached prefix has the entry's first positions copied into its own row, and its first
  chunk continues at the position after them;
- a dropped entry (evicted, or inside a longer one) frees its row.
What a hit costs is that copy, K and V of every layer: 2 x layers x tokens x kv_heads x head_dim x the dtype's bytes
read and written again (SmolLM2-135M in float32: 46 KB a token), inside the step that starts the prompt, against the
prefill it saves. Caching costs the same copy once per new entry. The rows are the price in memory: an entry holds up
to the run's longest sequence, whatever the prefix's length.
"""
from __future__ import annotations

from prefillbench.backends.prefix import PrefixSettings, PrefixStore
from prefillbench.backends.torch.packed import KVCache
from prefillbench.step import Step

#: KV rows kept for the prefix cache's entries (each a cached prefix that branches off the others), beside the
#: run's own: gguf keeps as many llama.cpp sequence ids (gguf.PREFIX_ENTRY_IDS).
PREFIX_ENTRY_ROWS = 32


class TorchPrefixes:
    """The run's cache on the rows `rows` of `cache`."""

    def __init__(self, cache: KVCache, settings: PrefixSettings, rows: range) -> None:
        self.cache = cache
        capacity = settings.capacity // settings.block if settings.capacity else None
        # one row spare: an insertion makes its entry before it drops the ones it replaces
        self.store = PrefixStore(settings.block, capacity, max_entries=max(len(rows) - 1, 1))
        self.free = list(reversed(rows))
        self.row_of: dict[int, int] = {}  # entry -> its row in the cache
        self.copied_tokens = 0  # positions copied, into entries and out of them (the cache's cost, for the metadata)

    def _copy(self, src: int, dst: int, n: int) -> None:
        for layer in (self.cache.keys, self.cache.values):
            for t in layer:
                t[dst, :, :n].copy_(t[src, :, :n])
        self.copied_tokens += n

    def reuse(self, seq_id: int, prompt: tuple[int, ...]) -> int:
        return self.store.reuse(seq_id, prompt)

    def refreshed(self) -> dict[int, int]:
        return self.store.refreshed()

    def before(self, step: Step, row_of) -> None:
        """Before the step runs: each prompt starting after a cached prefix gets that prefix's KV in its row."""
        entries = self.store.entry
        for c in step.prefills:
            entry = entries.get(c.seq_id)
            if entry is not None and c.start > 0:
                self._copy(self.row_of[entry], row_of(c.seq_id), c.start)

    def after(self, step: Step, row_of) -> None:
        """After it ran: the full blocks each prompt has computed are cached, in an entry row of their own."""
        for c in step.prefills:
            inserted = self.store.computed(c.seq_id, c.end)
            if inserted is None:
                continue
            if inserted.entry is not None:
                row = self.row_of[inserted.entry] = self.free.pop()
                self._copy(row_of(c.seq_id), row, self.store.known[c.seq_id] * self.store.block)
            for gone in inserted.dropped:
                self.free.append(self.row_of.pop(gone))

    def release(self, seq_id: int) -> None:
        self.store.release(seq_id)

    def metadata(self) -> dict[str, object]:
        return {**self.store.metadata(), "prefix_cache_entry_rows": len(self.free) + len(self.row_of),
                "prefix_cache_copied_tokens": self.copied_tokens}

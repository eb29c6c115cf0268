"""gguf's prefix cache: the cache's entries (prefillbench.backends.prefix_cache) as llama.cpp sequence ids tagging KV cells.

llama.cpp keeps a cell's sequences as a set: `llama_memory_seq_cp(src, dst, p0, p1)` on the unified KV cache adds
`dst` to the cells `src` holds at positions [p0, p1), copying nothing (across per-sequence streams it can only copy
a whole stream's buffer, so the cache runs on the unified cache: GGUFBackend turns it on). So:
- a prompt's computed blocks are cached by tagging its cells with a free cache sequence id (an entry);
- a prompt that starts with a cached prefix has its sequence tagged onto the entry's cells for that prefix, and
  its first chunk continues at the position after it;
- a dropped entry (evicted, or inside a longer one) loses its id's tag: cells no sequence holds are free again.
The cost of a hit is one pass over the cache's cells per copy (llama.cpp's seq_cp walks every cell), against the
prefill it saves.
"""
from __future__ import annotations

from prefillbench.backends.prefix import PrefixSettings, PrefixStore
from prefillbench.step import Step


class LlamaPrefixes:
    """The run's cache on llama.cpp's memory `mem`, its entries on the sequence ids `slots`."""

    def __init__(self, llama, mem, settings: PrefixSettings, slots: range, capacity: int) -> None:
        self.llama, self.mem = llama, mem
        # one id spare: an insertion makes its entry before it drops the ones it replaces
        self.store = PrefixStore(settings.block, capacity, max_entries=max(len(slots) - 1, 1))
        self.free = list(reversed(slots))
        self.slot_of: dict[int, int] = {}  # entry -> its sequence id in llama.cpp

    def reuse(self, seq_id: int, prompt: tuple[int, ...]) -> int:
        return self.store.reuse(seq_id, prompt)

    def refreshed(self) -> dict[int, int]:
        return self.store.refreshed()

    def before(self, step: Step, slot_of) -> None:
        """Before the step runs: each prompt starting after a cached prefix takes that prefix's cells."""
        entries = self.store.entry
        for c in step.prefills:
            entry = entries.get(c.seq_id)
            if entry is not None and c.start > 0:
                self.llama.llama_memory_seq_cp(self.mem, self.slot_of[entry], slot_of(c.seq_id), 0, c.start)

    def after(self, step: Step, slot_of) -> None:
        """After it ran: the full blocks each prompt has computed are cached, under an entry of their own."""
        for c in step.prefills:
            inserted = self.store.computed(c.seq_id, c.end)
            if inserted is None:
                continue
            if inserted.entry is not None:
                slot = self.slot_of[inserted.entry] = self.free.pop()
                end = self.store.known[c.seq_id] * self.store.block
                self.llama.llama_memory_seq_cp(self.mem, slot_of(c.seq_id), slot, 0, end)
            for gone in inserted.dropped:
                slot = self.slot_of.pop(gone)
                self.llama.llama_memory_seq_rm(self.mem, slot, -1, -1)
                self.free.append(slot)

    def release(self, seq_id: int) -> None:
        self.store.release(seq_id)

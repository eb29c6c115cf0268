"""llama.cpp's llama-server schedule (`tools/server/server-context.cpp` of the llama.cpp that llama-cpp-python
0.3.36 vendors: `server_context::update_slots`, `pre_decode`, `get_available_slot`), as prefillbench's llama-server
preset launches it: `-np` slots (the run's concurrency), `-b` the budget (`chunk_size`, llama.cpp's n_batch),
continuous batching on, `--slot-prompt-similarity 0`, no speculative decoding, a text-only causal model.

Its rule, step by step (one `update_slots` call is one step):
- Every request gets a slot when it arrives (`get_available_slot`): with prompt similarity off, the idle slot least
  recently used (`t_last_used`, set when a slot is released); a slot never used has -1, and ties go to the last
  slot in index order (`slot.t_last_used <= t_last`). So a fresh server hands out its slots from the highest
  index down, and a slot freed longest ago is reused first.
- `pre_decode`: first the sampled token of every generating slot, in slot index order (`handle_last_sampled_token`);
  then, in slot index order again, every slot with prompt left adds prompt tokens while the batch holds fewer than
  n_batch (`while (... && batch.size() < n_batch)`, and no slot is looked at once it is full). Decodes count toward
  n_batch and are never left out.
- So it is Sarathi-Serve's budget, decodes first, but the prompts go in SLOT order, not oldest first: on a fresh
  server the newest request's prompt is taken first, and a prompt in progress does not go before a new one in a
  lower slot. That is where it differs from `sarathi-serve`.

What it leaves out: a batch of more than n_batch decodes is one step here, where `update_slots` runs it as several
`llama_decode` calls of n_batch each; n_ubatch splits inside `llama_decode` (cost, not schedule); context shift,
prompt checkpoints (only for models whose cache cannot be rolled back: recurrent, hybrid, SWA), prompt cache reuse,
child slots (n > 1), multimodal chunks, speculative drafts. Two slots released in the same step are taken as freed
in slot index order (`post_decode` walks the slots in order), as their `t_last_used` stamps are.

Proven step for step (`benchmarks/server/llama_steps.py`, tests/test_engine_schedules.py): on the llama-server
built from that llama.cpp, every step's prompt chunks (start, length, in batch order) and decodes equal this
strategy's on the sim for the same arrivals (209 of 209 steps, -np 6, -b 32, 40 requests); sarathi-serve's differ
in 160 of them.

The slot count: `slots` where set, else the run's concurrency cap, which the engine passes to `max_step_tokens`
just before the run starts (`engine.run`: `backend.prepare(cap, ..., strategy.max_step_tokens(longest, cap))`,
then `reset()`), the count prefillbench's preset launches llama-server with (`-np`), at most the budget: llama.cpp
aborts at load with -np above -b (it keeps an output row a slot in every batch), so the preset launches that many
and a request finding every slot taken waits in the server's queue, in arrival order, for one to be released.
"""
from __future__ import annotations

from prefillbench.sequence import Sequence
from prefillbench.step import PrefillChunk, Step

from .base import Strategy, decode_tokens, prefill_chunk


class LlamaServer(Strategy):
    name = "llama-server"
    uses_chunk_size = True
    # The slot a request gets depends on when slots were freed, which the step does not show; but between two
    # decode-only steps nothing arrives or leaves, so no slot changes hands and the next step is the same decodes.
    steady_decodes = True
    #: llama-server's -np; None: the concurrency cap the engine sizes the run with
    slots: int | None = None

    def __init__(self, chunk_size: int = 256) -> None:
        super().__init__(chunk_size)
        self._cap: int | None = None
        self.reset()

    def reset(self) -> None:
        n = self.slots or self._cap
        self.n_slots = min(n, self.chunk_size) if n is not None else None
        self.slot_of: dict[int, int] = {}  # seq_id -> slot index
        self.holder: dict[int, Sequence] = {}  # slot index -> the sequence in it
        self.last_used: dict[int, int] = {}  # slot index -> when it was released (-1: never used)
        self.clock = 0
        self.fresh = 0  # slots handed out for the first time so far (a fresh server: from the top index down)

    def next_step(self, waiting, running):
        self._release_finished()
        for seq in sorted([s for s in (*waiting, *running) if s.seq_id not in self.slot_of], key=lambda s: s.seq_id):
            if not self._assign(seq):
                break  # every slot taken: it and those after it wait in the server's queue
        slot_of = self.slot_of
        decodes = sorted(running, key=lambda s: slot_of[s.seq_id])
        slotted = sorted((s for s in waiting if s.seq_id in slot_of), key=lambda s: slot_of[s.seq_id])
        # n_batch; or a budget part's (budget.py: slo), decodes charged to it as to n_batch
        budget = (self.chunk_size if self.budget_part is None or not slotted else
                  self.step_budget(slotted, decodes)) - len(decodes)
        prefills: list[PrefillChunk] = []
        for seq in slotted:
            if budget <= 0:
                break
            chunk = prefill_chunk(seq, budget)
            prefills.append(chunk)
            budget -= len(chunk.tokens)
        return Step(prefills=tuple(prefills), decodes=decode_tokens(decodes))

    def _release_finished(self) -> None:
        # A sequence that left the lists has finished (a pipelined backend also hides those in a step in flight:
        # they keep their slot). post_decode releases in slot order: a lower slot gets the older stamp.
        for slot in sorted(s for s, seq in self.holder.items() if seq.finished):
            seq = self.holder.pop(slot)
            del self.slot_of[seq.seq_id]
            self.last_used[slot] = self.clock
            self.clock += 1

    def _assign(self, seq: Sequence) -> bool:
        """get_available_slot: the idle slot with the smallest t_last_used, the last one of a tie; never-used
        slots (-1) first, from the highest index down. False where every slot is taken."""
        idle = [s for s in self.last_used if s not in self.holder]
        if self.n_slots is None or self.fresh < self.n_slots:
            # a never-used slot is idle and older than any released one; with the count unknown, slots go from
            # 0 down: only their order matters
            top = (self.n_slots - 1) if self.n_slots is not None else -1
            slot = top - self.fresh
            self.fresh += 1
        elif idle:
            slot = max(idle, key=lambda s: (-self.last_used[s], s))
        else:
            return False
        self.last_used.setdefault(slot, -1)
        self.slot_of[seq.seq_id] = slot
        self.holder[slot] = seq
        return True

    def max_step_tokens(self, prompt_len: int, concurrency: int) -> int:
        self._cap = concurrency  # engine.run asks with the run's cap last, before reset(): the slot count (-np)
        if self.budget_part is not None:  # prompt tokens up to the part's cap, beside every decode
            return min(prompt_len * concurrency, self.chunk_size) + concurrency
        return max(min(prompt_len * concurrency, self.chunk_size), concurrency)

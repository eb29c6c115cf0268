"""SGLang's scheduler reading its radix cache (SGLang 0.5.23 with the radix cache on, `--schedule-policy lpm`): the
parts of `Scheduler.get_next_batch_to_run` that read or change the tree, for the `sglang` strategies where the
engine's memory is SGLang's radix cache (prefillbench/engine/radix_cache.py). The radix-off rules are sglang.py's,
unchanged; what differs here, each with the function it follows:

- **Waiting order** (`SchedulePolicy.calc_priority`): the waiting queue is SGLang's own list, sorted in place and
  kept so (a later pass's ties keep the order an earlier sort left); with at most 128 waiting
  (`WAITING_QUEUE_PREFIX_MATCH_MAX`), every waiting request is matched against the tree in queue order
  (`_compute_prefix_matches`: each lookup touches its path) and the queue sorted by its matched tokens, longest first
  (`_sort_by_longest_prefix`: `num_matched_prefix_tokens`, with HiCache its host hit too, at most its length less
  one), a request whose tree match is at most 32 tokens but which shares 32 or more with an earlier waiting request
  put last (in-batch prefix caching); past 128 the order is left as it is (FCFS) and every 32nd such pass touches
  the first 128 requests' prefixes, the head last (`_touch_waiting_prefixes`). Retracted requests go to its tail,
  arrivals after them.
- **Admission** (`init_next_round_input`, `PrefillAdder.add_one_req`): each candidate looks its tokens up again (at
  most all but the last), its prompt starts past what it finds and only the rest is charged; the budget counts the
  free slots plus the tree's evictable ones, read live, the candidate's own prefix pinned while it is judged (so not
  evictable); an admitted request keeps its lock. ignore_eos takes the plain path (the future simulation is for the
  radix cache off).
- **Allocation** (`prepare_for_extend` -> `alloc_token_slots`; `prepare_for_decode`): a batch's new slots at once,
  the tree's LRU leaves evicted where the free ones fall short; `check_decode_mem` evicts what a decode batch needs.
- **Chunks** (`stash_chunked_request`): a prompt in progress is put in the tree at the top of the next pass.
- **Retraction** (`retract_decode`, `release_req`): a victim's own slots are freed, its prefix left in the tree
  unlocked, then the tree evicted as far as the rest need (20 tokens each, `SGLANG_RETRACT_DECODE_STEPS`); the batch
  keeps the retraction order's order.
- **HiCache** (`--enable-hierarchical-cache`, where the engine's radix cache has a host tier: engine/hicache.py): each
  pass starts by taking the last pass's write and load acks (`_process_hicache_events`); a candidate's lookup finds
  its GPU prefix and, past it, a host hit; a candidate the budget takes (counted from its GPU prefix, as
  `_select_prefill_admission` counts `total_tokens`) has the hit loaded back (`init_load_back`) and its prompt starts
  past it, the load carried by the step (Step.host_loads) for the backend to price.
- **Batch order** (`merge_batch`, `mix_with_running`, `filter_batch`): the running batch's order, which decides the
  order requests finish in and so what is evicted first, is kept as SGLang keeps it: a prefill batch's requests
  appended after the running ones, a mixed batch's prompts before its decodes.

The engine does what process_batch_result does to the tree after each step (KVMemory.step_done).
"""
from __future__ import annotations

from prefillbench.sequence import tokens_of
from prefillbench.step import Preemption, PrefillChunk, Step

from .base import decode_tokens
from .sglang_budget import CONTINUE, NO_TOKEN, OTHER, PAGE, PrefillBudget, future_tokens

#: WAITING_QUEUE_PREFIX_MATCH_MAX (schedule_policy.py): past this many waiting, LPM falls back to FCFS
LPM_MAX_WAITING = 128
#: IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD, _DEPRIORITIZE_THRESHOLD (schedule_policy.py)
IN_BATCH_CHECK, IN_BATCH_DEPRIORITIZE = 32, 32
#: WAITING_PREFIX_REFRESH_INTERVAL (schedule_policy.py): FCFS passes between two touches of the waiting prefixes
REFRESH_INTERVAL = 32
#: SGLANG_RETRACT_DECODE_STEPS (environ.py)
RETRACT_DECODE_STEPS = 20


class RadixRules:
    """The radix-on scheduler's state and passes, mixed into the `sglang` strategies (sglang.py)."""

    radix = None

    @property
    def hicache(self) -> bool:
        """Whether the radix cache has SGLang's HiCache below it (engine/hicache.py)."""
        return self.radix is not None and self.radix.hicache

    def radix_reset(self) -> None:
        self.radix = None
        self._queue: list[int] = []  # SGLang's waiting_queue (seq ids), in its own order
        self._order: list[int] = []  # the running batch's requests, in its order
        self._last_batch: list[int] = []  # the last prefill batch's requests, in its order
        self._last_mixed = False  # that batch carried the running decodes (it becomes the running batch)
        self._refresh_calls = 0

    def radix_sync(self, waiting, running) -> None:
        """The top of a pass: the prompt in progress stashed into the tree (`stash_chunked_request`), the last
        prefill batch merged into the running batch and finished requests filtered out (their order kept), the
        waiting queue given its arrivals."""
        radix = self.radix
        if self.hicache:  # check_hicache_events: the last pass's writes and loads acknowledged, their locks dropped
            radix.events()
        if self.chunked is not None:
            rec = radix.reqs.get(self.chunked)
            if rec is not None and rec.extend_end > rec.prefix_len:
                radix.checkpoint(rec, rec.extend_end)
                rec.prefix_len = rec.extend_end
        ids = {s.seq_id for s in running}
        merged = ([] if self._last_mixed else self._order) + self._last_batch
        self._order = [i for i in merged if i in ids]
        # a running request the batches never named (the sim's pipeline hides one while its step is in flight)
        # joins at the tail: never the case with one step at a time, where the order is SGLang's
        if len(self._order) < len(ids):
            named = set(self._order)
            self._order += [s.seq_id for s in running if s.seq_id not in named]
        self._last_batch, self._last_mixed = [], False
        queued = {s.seq_id for s in waiting}
        queue = [i for i in self._queue if i in queued and i != self.chunked]
        kept = set(queue)
        queue += [s.seq_id for s in waiting if s.seq_id not in kept and s.seq_id != self.chunked]
        self._queue = queue

    def _ordered(self, running) -> list:
        by_id = {s.seq_id: s for s in running}
        return [by_id[i] for i in self._order if i in by_id]

    def _calc_priority(self, new: list) -> list:
        """SchedulePolicy.calc_priority with LPM: the queue sorted (and kept sorted) by matched tokens."""
        radix = self.radix
        if len(new) > LPM_MAX_WAITING:  # FCFS for this pass; the waiting prefixes touched every 32nd such pass
            if self._refresh_calls % REFRESH_INTERVAL == 0:
                for s in reversed(new[:LPM_MAX_WAITING]):
                    radix.match_prefix(tokens_of(s))
            self._refresh_calls += 1
            return new
        matched: dict[int, float] = {}
        seen: list[tuple[int, ...]] = []  # the in-batch tree: requests with little cached, not put last
        for s in new:
            tokens = tokens_of(s)
            found = radix.match(s)
            # num_matched_prefix_tokens (match_kv_cache): the GPU prefix and, with HiCache, the host hit past it
            total = found + radix.host_hit(s.seq_id) if self.hicache else found
            matched[s.seq_id] = -min(total, max(len(tokens) - 1, 0))
            if found <= IN_BATCH_CHECK:
                shared = max((_shared(tokens, k) for k in seen), default=0)
                if shared >= IN_BATCH_DEPRIORITIZE:
                    matched[s.seq_id] = float("inf")
                else:
                    seen.append(tokens)
        new = sorted(new, key=lambda s: matched[s.seq_id])
        self._queue = [s.seq_id for s in new]
        return new

    def radix_prefill(self, waiting, running, chunked, allocatable: int, size: int) -> Step | None:
        """_get_new_batch_prefill_raw past its early exits, reading the tree."""
        radix = self.radix
        by_id = {s.seq_id: s for s in waiting}
        new = self._calc_priority([by_id[i] for i in self._queue])
        mixed = self.mixes and bool(running)
        budget = PrefillBudget(radix.available, running, self.ratio, self.max_prefill_tokens, size,
                               len(running) if mixed else 0, bool(self.ignore_eos),
                               evictable=lambda: radix.evictable_size)
        chunks, batch = [], []
        host_loads: list[tuple[int, int]] = []
        self.chunked = None
        if chunked is not None:
            n, truncated = budget.add_chunked(chunked)
            n = min(n, int(radix.available + radix.evictable_size))  # allocation past this fails: not reached
            if n > 0:
                rec = radix.request(chunked)
                rec.extend_end = rec.prefix_len + n
                chunks.append(PrefillChunk(chunked.seq_id, tuple(chunked.prompt[rec.prefix_len:rec.extend_end]),
                                           rec.prefix_len, rec.extend_end == len(chunked.prompt)))
                batch.append(rec)
                if truncated:
                    self.chunked = chunked.seq_id
        for seq in new:
            if budget.state() == OTHER:
                break
            if len(budget.admitted) >= allocatable:
                self.batch_is_full = True
                break
            prefix = radix.match(seq, max(len(seq.prompt) - 1, 0))  # init_next_round_input
            rec = radix.request(seq)
            rec.protected = prefix
            pinned = rec.last_node
            radix.inc_lock_ref(pinned)  # the candidate's prefix pinned while it is judged
            if self.hicache and radix.host_hit(seq.seq_id) and (
                    len(seq.prompt) - prefix + future_tokens(seq) + PAGE < budget.rem_total):
                # HiCache: a candidate the budget takes, counted from its GPU prefix (_select_prefill_admission's
                # total_tokens), has its host hit loaded back (init_load_back) and starts past it; the budget's own
                # check below is then the same inequality, both sides less the tokens loaded
                loaded = radix.load_back(rec)
                # the budget reads the allocator live (_available_and_evictable): the load's evictions and slots
                budget.available = radix.available
                if loaded:
                    prefix += loaded
                    rec.protected = prefix
                    host_loads.append((seq.seq_id, loaded))
            n, verdict = budget.add_one(seq, False, prefix=prefix)
            if n:
                radix.lock(rec)
                rec.extend_end = prefix + n
                chunks.append(PrefillChunk(seq.seq_id, tuple(seq.prompt[prefix:prefix + n]), prefix,
                                           prefix + n == len(seq.prompt)))
                batch.append(rec)
                self._queue.remove(seq.seq_id)
                if prefix + n < len(seq.prompt):
                    self.chunked = seq.seq_id
            radix.dec_lock_ref(pinned)
            if verdict != CONTINUE:
                if verdict == NO_TOKEN:
                    self.batch_is_full = bool(budget.admitted) or bool(running)
                break
        if not chunks:
            return None
        radix.alloc(sum(len(c.tokens) for c in chunks))  # prepare_for_extend: the batch's slots at once
        for rec in batch:
            rec.committed = rec.extend_end
        self._last_batch = [c.seq_id for c in chunks]
        decodes = ()
        if mixed:  # check_decode_mem after the prompts' slots: the decodes sit the step out where it fails
            ordered = self._ordered(running)
            if radix.check_decode(len(ordered)):
                self._decode_slots(ordered)
                decodes = decode_tokens(ordered)
                self._last_batch += [s.seq_id for s in ordered]
                self._last_mixed = True
        return Step(prefills=tuple(chunks), decodes=decodes, policy_values=(("new_token_ratio", self.ratio),),
                    host_loads=tuple(host_loads))

    def _decode_slots(self, seqs) -> None:
        """prepare_for_decode: a slot each (evicting as short)."""
        radix = self.radix
        radix.alloc(len(seqs))
        for s in seqs:
            radix.request(s).committed += 1

    def radix_decode(self, running) -> Step:
        """update_running_batch with the tree: check_decode_mem evicting, retract_decode releasing into it."""
        radix = self.radix
        keep = self._ordered(running)
        retracted: list[Preemption] = []
        if not radix.check_decode(len(keep)):
            # fewest outputs first, ties the longest prompt (sorted descending, stable, popped from the end)
            order = sorted(range(len(keep)), key=lambda i: (len(keep[i].generated), -keep[i].request_prompt_len),
                           reverse=True)
            first = True
            while first or not radix.check_decode(len(order)):
                if len(order) == 1:
                    break
                first = False
                victim = keep[order.pop()]
                radix.release(victim.seq_id, checkpoint=False)  # release_req: not into the tree
                radix.evict_to_free(len(order) * RETRACT_DECODE_STEPS)
                retracted.append(Preemption(victim.seq_id, to_head=False))
            if len(order) <= 1 and not radix.check_decode(len(order)):
                raise RuntimeError(f"{self.name}: one request's next token does not fit the KV cache (SGLang aborts it)")
            keep = [keep[i] for i in order]  # filter_batch(keep_indices): the batch in the retraction order's order
            outputs = sum(len(s.generated) for s in keep)
            asked = sum(s.n_gen for s in keep)
            self.ratio = min(1.0, (outputs + RETRACT_DECODE_STEPS * len(keep)) / (asked + 1))
            self.batch_is_full = False
            self._queue += [p.seq_id for p in retracted]  # _add_request_to_queue: the tail
        else:
            self.ratio = max(self.ratio - self.ratio_decay, self.min_ratio)
        self._decode_slots(keep)
        self._order = [s.seq_id for s in keep]
        return Step(decodes=decode_tokens(keep), preempted=tuple(retracted),
                    policy_values=(("new_token_ratio", self.ratio),))


def _shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


__all__ = ["LPM_MAX_WAITING", "RadixRules"]

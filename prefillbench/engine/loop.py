"""The loop: ask the strategy for a step, launch it, take its tokens in; wait when nothing can start.

Every pass: retire the steps in flight that have come out, admit what has arrived, offer the strategy the
sequences that are in no step in flight, and launch its step. A backend that runs one step at a time
(`max_steps_in_flight` 1) has finished the step when `launch` returns, so the loop retires it at once; a
pipelined one (the sim's stages) holds up to that many, each retired once the clock passes its end. A decode-only
step of a steady strategy may instead run as a decode run (`decode_run`). Every STOP_CHECK_STEPS steps, `stop`
may end the run.

This is the sim's hot loop: `Loop.run` binds what it reads every pass to locals, and the per-step methods
(`launch`, `retire`) are bound once.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from itertools import repeat
from operator import add

from strategies import Strategy

from prefillbench.backends.base import Backend, BackendError, Launched
from prefillbench.engine.admission import Admission
from prefillbench.engine.drafts import accepted_tokens
from prefillbench.engine.memory import KVMemory, OutOfMemory
from prefillbench.engine.records import Progress, RequestRecord, RunRecord, StepRecord, request_record, step_record
from prefillbench.sequence import Sequence
from prefillbench.step import Step

#: Steps between two calls of run's `stop`: often enough to save most of a doomed run, rare enough to cost little
#: (a check reads every sequence in flight: on the sim, 2-3% of a probe that runs to its end). A count of steps,
#: not a time, so that where a run stops, and what it reports, is the same on every machine.
STOP_CHECK_STEPS = 256


class StepFailed(BackendError):
    """A backend could not execute a step; says which one."""


class Loop:
    """One run from its start to its record: the steps in flight and the records of what has come out."""

    __slots__ = ("backend", "strategy", "admission", "memory", "paged", "ahead", "late", "depth", "pipelined", "steady",
                 "keep_logits", "on_tokens", "stop", "start", "live", "waiting", "running", "in_flight", "busy", "done",
                 "done_ids", "steps", "logits", "spec", "proposer")

    def __init__(self, backend: Backend, strategy: Strategy, admission: Admission, memory: KVMemory, depth: int,
                 steady: bool, keep_logits: bool, on_tokens: Callable[[int], None] | None,
                 stop: Callable[[Progress], bool] | None, spec=None, proposer=None) -> None:
        self.backend = backend
        self.strategy = strategy
        self.admission = admission
        self.memory = memory  # the engine's KV memory: paged, each step's tokens take blocks as they are computed
        self.paged = strategy.kv_policy == "paged"
        # Async scheduling (vLLM V1's on GPUs, SGLang's overlap loop): the engine chooses the next step before the
        # last one's tokens are in, so a request that finished in it still holds its blocks when the next is chosen:
        # its memory is freed a step late (`late`, freed once the next step is chosen).
        self.ahead = self.paged and backend.schedules_ahead
        self.late: list[int] = []
        self.depth = depth  # most steps in flight
        self.pipelined = depth > 1  # then sequences in a step in flight are busy
        self.steady = steady  # decode runs allowed
        self.keep_logits = keep_logits
        self.on_tokens = on_tokens
        self.stop = stop
        self.start = admission.start
        self.live, self.waiting, self.running = admission.live, admission.waiting, admission.running
        self.in_flight: list[tuple[Step, Launched]] = []  # in launch order
        self.busy: set[int] = set()  # sequences inside an in-flight step
        self.done: list[RequestRecord] = []  # in the order they finished
        self.done_ids: list[int] = []
        self.steps: list[StepRecord] = []
        self.logits: dict[int, list] = {}
        # Speculative decoding (prefillbench/speculation.py): the run's settings and its drafter (engine/drafts.py);
        # None: off, and the loop is as it was.
        self.spec = spec
        self.proposer = proposer

    def run(self) -> RunRecord:
        """Step until every request has finished or `stop` ends the run; what happened."""
        backend, strategy, depth, steady, stop = self.backend, self.strategy, self.depth, self.steady, self.stop
        live, waiting, running, in_flight, busy, steps = (self.live, self.waiting, self.running, self.in_flight,
                                                          self.busy, self.steps)
        admission = self.admission
        pending, admit, next_arrival = admission.pending, admission.admit, admission.next_arrival
        launch, retire, decode_run = self.launch, self.retire, self.decode_run
        # steady only while no prompt waits (SGLang's: a waiting prompt is tried against its ratio every step)
        while_none_waits = steady and not strategy.steady_decodes
        refreshed = backend.refreshed_prefixes if admission.reuse is not None else None
        stopped = False
        feed = admission.feed
        host = self.memory.host_tier if self.memory is not None else None
        while live or pending or admission.awaiting:
            if feed is not None:
                admission.take_fed()
            now = backend.now()
            if in_flight:
                for item in [f for f in in_flight if f[1].end <= now]:
                    in_flight.remove(item)
                    retire(*item)
            if now >= admission.next_at:  # one may have arrived (always so in a closed loop): not a call every pass
                admit(now)
            if not live and not pending and not admission.awaiting:
                break
            if refreshed is not None:  # a prompt not started yet may find more of itself cached now
                for seq_id, cached in refreshed().items():
                    seq = live[seq_id]
                    seq.n_prefilled = seq.n_cached = cached
            # with one step at a time nothing is busy here
            if busy:
                ready_waiting = [s for s in waiting if s.seq_id not in busy]
                ready_running = [s for s in running if s.seq_id not in busy]
            else:
                ready_waiting, ready_running = waiting, running
            ready = bool(ready_waiting or ready_running)
            if ready and len(in_flight) < depth:
                if host is not None:  # an async load is done at the first step that starts after its time
                    host.now = now
                step = strategy.next_step(ready_waiting, ready_running)
                if step.preempted:
                    self.preempt(step)
                    if not step:  # it preempted and scheduled nothing: ask again with the memory it freed
                        continue
                if self.late:  # chosen: what finished before it is seen now
                    for seq_id in self.late:
                        self.memory.free(seq_id)
                    self.late.clear()
                    if not step:  # the memory they held was all that kept the rest waiting
                        continue
                if step:
                    if not (steady and not step.prefills and not (while_none_waits and waiting)
                            and decode_run(step)):
                        launched = launch(step)
                        if depth == 1:
                            retire(step, launched)  # done (Backend.launch): what the loop's next pass would do first
                        else:
                            in_flight.append((step, launched))
                    if stop is not None and len(steps) % STOP_CHECK_STEPS == 0 and (live or pending) and stop(
                            Progress(self.start, backend.now(), self.done, list(live.values()), pending)):
                        stopped = True
                        break
                    continue
            # Nothing to start now: let time pass to the next step out or the next arrival.
            events = [launched.end for _, launched in in_flight]
            if (t := next_arrival()) is not None:
                events.append(t)
            if host is not None and (t := host.next_done()) is not None:  # a load in flight, its request waiting
                events.append(t)
            if admission.awaiting:  # the feed may bring work before the next event: wait on it, up to that event
                feed.wait(max(min(events) - backend.now(), 0.0) if events else None)
                continue
            if not events:
                raise RuntimeError(f"strategy {strategy.name} produced an empty step with work left")
            if not in_flight and admission.idle_from is None:
                admission.idle_from = backend.now()
                if not live:
                    strategy.idle()
            backend.wait_until(min(events), stalled=ready and len(in_flight) >= depth, idle=not in_flight)
        return self.record(stopped)

    def record(self, stopped: bool) -> RunRecord:
        """The run's record, its requests in admission order; tells the backend the run is over."""
        backend = self.backend
        if stopped:  # the steps in flight are left unretired: their sequences are dropped with the rest
            for seq_id in list(self.live):
                backend.release(seq_id)
        end = backend.now()
        backend.end_run()
        done = self.done
        order = sorted(range(len(done)), key=self.done_ids.__getitem__)
        memory = self.memory
        return RunRecord(self.start, end, [done[i] for i in order], self.steps, stopped,
                         arrival_lags=self.admission.arrival_lags,
                         kv_peak_fraction=memory.peak_fraction(), kv_policy=self.strategy.kv_policy,
                         kv_cache=memory.cache_stats)

    def failed(self, step: Step, e: BackendError) -> StepFailed:
        return StepFailed(f"step {len(self.steps)} ({step.n_tokens} tokens) failed: {e}")

    def preempt(self, step: Step) -> None:
        """Carry out a step's preemptions (vLLM) or retractions (SGLang) before it runs: each sequence's blocks
        freed, its KV dropped by the backend, its tokens so far its prompt again, back to waiting at the head or the
        tail. Heads are put in the step's order, each before the last: vLLM pops its victims from the tail of
        RUNNING and prepends each, so they end in their running order."""
        live, waiting, running, memory, backend = self.live, self.waiting, self.running, self.memory, self.backend
        reuse = self.admission.reuse
        gone = {p.seq_id for p in step.preempted}
        running[:] = [s for s in running if s.seq_id not in gone]
        waiting[:] = [s for s in waiting if s.seq_id not in gone]
        for p in step.preempted:
            seq = live[p.seq_id]
            seq.drafts = []  # its next token comes from a prompt again
            memory.free(seq.seq_id)
            backend.release(seq.seq_id)
            first_hit = seq.n_cached
            seq.preempt(p.to_head)
            if memory.shares_prefixes:  # its first lookup's hit stays its own (vLLM's prefix_cache_hits)
                seq.n_cached = first_hit
            if reuse is not None:  # resumed, it looks its tokens up again (vLLM's get_computed_blocks)
                seq.n_prefilled = seq.n_cached = reuse(seq.seq_id, seq.prompt)
            if p.to_head:
                waiting.insert(0, seq)
            else:
                waiting.append(seq)

    def launch(self, step: Step) -> Launched:
        """Hand `step` to the backend and record it; its sequences are busy until it is retired."""
        if self.paged:  # the blocks its tokens fill, taken before it runs (vLLM's allocate_slots)
            grow = self.memory.grow
            try:
                for c in step.prefills:
                    grow(c.seq_id, c.end + c.pad)
                for d in step.decodes:
                    grow(d.seq_id, d.position + 1 + len(d[3]))  # its drafts' slots too (vLLM's allocate_slots)
            except OutOfMemory as e:
                raise RuntimeError(f"strategy {self.strategy.name} scheduled past the KV memory: {e}") from None
        try:
            launched = self.backend.launch(step, return_logits=self.keep_logits)
        except BackendError as e:
            raise self.failed(step, e) from None
        record = step_record(step, launched.start, launched.end)
        if self.proposer is not None:
            record.drafts = step.n_draft_tokens
        if step.preempted:
            record.preempted = len(step.preempted)
        self.steps.append(record)
        self.admission.idle_from = None
        # A decoding sequence had its prompt in an earlier step: only a prompt chunk can be a first schedule.
        for chunk in step.prefills:
            seq = self.live[chunk.seq_id]
            if chunk.start > seq.n_prefilled:  # the engine's block cache held the tokens before it (vllm-v1's lookup)
                found = chunk.start - seq.n_prefilled
                if seq.first_scheduled is None:
                    seq.n_cached = chunk.start
                else:  # a preempted sequence finding its own blocks again: those tokens are not computed again
                    seq.found_again += found
                    seq.recomputed -= min(found, seq.recomputed)
                seq.n_prefilled = chunk.start
            if seq.first_scheduled is None:
                seq.first_scheduled = launched.start
                record.cached += seq.n_cached
            elif seq.earlier:
                record.resumed_chunks += 1
                record.resumed_tokens += len(chunk.tokens)
        if self.pipelined:
            self.busy.update([c.seq_id for c in step.prefills])
            self.busy.update([d.seq_id for d in step.decodes])
        return launched

    def retire(self, step: Step, launched: Launched) -> None:
        """Take a step's results in: prompts advance (a finished one moves to running), tokens are appended, and
        the sequences that finished leave."""
        result = launched.result
        live = self.live
        prefilled = []
        for chunk in step.prefills:
            seq = live[chunk.seq_id]
            seq.n_prefilled = chunk.end
            if seq.prefill_done:
                prefilled.append(seq)
        if self.pipelined:
            self.busy.difference_update([c.seq_id for c in step.prefills])
            self.busy.difference_update([d.seq_id for d in step.decodes])
        finished = []
        end = launched.end
        if self.keep_logits and result.logits is not None:
            logits = self.logits
            for seq_id in result.next_tokens:
                logits.setdefault(seq_id, []).append(result.logits[seq_id])
        if self.proposer is not None:
            self.take_verified(step, result, end, finished)
        else:
            for seq_id, token in result.next_tokens.items():
                seq = live[seq_id]
                if seq.forced_tokens is None:  # Sequence.append_token written out: once per token of a run
                    generated = seq.generated
                    generated.append(token)
                    seq.token_times.append(end)
                    if len(generated) >= seq.n_gen and seq.n_prefilled >= len(seq.prompt):  # Sequence.finished
                        finished.append(seq)
                elif seq.append_token(token, end):
                    finished.append(seq)
        if self.on_tokens is not None:  # prompt tokens count as work: a 512-token prefill is not one token of progress
            self.on_tokens(sum(len(c.tokens) for c in step.prefills) + step.n_decode_tokens)
        if self.memory.radix is not None:  # SGLang's process_batch_result on its tree, in the batch's order
            self.memory.step_done(step, live, finishes=not self.ahead)
        if prefilled:
            waiting, running = self.waiting, self.running
            waiting[:] = [s for s in waiting if s.n_prefilled < len(s.prompt)]
            # A prompt that was its request's whole work (one token to generate) never decodes.
            moved = [s for s in prefilled if not s.finished]
            if moved:
                running.extend(moved)
                running.sort(key=lambda s: s.seq_id)  # a step may finish a younger prompt before an older one
        if finished:
            self.leave(finished)
        if self.proposer is not None:
            self.propose(step)

    def take_verified(self, step: Step, result, end: float, finished: list[Sequence]) -> None:
        """Speculative decoding's retire: a decode that carried drafts keeps the longest prefix the target agreed
        with plus the target's next token (1..K+1 tokens, never past the request's output length), every one
        stamped at the step's end, when they all appear (TBT: see docs/speculative-decoding.md); the rejected drafts'
        KV is rolled back in the backend and the blocks left empty freed."""
        live, verified = self.live, result.verified
        fed = {d.seq_id: d for d in step.decodes}
        for seq_id, token in result.next_tokens.items():
            seq = live[seq_id]
            d = fed.get(seq_id)
            if d is not None:
                seq.n_decode_steps += 1
            if d is None or not d.drafts:
                if seq.append_token(token, end):
                    finished.append(seq)
                continue
            try:
                tokens = accepted_tokens(d.drafts, verified[seq_id])
            except KeyError:
                raise self.failed(step, BackendError(f"no verified tokens for sequence {seq_id}'s drafts")) from None
            seq.n_verify_steps += 1
            seq.n_drafted += len(d.drafts)
            seq.n_accepted += len(tokens) - 1
            done = False
            for t in tokens[:seq.n_gen - len(seq.generated)]:
                done = seq.append_token(t, end)
            if done:
                finished.append(seq)
            elif len(tokens) <= len(d.drafts):  # a draft was rejected: its KV and the ones after it go
                kept = d.position + len(tokens)  # positions 0 .. position + accepted drafts
                self.backend.truncate(seq_id, kept)
                if self.paged:
                    self.memory.shrink(seq_id, kept)

    def propose(self, step: Step) -> None:
        """Drafts for the next step of every sequence this step gave a token and that still decodes (vLLM's
        propose_draft_token_ids after each forward pass), at most what its output has left less one: a verify step
        emits up to K+1 tokens, and none past the request's length is ever computed."""
        live, proposer, spec = self.live, self.proposer, self.spec
        # Dynamic K: vLLM's is that of the requests the step scheduled, prompt chunks included (schedule()'s
        # num_spec_tokens_to_schedule = dynamic_sd_lookup[len(num_scheduled_tokens)]).
        k = spec.k_for_batch(len(step.prefills) + len(step.decodes)) if spec.k_by_batch else spec.k
        # An engine whose drafter knows no output length (vLLM's) drafts K on a request's last steps too.
        past = self.strategy.drafts_past_output
        for seq_id in step.emitting_seq_ids:
            seq = live.get(seq_id)
            if seq is None or not seq.prefill_done:
                continue
            room = k if past else min(k, seq.n_gen - len(seq.generated) - 1)
            seq.drafts = proposer.propose(seq, room) if room > 0 else []

    def leave(self, finished: list[Sequence]) -> None:
        """Only a sequence that just got a token can have finished; admission (seq_id) order, as live keeps it."""
        finished.sort(key=lambda s: s.seq_id)
        running = self.running
        running[:] = [s for s in running if not s.finished]
        backend, live, done, done_ids, logits = self.backend, self.live, self.done, self.done_ids, self.logits
        cached = self.admission.reuse is not None or self.memory.shares_prefixes
        finish = self.admission.finished
        free = self.late.append if self.ahead else self.memory.free
        for seq in finished:
            free(seq.seq_id)
            backend.release(seq.seq_id)
            del live[seq.seq_id]
            finish(seq)
            done_ids.append(seq.seq_id)
            done.append(request_record(seq, logits.pop(seq.seq_id, []), cached))

    def decodes_in_memory(self, step: Step, most: int) -> int:
        """The most decode steps in a row, up to `most`, whose blocks all fit in the free ones: within them no
        running sequence fails to grow, so a paged strategy would preempt nothing and (no finish freeing any)
        admit nothing, and its next step is the same decodes (bisection: the blocks needed grow with the steps)."""
        memory = self.memory
        needed, free = memory.needed, memory.free_blocks

        def fits(k: int) -> bool:
            return sum([needed(d.seq_id, d.position + k) for d in step.decodes]) <= free

        lo, hi = 0, most
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        return lo

    def decode_run(self, step: Step) -> bool:
        """Run the decode-only `step` and the same decodes after it, for as long as nothing could change the
        strategy's next step: up to the first finish, the next admission, the next stop check. Whether the backend
        could (Backend.run_decodes); the result is what launching each step alone gives, step records included."""
        live, steps = self.live, self.steps
        seqs = [live[d.seq_id] for d in step.decodes]
        most = min([s.n_gen - len(s.generated) for s in seqs])  # the step that finishes the first of them ends it
        if self.stop is not None:
            most = min(most, STOP_CHECK_STEPS - len(steps) % STOP_CHECK_STEPS)
        if most < 2:
            return False
        memory = self.memory
        if self.paged and memory.total_blocks is not None:
            most = self.decodes_in_memory(step, most)
            if most < 2:
                return False
        arrival = self.admission.next_arrival()
        host = memory.host_tier if memory is not None else None
        if host is not None and (done := host.next_done()) is not None:  # a load done lets its request in
            arrival = done if arrival is None else min(arrival, done)
        try:
            burst = self.backend.run_decodes(step, most, math.inf if arrival is None else arrival)
        except BackendError as e:
            raise self.failed(step, e) from None
        if burst is None:
            return False
        ends, tokens = burst.ends, burst.tokens
        contexts = [d.position + 1 for d in step.decodes]
        n = len(contexts)
        begin = burst.start
        first = len(steps)
        for i, end in enumerate(ends):
            steps.append(StepRecord(begin, end, [], 0, list(map(add, contexts, repeat(i, n)))))
            begin = end
        if step.preempted:  # carried out before the run's first step (Loop.preempt)
            steps[first].preempted = len(step.preempted)
        if step.policy_values:
            steps[first].policy_values = step.policy_values
        # the steps after the first were never asked for: the strategy moves its state as choosing each would have
        values = self.strategy.ran_decodes(len(ends) - 1)
        if values:
            for record, policy_values in zip(steps[first + 1:], values):
                record.policy_values = policy_values
        for seq in seqs:
            seq.generated.extend(tokens[seq.seq_id])
            seq.token_times.extend(ends)
        if self.paged:  # after the tokens are in: a block cache names the blocks they fill by them
            grow = memory.grow
            for d in step.decodes:
                grow(d.seq_id, d.position + len(ends))
        if self.on_tokens is not None:
            self.on_tokens(n * len(ends))
        finished = [s for s in seqs if s.finished]
        if finished and memory.radix is not None:  # the last step's finishes into the tree in its batch's order
            memory.step_done(step, live, finishes=not self.ahead)
        if finished:
            self.leave(finished)
        return True

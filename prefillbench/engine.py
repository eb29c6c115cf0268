"""The engine: feeds a strategy's steps to a backend and records when every token appeared.

Requests enter in one of two ways:
- closed loop (requests without an arrival time): `concurrency` of them are in
  flight from the start, and each one that finishes is replaced by the next, so
  fresh prefills keep meeting running decodes;
- open loop (every request has `arrival_s`, seconds after the run starts): a
  request is admitted once it has arrived and fewer than `concurrency` are in
  flight (0: no cap; later ones queue). When nothing can run before the next
  arrival the backend waits for it (`Backend.wait_until`: wall time on a real
  backend, the virtual clock on the sim).

A backend may hold several steps at once (the sim's pipeline stages,
`Backend.max_steps_in_flight`): a sequence whose step has not come out yet is
not offered to the strategy again, since its next token does not exist yet.
A strategy sees only `waiting` and `running`, never arrivals.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import repeat
from operator import add

from strategies import Strategy

from prefillbench.backends.base import Backend, BackendError, Launched
from prefillbench.sequence import Sequence
from prefillbench.step import Step
from prefillbench.sequence import Request


@dataclass
class StepRecord:
    start: float
    end: float
    prefill_chunks: list[tuple[int, int]]  # (start position, length) of each chunk
    n_pad: int
    decode_contexts: list[int]  # context length each decode token attends to
    chunk_emits: int = 0  # prompt chunks that were their prompt's last, so emitted a token (the decodes all do)

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class RequestRecord:
    prompt_len: int
    arrival: float
    token_times: list[float]
    tokens: list[int]
    logits: list = field(default_factory=list)
    #: Start of the first step that carried the request; its scheduling delay is this minus `arrival`.
    first_scheduled: float | None = None


@dataclass
class RunRecord:
    start: float
    end: float
    requests: list[RequestRecord]  # when stopped: only the finished ones
    steps: list[StepRecord]
    stopped: bool = False  # ended by `stop` before every request finished

    @property
    def wall(self) -> float:
        return self.end - self.start


@dataclass
class Progress:
    """A run so far, for a caller that can tell its outcome before it ends (capacity's certain failures).
    Times are the backend's clock; `pending` are the requests not admitted yet, by arrival."""

    start: float
    now: float
    finished: list[RequestRecord]  # in the order they finished
    live: list[Sequence]
    pending: deque[Request]


#: Steps between two calls of run's `stop`: often enough to save most of a doomed run, rare enough to cost little
#: (a check reads every sequence in flight: on the sim, 2-3% of a probe that runs to its end). A count of steps,
#: not a time, so that where a run stops, and what it reports, is the same on every machine.
STOP_CHECK_STEPS = 256


class StepFailed(BackendError):
    """A backend could not execute a step; says which one."""


def _step_record(step: Step, start: float, end: float) -> StepRecord:
    prefills = step.prefills
    if not prefills:  # most steps on the sim: one record per simulated step
        return StepRecord(start, end, [], 0, [d.position + 1 for d in step.decodes])
    return StepRecord(start, end, [(c.start, len(c.tokens)) for c in prefills], step.n_pad_tokens,
                      [d.position + 1 for d in step.decodes], sum([c.is_last for c in prefills]))


def _check_arrivals(requests: list[Request]) -> bool:
    """Whether the run is an open loop; the requests must agree."""
    timed = [r.arrival_s is not None for r in requests]
    if any(timed) and not all(timed):
        raise ValueError("either every request has an arrival time or none has")
    if all(timed) and min(r.arrival_s for r in requests) < 0:
        raise ValueError("arrival times cannot be negative")
    return all(timed)


def run(
    backend: Backend,
    strategy: Strategy,
    requests: Iterable[Request],
    concurrency: int,
    *,
    keep_logits: bool = False,
    on_tokens: Callable[[int], None] | None = None,
    stop: Callable[[Progress], bool] | None = None,
) -> RunRecord:
    """Run every request to completion and return what happened, with timestamps.

    `concurrency`: requests in flight (closed loop), or at most in flight (open
    loop, where 0 means no cap). `on_tokens`: called after each step with the tokens it processed (prompt
    tokens of its chunks, pads left out, plus its decodes), for a progress bar that counts work. `stop`: asked
    every STOP_CHECK_STEPS steps whether the run's outcome is already known; True ends it there (`stopped`).
    """
    reqs = list(requests)
    if not reqs:
        raise ValueError("a run needs at least one request")
    open_loop = _check_arrivals(reqs)
    if concurrency < (0 if open_loop else 1):
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if open_loop:
        reqs.sort(key=lambda r: r.arrival_s)  # stable: ties keep their order
    cap = min(concurrency or len(reqs), len(reqs))
    pending = deque(reqs)
    longest_prompt = max(len(r.prompt) for r in reqs)
    max_seq_len = max(len(r.prompt) + r.n_gen for r in reqs)
    if max_seq_len > backend.context_length:
        raise BackendError(
            f"a prompt of {longest_prompt} tokens plus its generation needs {max_seq_len} positions; "
            f"the model's context is {backend.context_length}"
        )
    # Backends with a bounded KV cache (the sim) cap the sequences in flight: the strategies only see those.
    # Fewer sequences need smaller steps, which leave more room for cache: find the most that fit with their steps.
    def fits(n: int) -> bool:
        allowed = backend.max_concurrency(max_seq_len, strategy.max_step_tokens(longest_prompt, n))
        return allowed is None or allowed >= n

    if not fits(cap):
        lo, hi = 0, cap
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        if lo < 1:
            raise BackendError(f"not one sequence of {max_seq_len} tokens fits in {backend.room()}")
        backend.note_clamp(cap, lo)
        cap = lo
    backend.prepare(cap, max_seq_len, strategy.max_step_tokens(longest_prompt, cap))
    depth = max(1, backend.max_steps_in_flight)
    strategy.reset()
    # Decode runs (decode_run) skip the strategy and the step-by-step bookkeeping, where the backend can run them;
    # a forced token or kept logits need every step's own.
    steady = (strategy.steady_decodes and backend.runs_decodes and depth == 1 and not keep_logits
              and all(r.forced_tokens is None for r in reqs))

    next_id = 0
    live: dict[int, Sequence] = {}
    # The strategy's two lists, kept as sequences move between them rather than rebuilt from `live` every step
    # (a pass over every sequence in flight per step: a tenth of the sim's time). Both in admission order.
    waiting: list[Sequence] = []  # prompt not fully processed
    running: list[Sequence] = []  # decoding
    in_flight: list[tuple[Step, Launched]] = []  # in launch order
    busy: set[int] = set()  # sequences inside an in-flight step
    done: list[RequestRecord] = []
    done_ids: list[int] = []
    steps: list[StepRecord] = []
    logits: dict[int, list] = {}
    start = backend.now()
    stopped = False

    def next_arrival() -> float | None:
        """When the next queued request may be admitted; None if it may be now or never before a finish."""
        if not pending or len(live) >= cap or not open_loop:
            return None
        return start + pending[0].arrival_s

    def admit(now: float) -> None:
        nonlocal next_id
        while pending and len(live) < cap:
            if open_loop and start + pending[0].arrival_s > now:
                break
            req = pending.popleft()
            arrival = start + req.arrival_s if open_loop else now
            seq = live[next_id] = Sequence.admit(next_id, req, arrival)
            (running if seq.prefill_done else waiting).append(seq)
            next_id += 1

    def failed(step: Step, e: BackendError) -> StepFailed:
        return StepFailed(f"step {len(steps)} ({step.n_tokens} tokens) failed: {e}")

    def launch(step: Step) -> Launched:
        try:
            launched = backend.launch(step, return_logits=keep_logits)
        except BackendError as e:
            raise failed(step, e) from None
        steps.append(_step_record(step, launched.start, launched.end))
        # A decoding sequence had its prompt in an earlier step: only a prompt chunk can be a first schedule.
        for chunk in step.prefills:
            seq = live[chunk.seq_id]
            if seq.first_scheduled is None:
                seq.first_scheduled = launched.start
        if depth > 1:
            busy.update([c.seq_id for c in step.prefills])
            busy.update([d.seq_id for d in step.decodes])
        return launched

    def retire(step: Step, launched: Launched) -> None:
        result = launched.result
        prefilled = []
        for chunk in step.prefills:
            seq = live[chunk.seq_id]
            seq.n_prefilled = chunk.end
            if seq.prefill_done:
                prefilled.append(seq)
        if depth > 1:
            busy.difference_update([c.seq_id for c in step.prefills])
            busy.difference_update([d.seq_id for d in step.decodes])
        finished = []
        end = launched.end
        if keep_logits and result.logits is not None:
            for seq_id in result.next_tokens:
                logits.setdefault(seq_id, []).append(result.logits[seq_id])
        for seq_id, token in result.next_tokens.items():
            seq = live[seq_id]
            if seq.append_token(token, end):
                finished.append(seq)
        if on_tokens is not None:  # prompt tokens count as work: a 512-token prefill is not one token of progress
            on_tokens(sum(len(c.tokens) for c in step.prefills) + len(step.decodes))
        if prefilled:
            waiting[:] = [s for s in waiting if s.n_prefilled < len(s.prompt)]
            # A prompt that was its request's whole work (one token to generate) never decodes.
            moved = [s for s in prefilled if not s.finished]
            if moved:
                running.extend(moved)
                running.sort(key=lambda s: s.seq_id)  # a step may finish a younger prompt before an older one
        if finished:
            leave(finished)

    def leave(finished: list[Sequence]) -> None:
        """Only a sequence that just got a token can have finished; admission (seq_id) order, as live keeps it."""
        finished.sort(key=lambda s: s.seq_id)
        running[:] = [s for s in running if not s.finished]
        for seq in finished:
            backend.release(seq.seq_id)
            del live[seq.seq_id]
            done_ids.append(seq.seq_id)
            done.append(RequestRecord(seq.prompt_len, seq.arrival, seq.token_times, seq.generated,
                                      logits.pop(seq.seq_id, []), seq.first_scheduled))

    def decode_run(step: Step) -> bool:
        """Run the decode-only `step` and the same decodes after it, for as long as nothing could change the
        strategy's next step: up to the first finish, the next admission, the next stop check. Whether the backend
        could (Backend.run_decodes); the result is what launching each step alone gives, step records included."""
        seqs = [live[d.seq_id] for d in step.decodes]
        most = min([s.n_gen - len(s.generated) for s in seqs])  # the step that finishes the first of them ends it
        if stop is not None:
            most = min(most, STOP_CHECK_STEPS - len(steps) % STOP_CHECK_STEPS)
        if most < 2:
            return False
        arrival = next_arrival()
        try:
            burst = backend.run_decodes(step, most, math.inf if arrival is None else arrival)
        except BackendError as e:
            raise failed(step, e) from None
        if burst is None:
            return False
        ends, tokens = burst.ends, burst.tokens
        contexts = [d.position + 1 for d in step.decodes]
        n = len(contexts)
        begin = burst.start
        for i, end in enumerate(ends):
            steps.append(StepRecord(begin, end, [], 0, list(map(add, contexts, repeat(i, n)))))
            begin = end
        for seq in seqs:
            seq.generated.extend(tokens[seq.seq_id])
            seq.token_times.extend(ends)
        if on_tokens is not None:
            on_tokens(n * len(ends))
        finished = [s for s in seqs if s.finished]
        if finished:
            leave(finished)
        return True

    while live or pending:
        now = backend.now()
        if in_flight:
            for item in [f for f in in_flight if f[1].end <= now]:
                in_flight.remove(item)
                retire(*item)
        admit(now)
        if not live and not pending:
            break
        # with one step at a time nothing is busy here
        if busy:
            ready_waiting = [s for s in waiting if s.seq_id not in busy]
            ready_running = [s for s in running if s.seq_id not in busy]
        else:
            ready_waiting, ready_running = waiting, running
        ready = bool(ready_waiting or ready_running)
        if ready and len(in_flight) < depth:
            step = strategy.next_step(ready_waiting, ready_running)
            if step:
                if not (steady and not step.prefills and decode_run(step)):
                    launched = launch(step)
                    if depth == 1:
                        retire(step, launched)  # done (Backend.launch): what the loop's next pass would do first
                    else:
                        in_flight.append((step, launched))
                if stop is not None and len(steps) % STOP_CHECK_STEPS == 0 and (live or pending) and stop(
                        Progress(start, backend.now(), done, list(live.values()), pending)):
                    stopped = True
                    break
                continue
        # Nothing to start now: let time pass to the next step out or the next arrival.
        events = [launched.end for _, launched in in_flight]
        if (t := next_arrival()) is not None:
            events.append(t)
        if not events:
            raise RuntimeError(f"strategy {strategy.name} produced an empty step with work left")
        backend.wait_until(min(events), stalled=ready and len(in_flight) >= depth, idle=not in_flight)
    if stopped:  # the steps in flight are left unretired: their sequences are dropped with the rest
        for seq_id in list(live):
            backend.release(seq_id)
    end = backend.now()
    backend.end_run()
    order = sorted(range(len(done)), key=done_ids.__getitem__)
    return RunRecord(start, end, [done[i] for i in order], steps, stopped)

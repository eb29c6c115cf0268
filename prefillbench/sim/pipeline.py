"""Pipeline parallelism as a pipeline: micro-batches flowing through stage queues on the virtual clock.

Up to `pp` micro-batches are in flight. Whenever stage 0 is free and a slot is
open, the unchanged strategy builds the next micro-batch from the sequences
that are not in flight (a sequence whose micro-batch has not left the last
stage cannot be scheduled again: its next token does not exist yet). Each
stage is a FIFO queue: a micro-batch starts on stage k when it has left stage
k-1 (its activations sent) and stage k has finished the one before it.

A bubble is a stage's idle time while work waits: on stage k > 0, the part
of its idle gap before a micro-batch during which that micro-batch was already
in the pipeline upstream; on stage 0, the time schedulable sequences waited for
one of the `pp` slots. Each gap is charged to every request in the micro-batch
that closes it; the report gives the median per request and each stage's busy
fraction.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Any

from prefillbench.engine import RequestRecord, RunRecord, StepRecord, _step_record
from prefillbench.sequence import Sequence
from prefillbench.step import Step
from prefillbench.workloads import Request

from .cost import Batch

if TYPE_CHECKING:
    from prefillbench.backends.sim_backend import SimBackend


@dataclass
class MicroBatch:
    step: Step
    starts: list[float]
    ends: list[float]
    bubble: float  # idle time of the stages just before this micro-batch started on them
    seq_ids: list[int] = field(default_factory=list)

    @property
    def exit(self) -> float:
        return self.ends[-1]


def run_pipeline(
    backend: "SimBackend",
    strategy,
    requests: list[Request],
    concurrency: int,
    *,
    on_token: Callable[[int], None] | None = None,
) -> tuple[RunRecord, dict[str, Any]]:
    pp = backend.pp
    pending = deque(requests)
    if not pending:
        raise ValueError("a run needs at least one request")
    longest_prompt = max(len(r.prompt) for r in pending)
    max_seq_len = max(len(r.prompt) + r.n_gen for r in pending)
    backend.prepare(min(concurrency, len(pending)), max_seq_len, strategy.max_step_tokens(longest_prompt, concurrency))

    start = backend.now()
    stage_free = [start] * pp
    stage_used = [False] * pp
    busy = [0.0] * pp
    live: dict[int, Sequence] = {}
    in_flight: set[int] = set()
    mbs: deque[MicroBatch] = deque()
    bubble_of: dict[int, float] = {}
    done: list[tuple[int, RequestRecord]] = []
    steps: list[StepRecord] = []
    next_id = 0

    def admit(now: float) -> None:
        nonlocal next_id
        while pending and len(live) < concurrency:
            req = pending.popleft()
            live[next_id] = Sequence(next_id, req.prompt, req.n_gen, now)
            bubble_of[next_id] = 0.0
            next_id += 1

    def retire(mb: MicroBatch) -> None:
        t = mb.exit
        tokens = backend.placeholder_tokens(mb.step)
        for chunk in mb.step.prefills:
            live[chunk.seq_id].n_prefilled = chunk.end
        for seq_id, token in tokens.items():
            live[seq_id].generated.append(token)
            live[seq_id].token_times.append(t)
        for seq_id in mb.seq_ids:
            in_flight.discard(seq_id)
            bubble_of[seq_id] += mb.bubble
        if on_token is not None:
            on_token(len(tokens))
        for seq in [s for s in live.values() if s.finished]:
            backend.release(seq.seq_id)
            del live[seq.seq_id]
            done.append((seq.seq_id, RequestRecord(seq.prompt_len, seq.arrival, seq.token_times, seq.generated)))
        admit(t)

    def launch(step: Step, t0: float, blocked_since: float | None) -> MicroBatch:
        cost = backend.cost.step_cost(Batch.from_step(step))
        # Stage 0 idled while schedulable sequences waited for a free slot in the pipeline.
        bubble = t0 - blocked_since if blocked_since is not None and stage_used[0] else 0.0
        starts, ends = [], []
        ready = t0
        for k, stage in enumerate(cost.stages):
            s = max(ready, stage_free[k])
            if stage_used[k] and k > 0:
                # Stage k idled while this micro-batch was upstream of it.
                bubble += max(0.0, s - max(stage_free[k], t0))
            starts.append(s)
            ready = s + stage.seconds
            ends.append(ready)
            busy[k] += stage.seconds
            stage_free[k] = ready
            stage_used[k] = True
        backend.trace_step(step, t0, cost, stage_starts=starts, stage_ends=ends, bubble_s=bubble)
        backend.n_steps += 1
        ids = [c.seq_id for c in step.prefills] + [d.seq_id for d in step.decodes]
        in_flight.update(ids)
        steps.append(_step_record(step, t0, ends[-1]))
        return MicroBatch(step, starts, ends, bubble, ids)

    admit(start)
    t = start
    blocked_since: float | None = None
    while live or mbs:
        while mbs and mbs[0].exit <= t:
            retire(mbs.popleft())
        if len(mbs) < pp:
            seqs = [s for s in live.values() if s.seq_id not in in_flight]
            waiting = [s for s in seqs if not s.prefill_done]
            running = [s for s in seqs if s.prefill_done]
            step = strategy.next_step(waiting, running) if seqs else Step()
            if step:
                launch_at = max(t, stage_free[0])
                mbs.append(launch(step, launch_at, blocked_since))
                blocked_since = None
                t = stage_free[0]
                continue
        elif blocked_since is None and any(s.seq_id not in in_flight for s in live.values()):
            blocked_since = max(t, stage_free[0])
        if not mbs:
            if live:
                raise RuntimeError(f"strategy {strategy.name} produced an empty step with work left")
            break
        t = max(t, mbs[0].exit)
    end = max([start] + [mb.exit for mb in mbs] + [stage_free[-1]])
    backend.clock = end
    done.sort(key=lambda item: item[0])
    wall = end - start
    per_request = [bubble_of[i] for i, _ in done]
    stats = {
        "median_bubble_per_request_s": median(per_request) if per_request else 0.0,
        "mean_bubble_per_request_s": sum(per_request) / len(per_request) if per_request else 0.0,
        "stage_busy_fraction": [b / wall if wall > 0 else 0.0 for b in busy],
        "micro_batches": len(steps),
        "wall_s": wall,
    }
    return RunRecord(start, end, [r for _, r in done], steps), stats

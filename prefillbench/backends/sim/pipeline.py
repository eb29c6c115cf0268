"""Pipeline parallelism as a pipeline: micro-batches flowing through stage queues on the virtual clock.

The engine's one loop drives it (`SimBackend.launch`): up to `pp` steps are in
flight, and a sequence whose micro-batch has not left the last stage is not
scheduled again (its next token does not exist yet). Each stage is a FIFO
queue: a micro-batch starts on stage k when it has left stage k-1 (its
activations sent) and stage k has finished the one before it. The backend can
take the next micro-batch as soon as stage 0 is free.

A bubble is a stage's idle time while work waits: on stage k > 0, the part
of its idle gap before a micro-batch during which that micro-batch was already
in the pipeline upstream; on stage 0, the time schedulable sequences waited for
one of the `pp` slots (the engine says so when it waits: `wait_until(stalled=True)`).
Each gap is charged to every request in the micro-batch that closes it; the
report gives the median per request and each stage's busy fraction.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Any

from prefillbench.step import Step

from prefillbench.backends.sim.cost import StepCost


@dataclass
class MicroBatch:
    starts: list[float]
    ends: list[float]
    bubble: float  # idle time of the stages just before this micro-batch started on them

    @property
    def exit(self) -> float:
        return self.ends[-1]


@dataclass
class Pipeline:
    """The stages' timelines of one run, from `start`."""

    n_stages: int
    start: float
    stage_free: list[float] = field(default_factory=list)
    stage_used: list[bool] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    bubble_of: dict[int, float] = field(default_factory=dict)  # per sequence
    stalled_since: float | None = None
    micro_batches: int = 0

    def __post_init__(self) -> None:
        self.stage_free = [self.start] * self.n_stages
        self.stage_used = [False] * self.n_stages
        self.busy = [0.0] * self.n_stages

    def stall(self, now: float) -> None:
        """Schedulable sequences wait for a slot from `now` (or from when stage 0 frees, if later)."""
        if self.stalled_since is None:
            self.stalled_since = max(now, self.stage_free[0])

    def launch(self, step: Step, t0: float, cost: StepCost) -> MicroBatch:
        """Queue `step` on the stages from `t0`."""
        # Stage 0 idled while schedulable sequences waited for a free slot in the pipeline.
        since = self.stalled_since
        bubble = t0 - since if since is not None and self.stage_used[0] else 0.0
        self.stalled_since = None
        starts, ends = [], []
        ready = t0
        for k, stage in enumerate(cost.stages):
            s = max(ready, self.stage_free[k])
            if self.stage_used[k] and k > 0:
                # Stage k idled while this micro-batch was upstream of it.
                bubble += max(0.0, s - max(self.stage_free[k], t0))
            starts.append(s)
            ready = s + stage.seconds
            ends.append(ready)
            self.busy[k] += stage.seconds
            self.stage_free[k] = ready
            self.stage_used[k] = True
        for seq_id in [c.seq_id for c in step.prefills] + [d.seq_id for d in step.decodes]:
            self.bubble_of[seq_id] = self.bubble_of.get(seq_id, 0.0) + bubble
        self.micro_batches += 1
        return MicroBatch(starts, ends, bubble)

    @property
    def end(self) -> float:
        return max([self.start] + self.stage_free)

    def stats(self) -> dict[str, Any]:
        wall = self.end - self.start
        per_request = list(self.bubble_of.values())
        return {
            "median_bubble_per_request_s": median(per_request) if per_request else 0.0,
            "mean_bubble_per_request_s": sum(per_request) / len(per_request) if per_request else 0.0,
            "stage_busy_fraction": [b / wall if wall > 0 else 0.0 for b in self.busy],
            "micro_batches": self.micro_batches,
            "wall_s": wall,
        }

"""A step as the cost model sees it (Batch: chunk shapes and decode contexts) and its price by operator and stage
(Op, StageCost, StepCost): what cost.py's CostModel returns and the sim's trace and pipeline read."""
from __future__ import annotations

from dataclasses import dataclass

from prefillbench.step import Step


@dataclass(frozen=True)
class Batch:
    """What the cost model needs of a step: chunk shapes and decode contexts."""

    chunks: tuple[tuple[int, int, bool], ...] = ()  # (start, tokens computed incl. pads, emits a token)
    decodes: tuple[int, ...] = ()  # context each decode token attends to (itself included)
    #: decodes that carry drafts (speculative decoding): (position, 1 + drafts), a logit row at each query; their
    #: attention runs as a short chunk over the context (read once), the step stays a decode step
    verify: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_step(cls, step: Step) -> "Batch":
        decodes = step.decodes
        return cls(
            tuple((c.start, len(c.tokens) + c.pad, c.is_last) for c in step.prefills),
            tuple(d.position + 1 for d in decodes if not d[3]),
            tuple((d.position, 1 + len(d[3])) for d in decodes if d[3]),
        )

    @property
    def n_tokens(self) -> int:
        return sum(n for _, n, _ in self.chunks) + len(self.decodes) + sum(n for _, n in self.verify)

    @property
    def n_emit(self) -> int:
        """Logit rows: a prompt's last chunk one, a decode one, a verify decode one at each of its queries."""
        return sum(1 for *_, e in self.chunks if e) + len(self.decodes) + sum(n for _, n in self.verify)


@dataclass
class Op:
    name: str
    flops: float
    bytes: float
    seconds: float
    bound: str  # compute | memory | link | overhead
    fp8: bool = False  # its FLOPs ran at the GPU's FP8 tensor rate

    def scaled(self, k: int) -> "Op":
        return Op(self.name, self.flops * k, self.bytes * k, self.seconds * k, self.bound, self.fp8)


@dataclass
class StageCost:
    ops: list[Op]

    @property
    def seconds(self) -> float:
        return sum(op.seconds for op in self.ops)


@dataclass
class StepCost:
    stages: list[StageCost]

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    def breakdown(self) -> dict[str, dict]:
        """Per operator, summed over stages: seconds, FLOPs, bytes and what bounds it."""
        out: dict[str, dict] = {}
        for stage in self.stages:
            for op in stage.ops:
                d = out.setdefault(op.name, {"seconds": 0.0, "flops": 0.0, "bytes": 0.0, "bound": op.bound})
                d["seconds"] += op.seconds
                d["flops"] += op.flops
                d["bytes"] += op.bytes
        return out


@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    pp: int = 1
    ep: int = 1

"""A measured run's steps priced by a calibrated sim: what the sim would have charged for the same work.

tune's measured stage prices every probe's steps, so that its report can tell how fast the machine ran beside
how fast the calibration said it would (a VM's speed drifts between the two), and re-predict at that speed.
"""
from __future__ import annotations

from collections.abc import Callable

from prefillbench.backends.sim.cost import Batch, CostModel
from prefillbench.engine import StepRecord

Pricer = Callable[[StepRecord], float]
#: What a step is, for its time against its price: in serving these ran at different ratios to a calibration
#: that times each shape back to back (docs/history/2026-12-01f), and P99 TBT is set by the mixed steps alone.
STEP_KINDS = {"prompt": "prompt alone", "mixed": "prompt + decodes", "decode": "decode-only"}


def batch_of(rec: StepRecord, with_decodes: bool = True) -> Batch:
    """The cost model's view of a recorded step. Which chunks emitted is not recorded, only how many, and the
    cost model needs only the count (the LM head's rows); a step's pads go with its last chunk."""
    n = len(rec.prefill_chunks)
    chunks = tuple((start, length, i >= n - rec.chunk_emits) for i, (start, length) in enumerate(rec.prefill_chunks))
    if chunks and rec.n_pad:
        s, length, e = chunks[-1]
        chunks = chunks[:-1] + ((s, length + rec.n_pad, e),)
    return Batch(chunks, tuple(rec.decode_contexts) if with_decodes else ())


def pricer(cost: CostModel) -> Pricer:
    """Seconds the cost model gives one recorded step."""
    return lambda rec: cost.seconds(batch_of(rec))


def step_kind(rec: StepRecord) -> str:
    """The STEP_KINDS key of a recorded step."""
    if not rec.prefill_chunks:
        return "decode"
    return "mixed" if rec.decode_contexts else "prompt"


def priced_by_kind(steps: list[StepRecord], price: Pricer) -> dict[str, tuple[float, float]]:
    """(seconds the steps took, seconds the sim charges for them) per step kind present."""
    out: dict[str, list[float]] = {}
    for rec in steps:
        sums = out.setdefault(step_kind(rec), [0.0, 0.0])
        sums[0] += rec.seconds
        sums[1] += price(rec)
    return {k: (took, priced) for k, (took, priced) in out.items()}

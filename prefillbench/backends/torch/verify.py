"""Speculative decoding on torch: a decode with K drafts verified as a prompt chunk of K+1 tokens at its position.

A prompt chunk's attention is causal within the chunk and reads the sequence's cache before its start, which is what
verification needs (each draft sees the token and the drafts before it), and it writes the K+1 positions' KV into the
cache as it goes. The rows of rejected drafts stay in the cache past the sequence's accepted length: nothing reads
them (every later step attends only up to the positions it feeds, the attention metadata built from each chunk's
start and length and each decode's position) and the next steps overwrite them, so the backend needs no rollback
(`Backend.truncate` does nothing here).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefillbench.step import PackedStep, PrefillChunk, Step, StepResult, pack


@dataclass(frozen=True)
class Verification:
    step: Step  # the step as run: each drafted decode a chunk of its token and drafts, after the prompt chunks
    rows: np.ndarray  # rows of the run step whose logits are wanted, in the asked step's emitting order
    asked: PackedStep  # the step as the strategy gave it, packed: whose rows are which (row_counts)

    def result(self, row_tokens) -> StepResult:
        """Each emitting sequence's next token, and each drafted decode's verified tokens."""
        return self.asked.greedy_result(row_tokens)


def drafted_as_chunks(step: Step) -> Verification:
    drafted = [d for d in step.decodes if d.drafts]
    plain = tuple(d for d in step.decodes if not d.drafts)
    chunks = tuple(PrefillChunk(d.seq_id, (d.token, *d.drafts), d.position, False) for d in drafted)
    run = Step(prefills=step.prefills + chunks, decodes=plain, preempted=step.preempted)
    offsets = pack(run).chunk_offsets
    decode_from = sum(len(c.tokens) + c.pad for c in run.prefills)
    rows: list[int] = [offsets[i] + len(c.tokens) - 1 for i, c in enumerate(step.prefills) if c.is_last]
    n_prefills, j, m = len(step.prefills), 0, 0
    for d in step.decodes:
        if d.drafts:
            start = offsets[n_prefills + j]
            rows += range(start, start + 1 + len(d.drafts))
            j += 1
        else:
            rows.append(decode_from + m)
            m += 1
    return Verification(run, np.asarray(rows, dtype=np.int64), pack(step))

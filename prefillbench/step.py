"""What crosses the line between a strategy and a backend: one forward pass.

A strategy fills a `Step` with prompt chunks and decode tokens; a backend
executes it and returns the next token of every sequence that produced one.
Neither side knows the other's insides.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


# PrefillChunk and DecodeToken are NamedTuples, not frozen dataclasses: a strategy makes one per sequence per
# step, and on the sim building them was a tenth of a simulated step's cost (a frozen dataclass's __init__
# sets each field through object.__setattr__). They stay immutable and are read by name.
class PrefillChunk(NamedTuple):
    """A run of prompt tokens of one sequence, starting at position `start`.

    `pad` extra tokens follow the real ones in the same pass: they are computed
    (that is the cost the padded strategy measures) and then discarded, so they
    change no result. Only the last chunk of a prompt yields a token.
    """

    seq_id: int
    tokens: tuple[int, ...]
    start: int
    is_last: bool
    pad: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class DecodeToken(NamedTuple):
    """The newest token of a running sequence, fed back at `position`; with speculative decoding, its draft tokens
    follow at position+1 .. position+len(drafts) in the same pass (K+1 query positions, a logit at each), and the
    engine accepts what the target agrees with (prefillbench/speculation.py)."""

    seq_id: int
    token: int
    position: int
    drafts: tuple[int, ...] = ()


class Preemption(NamedTuple):
    """A running sequence whose KV the step frees before it runs (vLLM's preemption, SGLang's retraction): it goes
    back to waiting, at the head or the tail, and computes its tokens so far again as prompt."""

    seq_id: int
    to_head: bool = True


@dataclass(frozen=True, slots=True)
class Step:
    """The contents of one forward pass: prefill chunks, then decodes; and the sequences preempted before it."""

    prefills: tuple[PrefillChunk, ...] = ()
    decodes: tuple[DecodeToken, ...] = ()
    preempted: tuple[Preemption, ...] = ()
    #: What the strategy's own state was when it chose the step, as (name, value) pairs (SGLang's new_token_ratio,
    #: slo-budget's prompt-token budget): carried to the step's record and the per-request export, never executed.
    policy_values: tuple[tuple[str, float], ...] = ()
    #: Tokens loaded from a host tier (engine/host_tier.py) before a prompt's first chunk, as (seq_id, tokens): the
    #: chunk starts past them; the backend prices the load (the sim over its host link).
    host_loads: tuple[tuple[int, int], ...] = ()

    @property
    def n_prefill_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.prefills)

    @property
    def n_pad_tokens(self) -> int:
        return sum(c.pad for c in self.prefills)

    @property
    def n_decode_tokens(self) -> int:
        """Decode query tokens: each decode's token and its drafts."""
        n = len(self.decodes)
        for d in self.decodes:
            if d[3]:
                n += len(d[3])
        return n

    @property
    def n_draft_tokens(self) -> int:
        return sum(len(d.drafts) for d in self.decodes)

    @property
    def n_tokens(self) -> int:
        """Tokens the backend really computes, pads included."""
        return self.n_prefill_tokens + self.n_pad_tokens + self.n_decode_tokens

    @property
    def emitting_seq_ids(self) -> list[int]:
        """Sequences that get a next token from this step, in step order."""
        return [c.seq_id for c in self.prefills if c.is_last] + [d.seq_id for d in self.decodes]

    def __bool__(self) -> bool:
        return bool(self.prefills or self.decodes)


@dataclass
class StepResult:
    """Greedy next token per emitting sequence; logits only when asked for."""

    next_tokens: dict[int, int]
    logits: dict[int, "object"] | None = field(default=None)
    #: Decodes that carried drafts: the target's greedy token after each of the 1+K fed tokens (its next_tokens
    #: entry is the first). The engine, not the backend, accepts from it.
    verified: dict[int, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class PackedStep:
    """A step flattened into one row of tokens, as every backend feeds it to its model.

    Prompt chunks come first (each followed by its pads), then decode tokens.
    Pads repeat the chunk's last real token at the following positions: they
    cost what real tokens cost, and since they come after the real tokens a
    causal model's results for the real ones cannot depend on them.
    """

    tokens: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    seq_ids: np.ndarray  # [T] int64
    chunk_offsets: tuple[int, ...]  # where each prefill chunk starts in the row
    decode_from: int  # decodes occupy [decode_from, T)
    logit_rows: np.ndarray  # rows whose next token is wanted, in `emitting` order
    emitting: tuple[int, ...]  # the sequences that get a token, in logit-row order
    #: Logit rows per emitting sequence where some decode carries drafts (1 + K for such a decode, 1 otherwise);
    #: () when none does, and then logit rows and `emitting` pair one to one.
    row_counts: tuple[int, ...] = ()

    def greedy_result(self, row_tokens, logits: dict | None = None) -> "StepResult":
        """The step's result from the greedy token of every logit row (in `logit_rows` order): each emitting
        sequence's next token, and for a decode with drafts the target's token after each fed token (`verified`)."""
        row_tokens = [int(t) for t in row_tokens]
        if not self.row_counts:
            return StepResult(dict(zip(self.emitting, row_tokens)), logits)
        next_tokens: dict[int, int] = {}
        verified: dict[int, tuple[int, ...]] = {}
        i = 0
        for seq_id, n in zip(self.emitting, self.row_counts):
            next_tokens[seq_id] = row_tokens[i]
            if n > 1:
                verified[seq_id] = tuple(row_tokens[i:i + n])
            i += n
        return StepResult(next_tokens, logits, verified)


def pack(step: Step) -> PackedStep:
    tokens: list[int] = []
    positions: list[int] = []
    seq_ids: list[int] = []
    offsets: list[int] = []
    logit_rows: list[int] = []
    for chunk in step.prefills:
        n = len(chunk.tokens) + chunk.pad
        offsets.append(len(tokens))
        if chunk.is_last:
            logit_rows.append(len(tokens) + len(chunk.tokens) - 1)
        tokens += chunk.tokens
        tokens += (chunk.tokens[-1],) * chunk.pad
        positions += range(chunk.start, chunk.start + n)
        seq_ids += [chunk.seq_id] * n
    decode_from = len(tokens)
    row_counts: tuple[int, ...] = ()
    if any(d.drafts for d in step.decodes):
        # Each decode's token, then its drafts at the following positions, a logit row at every one.
        row_counts = (1,) * len(logit_rows) + tuple(1 + len(d.drafts) for d in step.decodes)
        for d in step.decodes:
            n = 1 + len(d.drafts)
            logit_rows += range(len(tokens), len(tokens) + n)
            tokens += (d.token, *d.drafts)
            positions += range(d.position, d.position + n)
            seq_ids += [d.seq_id] * n
    else:
        logit_rows += range(decode_from, decode_from + len(step.decodes))
        tokens += [d.token for d in step.decodes]
        positions += [d.position for d in step.decodes]
        seq_ids += [d.seq_id for d in step.decodes]
    as_array = lambda values: np.asarray(values, dtype=np.int64)
    return PackedStep(
        as_array(tokens), as_array(positions), as_array(seq_ids), tuple(offsets), decode_from,
        as_array(logit_rows), tuple(step.emitting_seq_ids), row_counts,
    )

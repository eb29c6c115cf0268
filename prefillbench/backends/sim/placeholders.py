"""The sim's tokens: it never runs the model, so each emitted token is a placeholder, deterministic in (sequence,
position) so that every strategy emits the same tokens and exports compare."""
from __future__ import annotations

from itertools import repeat
from operator import add, mod

#: placeholder_token's: 100 + (SEQ_STRIDE * seq_id + POSITION_STRIDE * length) % span.
SEQ_STRIDE, POSITION_STRIDE = 1_000_003, 7_919


def placeholder_token(seq_id: int, length: int, span: int) -> int:
    """The sim's token after `length` positions of a sequence: deterministic, so every strategy emits the same."""
    return 100 + (SEQ_STRIDE * seq_id + POSITION_STRIDE * length) % span


def placeholder_run(seq_id: int, length: int, n: int, span: int) -> list[int]:
    """placeholder_token after `length`, `length` + 1, ... positions, n of them (in C: maps over a range)."""
    first = SEQ_STRIDE * seq_id + POSITION_STRIDE * length
    return list(map(add, map(mod, range(first, first + POSITION_STRIDE * n, POSITION_STRIDE), repeat(span, n)),
                    repeat(100, n)))

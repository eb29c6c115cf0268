"""All waiting prompts in one rectangular [B, Lmax] pass, padded to the longest.

The padding is real compute: this is the batched prefill that mistral.rs
measured, and the price it pays for ragged prompt lengths.
"""
from __future__ import annotations

from prefillbench.step import Step

from .base import Strategy, decode_tokens, prefill_chunk


class Padded(Strategy):
    name = "padded"

    def next_step(self, waiting, running):
        if waiting:
            longest = max(s.prompt_len - s.n_prefilled for s in waiting)
            return Step(prefills=tuple(prefill_chunk(s, pad_to=longest) for s in waiting))
        return Step(decodes=decode_tokens(running))

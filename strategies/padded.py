"""All waiting prompts in one rectangular [B, Lmax] pass, padded to the longest.

The padding is real compute: this is the batched prefill that mistral.rs
measured, and the price it pays for ragged prompt lengths.
"""
from __future__ import annotations

from prefillbench.step import Step

from .base import Strategy, decode_tokens, whole_prompts


class Padded(Strategy):
    name = "padded"
    steady_decodes = True

    def next_step(self, waiting, running):
        if waiting:
            return Step(prefills=whole_prompts(waiting, pad=True))
        return Step(decodes=decode_tokens(running))

"""One whole prompt per forward pass; running decodes share their own steps."""
from __future__ import annotations

from prefillbench.step import Step

from .base import Strategy, decode_tokens, prefill_chunk


class Sequential(Strategy):
    name = "sequential"
    steady_decodes = True

    def next_step(self, waiting, running):
        if waiting:
            return Step(prefills=(prefill_chunk(waiting[0]),))
        return Step(decodes=decode_tokens(running))

    def max_step_tokens(self, prompt_len: int, concurrency: int) -> int:
        return max(prompt_len, concurrency)  # one whole prompt, or every decode

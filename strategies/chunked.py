"""SARATHI decode-maximal batching (arXiv 2308.16369).

Every step carries all running decodes plus one chunk of at most `chunk_size`
tokens from the oldest unfinished prompt. The decodes ride along with the
compute-bound chunk almost for free, and no step is a long prefill that stalls
the decodes behind it.
"""
from __future__ import annotations

from prefillbench.step import Step

from .base import Strategy, decode_tokens, prefill_chunk


class Chunked(Strategy):
    name = "chunked"
    uses_chunk_size = True
    steady_decodes = True

    def next_step(self, waiting, running):
        # the chunk: chunk_size, or a budget part's (budget.py: slo) for the oldest prompt beside these decodes
        size = self.chunk_size if self.budget_part is None or not waiting else self.step_budget(
            waiting[:1], running, counts_decodes=False)
        prefills = (prefill_chunk(waiting[0], size),) if waiting else ()
        return Step(prefills=prefills, decodes=decode_tokens(running))

    def max_step_tokens(self, prompt_len: int, concurrency: int) -> int:
        return min(prompt_len, self.chunk_size) + concurrency

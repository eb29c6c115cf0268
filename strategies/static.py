"""Request-level (static) batching, as in FasterTransformer: the baseline of Orca (OSDI'22) and Sarathi-Serve (OSDI'24).

Rule: a batch of up to c requests (the run's concurrency) starts together, its
prompts in one pass padded to the longest (FasterTransformer's context phase
takes a [batch, max_input_len] tensor), and then decodes together until the
last of them finishes. Only then does the next batch start: a request that
arrives meanwhile waits, and a finished member's place stays empty.

The strategy holds admission by remembering its batch: while a member is
unfinished it schedules members only (none at all while they are elsewhere,
e.g. in flight in the sim's pipeline), so newer sequences stay waiting.
"""
from __future__ import annotations

from prefillbench.sequence import Sequence
from prefillbench.step import Step

from .base import Strategy, decode_tokens, whole_prompts


class Static(Strategy):
    name = "static"
    steady_decodes = True

    def __init__(self, chunk_size: int = 256) -> None:
        super().__init__(chunk_size)
        self.batch: list[Sequence] = []

    def reset(self) -> None:
        self.batch = []

    def next_step(self, waiting, running):
        # Only the batch's prompts are ever prefilled, and in one step, so every running sequence is a member.
        if running:
            return Step(decodes=decode_tokens(running))
        # The engine updates the same Sequence objects, so the batch sees its members finish; one that is neither
        # running nor finished is in flight (the sim's pipeline), and the batch waits for it.
        if all(s.finished for s in self.batch):
            self.batch = list(waiting)
            return Step(prefills=whole_prompts(self.batch, pad=True))
        return Step()

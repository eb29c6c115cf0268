"""Orca's iteration-level scheduling (Yu et al., "Orca", OSDI'22).

Rule: every step carries all running decodes plus every newly arrived prompt,
whole (Orca does not split prompts): a request joins the batch at the next
iteration instead of waiting for a batch to finish, and leaves it as soon as
it is done. The limit on requests in flight is Orca's maximum batch size,
here the run's concurrency (`-c`), which the engine holds when it admits
requests. Orca's selective batching (linear layers over all tokens at once,
attention per request) is what every backend's packed step does.
"""
from __future__ import annotations

from prefillbench.step import Step

from .base import Strategy, decode_tokens, whole_prompts


class Orca(Strategy):
    name = "orca"
    steady_decodes = True

    def next_step(self, waiting, running):
        return Step(prefills=whole_prompts(waiting), decodes=decode_tokens(running))

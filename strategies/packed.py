"""vLLM's default scheduling before chunked prefill (Kwon et al., SOSP'23; vLLM v0's scheduler): prefills first.

Rule: while any prompt waits, the step is every waiting prompt, whole, packed
back to back in one row with no padding (varlen attention, each token at its
own position); the running decodes pause until no prompt waits, then all of
them share a decode step. It is `padded` without the pads, so the two side by
side price padding alone. (vLLM also caps a step at `max_num_batched_tokens`;
here the run's concurrency bounds it.)
"""
from __future__ import annotations

from prefillbench.step import Step

from .base import Strategy, decode_tokens, whole_prompts


class Packed(Strategy):
    name = "packed"
    steady_decodes = True

    def next_step(self, waiting, running):
        if waiting:
            return Step(prefills=whole_prompts(waiting))
        return Step(decodes=decode_tokens(running))

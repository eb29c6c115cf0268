"""vLLM's default scheduling before chunked prefill (Kwon et al., SOSP'23; vLLM v0's scheduler): prefills first.

Rule: while any prompt waits, the step is waiting prompts, whole, oldest first, packed back to back in one row with
no padding (varlen attention, each token at its own position), as many as fit in `max_batched_tokens` (vLLM's
max_num_batched_tokens: vllm/core/scheduler.py, Scheduler._schedule_prefills stops at the first prompt that
SchedulingBudget.can_schedule refuses); the running decodes pause until no prompt waits, then all of them share a
decode step. It is `padded` without the pads, so the two side by side price padding alone.

The cap is what the engine sizes its step's activations by (vLLM's profile run is one step of
max_num_batched_tokens tokens, the KV cache gets what is left), so a run admits by the KV its sequences reserve
beside one such step, not beside a step of every admitted prompt at once. vLLM's default is
max(max_model_len, 2048) (vllm/config.py, SchedulerConfig, _DEFAULT_MAX_NUM_BATCHED_TOKENS): 2048 here, and a
prompt longer than the cap enters alone, as a max_model_len that holds it would let it.
"""
from __future__ import annotations

from prefillbench.step import Step

from .base import Strategy, decode_tokens, whole_prompts

#: vLLM's _DEFAULT_MAX_NUM_BATCHED_TOKENS, the floor of its max_num_batched_tokens without chunked prefill.
DEFAULT_MAX_BATCHED_TOKENS = 2048


class Packed(Strategy):
    name = "packed"
    steady_decodes = True
    settings = {"max-batched": ("max_batched_tokens",
                                f"vLLM's max_num_batched_tokens: prompt tokens a step packs (default {DEFAULT_MAX_BATCHED_TOKENS})")}
    max_batched_tokens = DEFAULT_MAX_BATCHED_TOKENS

    def check_settings(self) -> None:
        if self.max_batched_tokens < 1:
            raise ValueError(f"packed:max-batched must be at least 1, got {self.max_batched_tokens}")

    def next_step(self, waiting, running):
        if not waiting:
            return Step(decodes=decode_tokens(running))
        room, n = self.max_batched_tokens, 0
        for seq in waiting:
            left = seq.prompt_len - seq.n_prefilled
            if n and left > room:
                break
            room -= left
            n += 1
        return Step(prefills=whole_prompts(waiting[:n] if n < len(waiting) else waiting))

    def max_step_tokens(self, prompt_len: int, concurrency: int) -> int:
        # a prefill step: prompts within the cap, or one longer prompt alone; a decode step: one token a sequence
        return max(min(prompt_len * concurrency, max(self.max_batched_tokens, prompt_len)), concurrency)

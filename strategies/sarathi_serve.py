"""Stall-free batching (Agrawal et al., "Taming Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve", OSDI'24).

Rule: a token budget per step (`chunk_size`, alias `--token-budget`). The
running decodes go in first, one token each; then the prompts already in
progress take chunks of what is left of the budget, oldest first; then new
prompts, until the budget is used. So several prompts may be chunked in one
step, and a decode never waits behind a prompt (no stall). This follows
sarathi-serve's SarathiScheduler: decodes are never dropped for the budget,
they only leave less of it to prompts.
"""
from __future__ import annotations

from prefillbench.step import PrefillChunk, Step

from .base import Strategy, decode_tokens, prefill_chunk


class SarathiServe(Strategy):
    name = "sarathi-serve"
    uses_chunk_size = True
    steady_decodes = True

    def next_step(self, waiting, running):
        decodes = decode_tokens(running)
        in_progress = [s for s in waiting if s.n_prefilled > 0]
        new = [s for s in waiting if s.n_prefilled == 0]
        priced = None
        if self.budget_part is None:
            budget = self.chunk_size - len(decodes)
        elif not waiting:
            return Step(decodes=decodes)  # nothing to price: the decodes alone carry no budget
        else:  # a budget part (budget.py): the prompt tokens it gives beside these decodes
            budget = priced = self.step_budget(in_progress + new, running, counts_decodes=False)
        prefills: list[PrefillChunk] = []
        for seq in in_progress + new:
            if budget <= 0:
                break
            chunk = prefill_chunk(seq, budget)
            prefills.append(chunk)
            budget -= len(chunk.tokens)
        if priced is not None:  # the budget the step chose goes out with it (Step.policy_values)
            return Step(prefills=tuple(prefills), decodes=decodes, policy_values=(("budget", float(priced)),))
        return Step(prefills=tuple(prefills), decodes=decodes)

    def max_step_tokens(self, prompt_len: int, concurrency: int) -> int:
        if self.budget_part is not None:  # prompt tokens up to the part's cap, beside every decode
            return min(prompt_len * concurrency, self.chunk_size) + concurrency
        return max(min(prompt_len * concurrency, self.chunk_size), concurrency)

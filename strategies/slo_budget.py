"""A prompt budget that holds the SLO by itself: each step takes the most prompt tokens its price allows.

Rule: decodes first, one token each, as stall-free batching (sarathi_serve.py); then prompt chunks, prompts in
progress before new ones, oldest first, up to this step's budget: the most prompt tokens whose step (these chunks
beside these decodes), priced by the cost model the run is calibrated with, takes at most the target time. The
price and the target are the run's (bench/slo_pricing.py: the target is the TBT or TPOT SLO less a margin for the
model's error), handed over by `price_with` before the run; nothing here knows a backend.

Why: a fixed budget (--max-num-batched-tokens, --chunk-size, -b) has to fit the dearest step a load brings (many
decodes at long contexts), and so leaves capacity unused in every cheaper step; here each step spends what its
decodes leave of the target (Niyama, arXiv 2503.22562, and SLOs-Serve, arXiv 2504.08784, choose chunks from a cost
model likewise).

At least one prompt token a step: where the decodes alone take the target, a prompt would otherwise wait for as long
as they run (starve); one token costs next to nothing beside them. A step with nothing waiting is the decodes alone
and carries no budget.

The budget each step chose goes out with the step (Step.policy_values, "budget"): the most prompt tokens the step
could carry within the target, taking the waiting prompts' tokens in order and, past their end, more of the last
one, so it is the budget even where less waited (at most `cap`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from prefillbench.step import PrefillChunk, Step

from .base import Strategy, decode_tokens, prefill_chunk

#: A step's price in seconds: its prompt chunks as (start position, tokens, whether the chunk ends its prompt), and
#: each decode's context (the positions it attends, itself included).
StepPrice = Callable[[Sequence[tuple[int, int, bool]], Sequence[int]], float]

#: Most prompt tokens one step may carry, by default: an engine sizes its step buffers by such a cap (vLLM's
#: max_num_batched_tokens). Far above what a step holds within a TBT SLO of 100 ms on the GPUs the sim prices
#: (about a thousand for Mistral-7B on an A100), so the price, not the cap, sets the budget.
DEFAULT_CAP = 8192


def chunk_shapes(order: Sequence, budget: int) -> list[tuple[int, int, bool]]:
    """The chunks `budget` prompt tokens make of the prompts in `order` (sequences, in the order they are taken), as
    (start, tokens, ends its prompt); past the last prompt's end its chunk grows on (what the step would cost with
    that many prompt tokens, for the budget where fewer wait)."""
    shapes = []
    left = budget
    for seq in order:
        start = seq.n_prefilled
        remaining = len(seq.prompt) - start
        take = min(remaining, left)
        shapes.append((start, take, take == remaining))
        left -= take
        if left == 0:
            return shapes
    start, take, _ = shapes[-1]
    shapes[-1] = (start, take + left, True)
    return shapes


class SloBudget(Strategy):
    name = "slo-budget"
    steady_decodes = True  # with nothing waiting its step is the running decodes, whatever their price
    needs_price = True
    settings = {"cap": ("cap", f"most prompt tokens a step, as an engine sizes its step buffers (default {DEFAULT_CAP})")}

    def __init__(self, chunk_size: int = 256) -> None:
        super().__init__(chunk_size)
        self.cap = DEFAULT_CAP
        self.price: StepPrice | None = None
        self.target_s: float | None = None

    def check_settings(self) -> None:
        if self.cap < 1:
            raise ValueError(f"{self.name}: cap must be at least 1 prompt token, got {self.cap}")

    def price_with(self, price: StepPrice, target_s: float) -> None:
        if not target_s > 0:
            raise ValueError(f"{self.name}: the target step time must be positive, got {target_s}")
        self.price, self.target_s = price, target_s

    def budget(self, order: Sequence, contexts: Sequence[int]) -> int:
        """The most prompt tokens (1 to cap) whose step beside decodes of `contexts` is priced within the target; 1
        where even one token's step is not. A step's price grows with its prompt tokens (each operator's FLOPs and
        bytes do), so the search bisects."""
        price, target = self.price, self.target_s
        if price is None or target is None:
            raise RuntimeError(f"{self.name} chooses each step by its price: the run must give it a price and a target "
                               "(Strategy.price_with) before it starts")

        def fits(n: int) -> bool:
            return price(chunk_shapes(order, n), contexts) <= target

        if fits(self.cap):
            return self.cap
        if not fits(1):
            return 1  # the floor: no prompt starves behind decodes that alone take the target
        lo, hi = 1, self.cap  # lo fits, hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def next_step(self, waiting, running):
        decodes = decode_tokens(running)
        if not waiting:
            return Step(decodes=decodes)
        order = [s for s in waiting if s.n_prefilled > 0] + [s for s in waiting if s.n_prefilled == 0]
        # one tuple for every candidate: a price may keep what it worked out from the decodes (slo_pricing.SimPrice)
        contexts = tuple([d.position + 1 for d in decodes])
        budget = self.budget(order, contexts)
        left = budget
        prefills: list[PrefillChunk] = []
        for seq in order:
            if left <= 0:
                break
            chunk = prefill_chunk(seq, left)
            prefills.append(chunk)
            left -= len(chunk.tokens)
        return Step(prefills=tuple(prefills), decodes=decodes, policy_values=(("budget", float(budget)),))

    def max_step_tokens(self, prompt_len: int, concurrency: int) -> int:
        return min(prompt_len * concurrency, self.cap) + concurrency

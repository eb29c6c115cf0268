"""A scheduler's budget: how many tokens a step may take, given what the step holds so far. One of the three parts a
scheduler is composed of (compose.py): its engine's rules (vllm-v1, sglang-mixed, ...) ask their budget once a step
and spend it by their own order, admission and memory; the cadence (cadence.py) says on which steps prompts run.

- fixed (no part object: the rules read `chunk_size`, --chunk-size): vLLM's --max-num-batched-tokens, SGLang's
  --chunked-prefill-size, llama-server's -b. Per-request caps (vLLM's long_prefill_token_threshold) stay settings of
  the rules (-s vllm-v1:threshold=N): they cap one prompt within whatever budget the step has.
- slo (`Slo`): prefillbench's own, shipped by no engine. Each step the most prompt tokens whose step, priced by the
  cost model the run is calibrated with, keeps within the target step time (the TBT or TPOT SLO less a margin for
  the model's error, bench/slo_pricing.py). A fixed budget has to fit the dearest step a load brings (many decodes
  at long contexts) and so leaves capacity unused in every cheaper step; here each step spends what its decodes
  leave of the target (Niyama, arXiv 2503.22562, and SLOs-Serve, arXiv 2504.08784, choose chunks from a cost model
  likewise). At least one prompt token a step: where the decodes alone take the target, a prompt would otherwise
  wait as long as they run (starve). Where the rules count decodes in their budget (vLLM's token budget, SGLang's
  mixed chunk, sarathi-serve), the decodes are added to the priced prompt tokens, so the rules' own loops leave the
  prompts exactly that.

The price is a plain callable (a step's prompt chunks as (start, tokens, ends its prompt) and its decodes' contexts ->
seconds) handed over before the run (Strategy.price_with); nothing here knows a backend.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

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


class PricedFrom(NamedTuple):
    """A prompt as a budget prices it: from `n_prefilled`, where its step will start it (a prefix cache's hit found
    only as the rules admit it: vllm-v1's block cache)."""

    prompt: tuple
    n_prefilled: int


class Slo:
    """The SLO budget: each step the most prompt tokens (1 to `cap`) priced within the target."""

    kind = "slo"
    needs_price = True

    def __init__(self, cap: int = DEFAULT_CAP) -> None:
        self.cap = cap
        self.price: StepPrice | None = None
        self.target_s: float | None = None

    @property
    def spec(self) -> str:
        return "slo" if self.cap == DEFAULT_CAP else f"slo:cap={self.cap}"

    def check(self) -> None:
        if self.cap < 1:
            raise ValueError(f"the slo budget's cap must be at least 1 prompt token, got {self.cap}")

    def price_with(self, price: StepPrice, target_s: float) -> None:
        if not target_s > 0:
            raise ValueError(f"the slo budget: the target step time must be positive, got {target_s}")
        self.price, self.target_s = price, target_s

    def prompt_tokens(self, order: Sequence, contexts: Sequence[int]) -> int:
        """The most prompt tokens (1 to cap) whose step beside decodes of `contexts` is priced within the target; 1
        where even one token's step is not. A step's price grows with its prompt tokens (each operator's FLOPs and
        bytes do), so the search bisects."""
        price, target = self.price, self.target_s
        if price is None or target is None:
            raise RuntimeError("the slo budget chooses each step by its price: the run must give it a price and a "
                               "target (Strategy.price_with) before it starts")

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

    def tokens(self, order: Sequence, contexts: Sequence[int], counts_decodes: bool) -> int:
        """The step's budget in the rules' own units: the priced prompt tokens, plus one a decode where the rules
        charge decodes to the same budget."""
        prompt = self.prompt_tokens(order, contexts)
        return prompt + len(contexts) if counts_decodes else prompt


#: The budgets --budget names: what each is, and which engine ships it.
BUDGETS = {
    "fixed": "the --chunk-size tokens a step (every engine's: --max-num-batched-tokens, --chunked-prefill-size, -b)",
    "slo": "prompt tokens priced within the TBT/TPOT SLO each step (prefillbench's own; no engine ships it)",
}


def make_budget(spec: str):
    """The budget part --budget names (None: fixed, the rules read chunk_size); ValueError naming the kinds."""
    kind, *rest = spec.split(":")
    if kind == "fixed" and not rest:
        return None
    if kind == "slo":
        cap = DEFAULT_CAP
        for part in rest:
            key, eq, value = part.partition("=")
            if key != "cap" or not eq or not value.isdigit():
                raise ValueError(f"budget {spec!r}: the slo budget takes cap=N (most prompt tokens a step)")
            cap = int(value)
        part = Slo(cap)
        part.check()
        return part
    raise ValueError(f"unknown budget {spec!r}; choose from {', '.join(BUDGETS)} (slo:cap=N)")


__all__ = ["BUDGETS", "DEFAULT_CAP", "PricedFrom", "Slo", "StepPrice", "chunk_shapes", "make_budget"]

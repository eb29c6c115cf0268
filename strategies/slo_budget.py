"""`slo-budget`, the name the SLO budget first shipped under: sarathi-serve's rules (stall-free batching: decodes
first, one token each, then prompts in progress before new ones, oldest first) with the slo budget part
(budget.py, where its one implementation lives: each step the most prompt tokens its price allows within the
target). The same scheduler is spelled `-s sarathi-serve --budget slo`; this name keeps working, with its setting
`cap` (slo-budget:cap=N, the budget's slo:cap=N).

Under another engine's memory rules the same budget is `-s vllm-v1 --budget slo` (paged admission, preemption) or
`-s sglang-mixed --budget slo` (docs/slo-budget.md).
"""
from __future__ import annotations

from .budget import DEFAULT_CAP, StepPrice, Slo, chunk_shapes
from .sarathi_serve import SarathiServe


class SloBudget(SarathiServe):
    name = "slo-budget"
    uses_chunk_size = False
    steady_decodes = True  # with nothing waiting its step is the running decodes, whatever their price
    needs_price = True
    settings = {"cap": ("cap", f"most prompt tokens a step, as an engine sizes its step buffers (default {DEFAULT_CAP})")}

    def __init__(self, chunk_size: int = 256) -> None:
        super().__init__(chunk_size)
        self.budget_part = Slo()
        self.chunk_size = self.budget_part.cap

    @property
    def cap(self) -> int:
        return self.budget_part.cap

    @cap.setter
    def cap(self, value: int) -> None:
        self.budget_part.cap = value
        self.chunk_size = max(value, 1)

    @property
    def target_s(self) -> float | None:
        return self.budget_part.target_s

    @property
    def price(self) -> StepPrice | None:
        return self.budget_part.price

    def budget(self, order, contexts) -> int:
        """The part's prompt tokens for these prompts beside decodes of these contexts (Slo.prompt_tokens)."""
        return self.budget_part.prompt_tokens(order, contexts)

    @property
    def spec(self) -> str:
        return self.name + "".join(f":{k}={v}" for k, v in self.given_settings.items()) + (
            "" if self.cadence is None else f" · cadence {self.cadence.spec}")

    def check_settings(self) -> None:
        if self.cap < 1:
            raise ValueError(f"{self.name}: cap must be at least 1 prompt token, got {self.cap}")


__all__ = ["DEFAULT_CAP", "SloBudget", "StepPrice", "chunk_shapes"]

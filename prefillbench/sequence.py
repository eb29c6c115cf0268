"""A request as the scheduler sees it while it is in flight."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sequence:
    seq_id: int
    prompt: tuple[int, ...]
    n_gen: int
    arrival: float
    n_prefilled: int = 0
    generated: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    first_scheduled: float | None = None  # start of the first step that carried it

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def prefill_done(self) -> bool:
        return self.n_prefilled >= len(self.prompt)

    @property
    def finished(self) -> bool:
        return self.prefill_done and len(self.generated) >= self.n_gen

    @property
    def position(self) -> int:
        """Position of the next token to feed: the newest generated one."""
        return len(self.prompt) + len(self.generated) - 1

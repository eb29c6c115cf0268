"""A backend with no model: a virtual clock and tokens derived from positions."""
from __future__ import annotations

from prefillbench.backends.base import Backend, SlotTable
from prefillbench.step import Step, StepResult


class FakeBackend(Backend):
    name = "fake"
    model_name = "fake-model"
    context_length = 4096
    vocab_size = 1000
    weights = "none"

    def __init__(self, seconds_per_token: float = 0.001, seconds_per_step: float = 0.01) -> None:
        self.clock = 0.0
        self.per_token, self.per_step = seconds_per_token, seconds_per_step
        self.steps: list[Step] = []
        self.released: list[int] = []
        self.slots = SlotTable(0)

    def prepare(self, max_sequences, max_seq_len, max_step_tokens):
        self.slots = SlotTable(max_sequences)

    def execute(self, step, return_logits=False):
        for seq_id in [c.seq_id for c in step.prefills] + [d.seq_id for d in step.decodes]:
            self.slots.slot(seq_id)
        self.steps.append(step)
        self.clock += self.per_step + self.per_token * step.n_tokens
        nxt = {c.seq_id: c.end % 997 for c in step.prefills if c.is_last}
        nxt.update({d.seq_id: (d.position + 1) % 997 for d in step.decodes})
        return StepResult(nxt)

    def release(self, seq_id):
        self.released.append(seq_id)
        self.slots.release(seq_id)

    def now(self):
        return self.clock

    def wait_until(self, t, *, stalled=False, idle=False):
        self.clock = max(self.clock, t)

"""A backend with no model, for testing the command path end to end (hidden: `--backend fake`, as hyperfine's
`--debug-mode`): a virtual clock, tokens derived from positions, and failures on demand.

Two environment variables make it fail the way real runs do, so a test can check what the tool keeps:
- PREFILLBENCH_FAKE_FAIL_AT=N: the Nth step (counted over the process) raises BackendError, as llama.cpp does
  when its KV cache is full;
- PREFILLBENCH_FAKE_KILL_AT=N: the Nth step kills the process with SIGKILL, as the OOM killer or a CI timeout does.
"""
from __future__ import annotations

import os
import signal
from typing import Any, ClassVar

from prefillbench.backends.base import SlotTable, StepBackend
from prefillbench.errors import BackendError
from prefillbench.step import Step, StepResult

FAIL_AT_VARIABLE = "PREFILLBENCH_FAKE_FAIL_AT"
KILL_AT_VARIABLE = "PREFILLBENCH_FAKE_KILL_AT"


def _step_number(variable: str) -> int | None:
    value = os.environ.get(variable)
    return int(value) if value else None


class FakeBackend(StepBackend):
    name = "fake"
    model_name = "fake-model"
    context_length = 4096
    vocab_size = 1000
    weights = "none"
    options: ClassVar[frozenset[str]] = frozenset()
    spec_methods: ClassVar[tuple[str, ...]] = ("ngram",)  # its "model" says the token after each fed position

    def __init__(self, seconds_per_token: float = 0.001, seconds_per_step: float = 0.01) -> None:
        self.clock = 0.0
        self.per_token, self.per_step = seconds_per_token, seconds_per_step
        self.steps: list[Step] = []
        self.released: list[int] = []
        self.truncated: list[tuple[int, int]] = []  # (seq_id, tokens kept) of every rollback
        self.slots = SlotTable(0)
        self.executed = 0
        self.fail_at, self.kill_at = _step_number(FAIL_AT_VARIABLE), _step_number(KILL_AT_VARIABLE)

    @classmethod
    def load(cls, model: str | None = None, **options: Any) -> "FakeBackend":
        return cls()

    def prepare(self, max_sequences, max_seq_len, max_step_tokens):
        self.slots = SlotTable(max_sequences)

    def execute(self, step, return_logits=False):
        self.executed += 1
        if self.executed == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.executed == self.fail_at:
            raise BackendError(f"fake failure at step {self.executed} ({FAIL_AT_VARIABLE})")
        for seq_id in [c.seq_id for c in step.prefills] + [d.seq_id for d in step.decodes]:
            self.slots.slot(seq_id)
        self.steps.append(step)
        self.clock += self.per_step + self.per_token * step.n_tokens
        nxt = {c.seq_id: c.end % 997 for c in step.prefills if c.is_last}
        nxt.update({d.seq_id: (d.position + 1) % 997 for d in step.decodes})
        verified = {d.seq_id: tuple((d.position + 1 + i) % 997 for i in range(1 + len(d.drafts)))
                    for d in step.decodes if d.drafts}
        return StepResult(nxt, verified=verified)

    def truncate(self, seq_id, n_tokens):
        self.truncated.append((seq_id, n_tokens))

    def release(self, seq_id):
        self.released.append(seq_id)
        self.slots.release(seq_id)

    def now(self):
        return self.clock

    def wait_until(self, t, *, stalled=False, idle=False):
        self.clock = max(self.clock, t)

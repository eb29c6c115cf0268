"""The sim's --trace: one JSON line per priced step, with every operator's time, FLOPs and bytes."""
from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from prefillbench.backends.sim.cost import StepCost
from prefillbench.step import Step
from prefillbench.writers import jsonl_text


class StepTrace:
    """Writes as steps are priced (the file opens at the first step), so an interrupted run keeps its steps."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: TextIO | None = None

    def write(self, run: int, step_no: int, step: Step, start: float, cost: StepCost, **extra: Any) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w")
        rec = {
            "run": run,
            "step": step_no,
            "start_s": start,
            "seconds": cost.seconds,
            "prefill_chunks": [[c.seq_id, c.start, len(c.tokens), c.pad] for c in step.prefills],
            "decode_contexts": [d.position + 1 for d in step.decodes],
            "stage_seconds": [s.seconds for s in cost.stages],
            "ops": {k: {"ms": v["seconds"] * 1e3, "gflop": v["flops"] / 1e9, "mb": v["bytes"] / 1e6, "bound": v["bound"]}
                    for k, v in cost.breakdown().items()},
            **extra,
        }
        if step.policy_values:  # the strategy's state as it chose the step (SGLang's ratio, slo-budget's budget)
            rec["policy"] = dict(step.policy_values)
        self._file.write(jsonl_text([rec]))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

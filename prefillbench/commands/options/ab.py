"""`prefillbench ab`'s options and its default preset."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefillbench.bench import stats
from prefillbench.errors import UsageError
from prefillbench.report.ab import AB_METRICS, DEFAULT_GATED, DEFAULT_THRESHOLD


# Small on purpose: each side runs it once per round, and short runs keep a round's two runs
# close in time. One thread: llama.cpp's threads spin-wait on each other, and with as many
# threads as cores any other process on the runner can slow a run several-fold (measured 7x
# on a shared 2-core machine), noise no pairing can cancel. About 15 s a run on a quiet 2-core CPU.
DEFAULT_PRESET = ["--backend", "auto", "-t", "1", "-p", "0", "-n", "0", "--pg", "64,16", "-c", "4",
                  "-s", "sequential,padded,chunked", "--chunk-size", "32", "-r", "1", "--interleave"]
DEFAULT_MIN_ROUNDS = 5
DEFAULT_MAX_ROUNDS = 12
DEFAULT_MAX_SECONDS = 480.0


@dataclass
class ABOptions:
    base_ref: str
    preset: list[str] = field(default_factory=lambda: list(DEFAULT_PRESET))
    repo: Path = Path(".")
    metrics: list[str] = field(default_factory=lambda: list(AB_METRICS))
    gated: list[str] = field(default_factory=lambda: list(DEFAULT_GATED))
    threshold: float = DEFAULT_THRESHOLD
    confidence: float = stats.DEFAULT_CONFIDENCE
    min_rounds: int = DEFAULT_MIN_ROUNDS
    max_rounds: int = DEFAULT_MAX_ROUNDS
    max_seconds: float = DEFAULT_MAX_SECONDS
    out: Path | None = None  # keep every round's exports here
    summary: Path | None = None

    @classmethod
    def from_flags(cls, base: str, run_args: list[str] | None, metric: list[str] | None, gate: list[str] | None,
                   confidence: float, **flags: Any) -> ABOptions:
        metrics = metric or list(AB_METRICS)
        options = cls(base_ref=base, preset=list(run_args or DEFAULT_PRESET), metrics=metrics,
                      gated=gate or [m for m in DEFAULT_GATED if m in metrics], confidence=confidence / 100, **flags)
        options.validate()
        return options

    def validate(self) -> None:
        if self.min_rounds < 2:
            raise UsageError(f"--min-rounds must be at least 2 (an interval needs two rounds), got {self.min_rounds}")
        if self.max_rounds < self.min_rounds:
            raise UsageError(f"--max-rounds ({self.max_rounds}) is below --min-rounds ({self.min_rounds})")
        if not 0 < self.confidence < 1:
            raise UsageError(f"--confidence must lie between 0 and 100%, got {100 * self.confidence:g}%")
        unknown = [m for m in self.gated if m not in self.metrics]
        if unknown:
            raise UsageError(f"--gate {unknown[0]} is not among the compared metrics ({', '.join(self.metrics)})")
        for flag in ("--export", "--export-requests", "-o", "--output", "--relative-to", "--verify"):
            if flag in self.preset:
                raise UsageError(f"the preset may not set {flag}: the A/B job sets its own output")

"""The options of the commands that read exports: compare, plot and merge."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prefillbench.bench import stats
from prefillbench.report.compare import DEFAULT_METRICS


@dataclass
class CompareOptions:
    base: str
    current: str
    metric: list[str] = field(default_factory=lambda: list(DEFAULT_METRICS))
    threshold: float = 10.0  # percent
    relative_to: str | None = None
    noisy_cv: float = 100 * stats.DEFAULT_NOISY_CV  # percent
    output: str = "md"
    no_verdict: bool = False

    @classmethod
    def from_flags(cls, **flags: Any) -> CompareOptions:
        return cls(**{**flags, "metric": flags.get("metric") or list(DEFAULT_METRICS)})


@dataclass
class PlotOptions:
    files: list[str]
    out: str

    @classmethod
    def from_flags(cls, **flags: Any) -> PlotOptions:
        return cls(**flags)


@dataclass
class MergeOptions:
    """`prefillbench merge`: the shards' exports, how to print the merged report, and where to export it."""

    files: list[str]
    output: str = "md"
    export: str | None = None

    @classmethod
    def from_flags(cls, **flags: Any) -> MergeOptions:
        from prefillbench.commands.options.common import check_export

        options = cls(**flags)
        check_export(options.export)
        return options

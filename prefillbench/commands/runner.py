"""What `run` and `capacity` share around their measurements: the backend announced, rank 0 alone speaking,
one progress bar, and a Ctrl-C or a failing step that ends the run but keeps what was measured."""
from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from prefillbench.backends import load_backend
from prefillbench.backends.base import Backend, BackendError
from prefillbench.backends.distributed import is_rank_zero, process_rank
from prefillbench.commands.options import BackendOptions


def error_prefix() -> str:
    """`prefillbench: error`, naming the rank under torchrun past rank 0.

    Every rank reports its own failure: one that only rank 1 hit must not go unseen.
    """
    return "prefillbench: error" if is_rank_zero() else f"prefillbench: error (rank {process_rank()})"


def open_backend(options: BackendOptions) -> Backend:
    backend = load_backend(options.backend, options.model, **options.load_options())
    backend.skip_idle = bool(options.skip_idle)
    # What is loaded by now (the libraries, the model) lives as long as the process: keep it out of the
    # collector's full passes, which walk every object each time (with torch imported, 18% of a sim probe).
    gc.collect()
    gc.freeze()
    if is_rank_zero():
        print(f"prefillbench: {backend.model_name} on {backend.label}, weights: {backend.weights}", file=sys.stderr)
        if backend.skip_idle and backend.name != "sim":
            print("prefillbench: --skip-idle: where no step runs until the next arrival, the clock jumps there "
                  "(--no-skip-idle sleeps through it)", file=sys.stderr)
    return backend


def progress_bar(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
        TimeElapsedColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), disable=not enabled, transient=True,
    )


@dataclass
class Measured:
    """What a run kept: its results, in order, and how it ended if not by finishing."""

    results: list[Any] = field(default_factory=list)
    interrupted: bool = False
    failure: BackendError | None = None

    def ending(self, what: str) -> int | None:
        """The exit status and its line on stderr if the run ended early, else None. `what`: e.g. "measured row(s)"."""
        if self.interrupted:
            print(f"prefillbench: interrupted; kept {len(self.results)} {what}", file=sys.stderr)
            return 130
        if self.failure is not None:
            print(f"{error_prefix()}: {self.failure} (kept {len(self.results)} {what})", file=sys.stderr)
            return 2
        return None


@dataclass
class Progress:
    """The bar's two handles the measuring code needs: advance by tokens, and relabel or resize the bar."""

    bar: Any
    task: Any

    def advance(self, n: int) -> None:
        self.bar.advance(self.task, n)

    def describe(self, label: str) -> None:
        self.bar.update(self.task, description=label)

    def restart(self, total: int, label: str) -> None:
        self.bar.reset(self.task, total=total, description=label)

    def print(self, text: str) -> None:
        """A line above the bar (the bar stays at the bottom)."""
        self.bar.console.print(text, highlight=False, soft_wrap=True)


@contextmanager
def measuring(total: int, show_progress: bool) -> Iterator[tuple[Measured, Progress]]:
    """A progress bar on rank 0 (unless turned off) and a Measured that keeps every result appended to it:
    a Ctrl-C or a BackendError (llama.cpp out of KV space, ...) inside ends the measuring, not the command."""
    measured = Measured()
    bar = progress_bar(show_progress and is_rank_zero())
    with bar:
        progress = Progress(bar, bar.add_task("", total=total))
        try:
            yield measured, progress
        except KeyboardInterrupt:
            measured.interrupted = True
        except BackendError as e:
            measured.failure = e

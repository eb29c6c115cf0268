"""One measuring session for every command that measures (run, capacity, tune).

It opens the backend (on every rank under torchrun; rank 0 alone prints and writes), builds the one metadata
record every export carries (meta.run_metadata: version, commit, machine, libraries, the command line, the
date), shows one progress bar, and keeps results as they finish: each one kept rewrites every output file
from all results so far, whole (writers.write_atomic), so a run killed after N results leaves N in its files.
A Ctrl-C (exit 130) or a failing step or backend (exit 2, one line) ends the measuring, not the command: what
finished is printed and written as if the run had ended there.
"""
from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefillbench.backends import load_backend
from prefillbench.backends.base import Backend, BackendError
from prefillbench.backends.distributed import is_rank_zero, process_rank
from prefillbench.commands.options import BackendOptions
from prefillbench.meta import run_metadata
from prefillbench.writers import check_writable


def error_prefix() -> str:
    """`prefillbench: error`, naming the rank under torchrun past rank 0.

    Every rank reports its own failure: one that only rank 1 hit must not go unseen.
    """
    return "prefillbench: error" if is_rank_zero() else f"prefillbench: error (rank {process_rank()})"


def open_backend(options: BackendOptions) -> Backend:
    backend = load_backend(options.backend, options.model, **options.load_options())
    backend.skip_idle = bool(options.skip_idle)
    for size in options.kv_host_grid:  # each host-tier size a grid runs, refused now if the backend cannot price it
        backend.with_kv_host_cache(size)
    # What is loaded by now (the libraries, the model) lives as long as the process: keep it out of the
    # collector's full passes, which walk every object each time (with torch imported, 18% of a sim probe).
    gc.collect()
    gc.freeze()
    if is_rank_zero():
        print(f"prefillbench: {backend.model_name} on {backend.label}, weights: {backend.weights}", file=sys.stderr)
        if getattr(backend, "reports_scheduling", True) is False:
            print(f"prefillbench: {backend.label} reports no prompt progress, so no request's scheduling delay is known: "
                  "the median scheduling-delay bound of capacity and tune is dropped (the queue's growth, read on the "
                  "first tokens, still bounds a rate)", file=sys.stderr)
        if backend.skip_idle and backend.name != "sim":
            print("prefillbench: --skip-idle: where no step runs until the next arrival, the clock jumps there "
                  "(--no-skip-idle sleeps through it)", file=sys.stderr)
    return backend


def progress_bar(enabled: bool, unit: str = "tokens"):
    """The one progress bar: on stderr, gone when done (the table follows), counting `unit`."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
        TimeElapsedColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), disable=not enabled, transient=True,
    )


@dataclass
class Progress:
    """The bar's handles the measuring code needs: advance, relabel, resize, and print a line above it."""

    bar: Any
    task: Any

    def advance(self, n: int = 1) -> None:
        self.bar.advance(self.task, n)

    def describe(self, label: str) -> None:
        self.bar.update(self.task, description=label)

    def restart(self, total: float, label: str) -> None:
        self.bar.reset(self.task, total=total, description=label)

    def resize(self, total: float) -> None:
        self.bar.update(self.task, total=total)

    def print(self, text: str) -> None:
        """A line above the bar (the bar stays at the bottom)."""
        self.bar.console.print(text, highlight=False, soft_wrap=True)


@dataclass
class Output:
    """A file the session keeps current: `write(path, results, meta)` writes it whole from every result so far."""

    path: Path
    write: Callable[[Path, list[Any], dict[str, Any]], Any]  # may return the files it wrote (an export of several)
    failure: str | None = None  # why it could not be written; it is not tried again
    files: list[Path] = field(default_factory=list)  # what the last write wrote

    def update(self, results: list[Any], meta: dict[str, Any]) -> None:
        if self.failure is not None:
            return
        try:
            written = self.write(self.path, results, meta)
            self.files = list(written) if isinstance(written, list) else [self.path]
        except OSError as e:
            self.failure = f"cannot write {e.filename or self.path}: {e.strerror or e}"


@dataclass
class Session:
    """A command's measuring: its backend, its metadata, its results and the files they are kept in."""

    backend: Backend
    meta: dict[str, Any]
    outputs: list[Output] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)
    interrupted: bool = False
    failure: BackendError | None = None
    progress: Progress | None = None
    deployment: Any = None  # a disaggregated deployment of the backend's instances (deploy/), for its metadata

    def keep(self, *results: Any) -> None:
        """Finished cases, searches or configurations: added, and every output rewritten with them."""
        self.results.extend(results)
        self.refresh()
        self.save()

    def refresh(self) -> None:
        """The backend's metadata again: some of it is what the runs found (clamps, the sim's stage use, a
        deployment's handoffs)."""
        self.meta.update(self.backend.metadata())
        if self.deployment is not None:
            self.meta.update(self.deployment.metadata())

    def save(self, pending: list[Any] | None = None) -> None:
        """Rewrite every output from the results (and `pending`: what is known of one under way)."""
        results = self.results + (pending or [])
        for output in self.outputs:
            output.update(results, self.meta)

    @contextmanager
    def measuring(self, total: float, show_progress: bool, unit: str = "tokens") -> Iterator[Progress]:
        """A progress bar on rank 0 (unless turned off); a Ctrl-C or a BackendError (llama.cpp out of KV space, ...)
        inside ends the measuring, not the command, and is remembered for `ending`."""
        bar = progress_bar(show_progress and is_rank_zero(), unit)
        with bar:
            self.progress = Progress(bar, bar.add_task("", total=total))
            try:
                yield self.progress
            except KeyboardInterrupt:
                self.interrupted = True
            except BackendError as e:
                self.failure = e
            self.refresh()

    def stop(self, interrupted: bool = False, failure: BackendError | None = None) -> None:
        """Told of an ending the measuring code caught itself (tune's grids keep their partial results)."""
        self.interrupted = self.interrupted or interrupted
        self.failure = self.failure or failure

    def written(self) -> list[Path]:
        """Every file the outputs hold now (an export of several files counts each)."""
        return [f for o in self.outputs if o.failure is None for f in o.files]

    def ending(self, what: str, count: int | None = None) -> int:
        """The exit status, with its line on stderr where the run ended early or a file could not be written:
        130 on Ctrl-C, 2 on a failure, else 0. `what`: what was kept, e.g. "measured row(s)"."""
        kept = len(self.results) if count is None else count
        failed = [o.failure for o in self.outputs if o.failure is not None]
        for line in failed:
            print(f"prefillbench: error: {line} (the {kept} {what} are on stdout)", file=sys.stderr)
        if self.interrupted:
            print(f"prefillbench: interrupted; kept {kept} {what}", file=sys.stderr)
            return 130
        if self.failure is not None:
            print(f"{error_prefix()}: {self.failure} (kept {kept} {what})", file=sys.stderr)
            return 2
        return 2 if failed else 0


_open: list[Session] = []


def close_sessions() -> None:
    """Close the backends the command's sessions opened (a server process stops here)."""
    from prefillbench.deploy import close_deployments

    close_deployments()  # the prefill process of a gguf deployment, first: it holds the pipe to this one
    while _open:
        _open.pop().backend.close()


def open_session(load: BackendOptions, outputs: list[Output], **settings: Any) -> Session:
    """Check every output can be written (before minutes of measuring), open the backend, build the metadata
    (`settings`: the command's own, recorded beside the provenance). Past rank 0 nothing is written."""
    outputs = outputs if is_rank_zero() else []
    for output in outputs:
        check_writable(output.path)
    backend = open_backend(load)
    meta = run_metadata(backend.metadata())
    meta.update(model_path=load.model or "default", backend_name=backend.name, device=backend.device,
                skip_idle=backend.skip_idle, **settings)
    session = Session(backend, meta, outputs)
    if (spec := load.deployment()) is not None:  # the pools, their link and its source
        from prefillbench.deploy import deployment_for

        session.deployment = deployment_for(backend, spec)
        meta.update(session.deployment.metadata())
    _open.append(session)
    return session

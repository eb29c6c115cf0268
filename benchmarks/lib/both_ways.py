"""One switch of the torch backend timed on and off over whole steps of the default model: the setup, the
switch, the table (benchmarks.cpu.* and benchmarks.torch.query_blocks)."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import numpy as np
import torch

from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.models import default_model_path
from prefillbench.step import Step

from benchmarks.lib.timing import Clock, Timing, time_both_ways


def add_both_ways_arguments(parser: argparse.ArgumentParser, context_help: str) -> None:
    """The flags of the benchmarks that time one switch both ways on the default model."""
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=1024, help=context_help)


def default_backend(dtype: str, n_slots: int, max_len: int, **options) -> TorchBackend:
    """The default model on the CPU, prepared for `n_slots` sequences of `max_len` positions, every slot held
    (slot i for sequence i), as the benchmarks that time single steps set it up; `options` as TorchBackend.load's."""
    backend = TorchBackend.load(default_model_path(), device="cpu", dtype=dtype, **options)
    backend.prepare(n_slots, max_len, max_len * n_slots)
    for s in range(n_slots):
        backend.slots.slot(s)
    return backend


def switch_backend(args: argparse.Namespace, n_slots: int, extra_positions: int, kernel=None, what: str = "",
                   **options) -> TorchBackend:
    """default_backend for the flags of add_both_ways_arguments (threads set, `extra_positions` past --context),
    after exiting with a line if the C kernel module `kernel` (called `what`) is not in use."""
    torch.set_num_threads(args.threads)
    if kernel is not None and kernel.status():
        sys.exit(f"the {what} {kernel.status()}")
    return default_backend(args.dtype, n_slots, args.context + extra_positions, **options)


def compare_switch(backend: TorchBackend, switch: Callable[[bool], None], steps: dict[str, Step], args: argparse.Namespace,
                   on: str, off: str, note: str = "") -> None:
    """Time `steps` with `switch` on and off, alternated, and print the table with each step's logits compared,
    under a header naming the run (and `note`, a line of the caller's)."""
    run = switched_run(backend, switch)
    logits = logit_column(run, steps)
    times = time_both_ways(run, steps, args.reps, Clock(torch.device("cpu")))
    print(f"# {backend.model_name}, {args.dtype}, {torch.get_num_threads()} threads, {args.reps} interleaved reps; "
          f"decodes at {args.context} positions")
    if note:
        print(note)
        print()
    print_both_ways(times, "step", on, off, logits)


def switched_run(backend: TorchBackend, switch: Callable[[bool], None]) -> Callable[..., object]:
    """run(step, on, logits=False) for time_both_ways: the backend's step with `switch(on)` applied, and
    `switch(True)` again after it, whatever happened."""

    def run(step: Step, on: bool, logits: bool = False):
        switch(on)
        try:
            return backend.execute(step, return_logits=logits)
        finally:
            switch(True)

    return run


def kernel_switch(backend: TorchBackend, kernel) -> Callable[..., object]:
    """switched_run with the C kernel module `kernel` as it is (on), or with its applies() refusing every call,
    so the step takes the kernel's fallback (off)."""
    applies = kernel.applies

    def switch(on: bool) -> None:
        kernel.applies = applies if on else (lambda *a: False)

    return switched_run(backend, switch)


def logit_column(run: Callable[..., object], cases: dict) -> tuple[str, dict[object, str]]:
    """print_both_ways' extra column: each case's largest |logit| difference between run(case, True, logits=True)
    and run(case, False, logits=True)."""
    diffs = {}
    for name, case in cases.items():
        on, off = (run(case, way, logits=True).logits for way in (True, False))
        diffs[name] = f"{max(float(np.abs(on[s] - off[s]).max()) for s in on):.1e}"
    return "logits max abs diff", diffs


def print_both_ways(times: dict[object, tuple[Timing, Timing]], case: str, on: str, off: str,
                    extra: tuple[str, dict[object, str]] | None = None) -> None:
    """time_both_ways' result as a table: each way's median, their ratio, the paired median of the ratios,
    and an optional column of the caller's ((header, {case: text}))."""
    head = f"| {case} | {on} ms | {off} ms | {on} / {off} (medians) | paired median |"
    print(head + (f" {extra[0]} |" if extra else ""))
    print("| --- | ---: | ---: | ---: | ---: |" + (" ---: |" if extra else ""))
    for name, (a, b) in times.items():
        row = f"| {name} | {a.median * 1e3:.1f} | {b.median * 1e3:.1f} | {a.median / b.median:.3f} | {a.paired_ratio(b):.3f} |"
        print(row + (f" {extra[1][name]} |" if extra else ""))

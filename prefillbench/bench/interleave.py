"""`run --interleave`: strategies take turns, repetition by repetition, so their ratios survive drift.

Run case by case, every repetition of sequential comes before any of chunked;
if the machine slows down in between (another job starts, the CPU heats up),
the chunked/sequential ratio moves though neither strategy changed. Here the
cases of one test and concurrency are warmed up together and then measured in
turns, in ABBA order (A B C, C B A, A B C, ...), which cancels drift that is
linear in time out of the means and so out of their ratios. The rows are the
same as without --interleave; only the order of the timed runs differs.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from prefillbench import engine
from prefillbench.backends.base import Backend
from prefillbench.bench.cases import BenchConfig, CaseResult, case_result, prepare_case


def turn_order(n_cases: int, repetition: int) -> list[int]:
    """ABBA: forwards on even repetitions, backwards on odd ones."""
    order = list(range(n_cases))
    return order if repetition % 2 == 0 else order[::-1]


def run_interleaved(
    backend: Backend,
    config: BenchConfig,
    on_tokens: Callable[[int], None] | None = None,
    on_group: Callable[[str], None] | None = None,
) -> Iterator[CaseResult]:
    """Yield a CaseResult per case, a group (test × concurrency) at a time."""
    for group in config.case_groups():
        if on_group is not None:
            on_group(f"{group[0].test.name} c={group[0].concurrency} ({len(group)} interleaved)")
        prepared = []
        for case in group:
            strategy, requests = prepare_case(backend, case, config)
            prepared.append((case, strategy, requests, []))
        for rep in range(config.repetitions):
            for i in turn_order(len(prepared), rep):
                case, strategy, requests, runs = prepared[i]
                runs.append(engine.run(backend, strategy, requests, case.concurrency, on_tokens=on_tokens))
        for case, _, _, runs in prepared:
            yield case_result(backend, case, runs, config)

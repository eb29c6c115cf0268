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

from strategies import make_strategy

from . import engine
from .backends.base import Backend
from .bench import BenchConfig, Case, CaseResult
from .metrics import summarize
from .workloads import make_requests


def case_groups(config: BenchConfig) -> list[list[Case]]:
    """The cases of each test and concurrency, in the order `config.cases()` gives them."""
    groups: dict[tuple, list[Case]] = {}
    for case in config.cases():
        groups.setdefault((case.test, case.concurrency), []).append(case)
    return list(groups.values())


def turn_order(n_cases: int, repetition: int) -> list[int]:
    """ABBA: forwards on even repetitions, backwards on odd ones."""
    order = list(range(n_cases))
    return order if repetition % 2 == 0 else order[::-1]


def run_interleaved(
    backend: Backend,
    config: BenchConfig,
    on_token: Callable[[int], None] | None = None,
    on_group: Callable[[str], None] | None = None,
) -> Iterator[CaseResult]:
    """Yield a CaseResult per case, a group (test × concurrency) at a time."""
    for group in case_groups(config):
        if on_group is not None:
            on_group(f"{group[0].test.name} c={group[0].concurrency} ({len(group)} interleaved)")
        prepared = []
        for case in group:
            strategy = make_strategy(case.strategy, case.chunk_size or 256)
            requests = make_requests(case.test, config.n_requests(case.concurrency), backend.vocab_size, config.seed)
            if config.warmup:
                # As bench.run_case: the first pass after load pays for allocation and kernel selection.
                warm = make_requests(case.test, 1, backend.vocab_size, config.seed + 1)
                engine.run(backend, strategy, [type(warm[0])(warm[0].prompt, min(warm[0].n_gen, 2))], 1)
            prepared.append((case, strategy, requests, []))
        for rep in range(config.repetitions):
            for i in turn_order(len(prepared), rep):
                case, strategy, requests, runs = prepared[i]
                runs.append(engine.run(backend, strategy, requests, case.concurrency, on_token=on_token))
        for case, _, _, runs in prepared:
            row = summarize(
                case.test,
                runs,
                model=backend.model_name,
                backend=backend.label,
                strategy=case.strategy,
                concurrency=case.concurrency,
                chunk_size=case.chunk_size,
            )
            yield CaseResult(case, row, runs)

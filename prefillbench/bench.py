"""A benchmark: every test × strategy × concurrency × chunk size, warmed up and repeated."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from strategies import Strategy, make_strategy

from . import engine
from .backends.base import Backend
from .engine import RunRecord
from .metrics import ResultRow, summarize
from .workloads import Request, TestSpec, make_requests


@dataclass(frozen=True)
class Case:
    test: TestSpec
    strategy: str
    concurrency: int
    chunk_size: int | None  # None for strategies that ignore it


@dataclass
class BenchConfig:
    tests: list[TestSpec]
    strategies: list[str]
    concurrency: list[int]
    chunk_sizes: list[int] = field(default_factory=lambda: [256])
    repetitions: int = 3
    requests: int | None = None  # per test; None = the concurrency
    seed: int = 42
    warmup: bool = True

    def validate(self) -> None:
        for c in self.concurrency:
            if c < 1:
                raise ValueError(f"concurrency must be at least 1, got {c}")
        for c in self.chunk_sizes:
            if c < 1:
                raise ValueError(f"chunk size must be at least 1, got {c}")
        if self.repetitions < 1:
            raise ValueError(f"repetitions must be at least 1, got {self.repetitions}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests must be at least 1, got {self.requests}")
        for name in self.strategies:
            make_strategy(name)
        if not self.tests:
            raise ValueError("no test to run: every -p, -n and --pg value is 0")

    def n_requests(self, concurrency: int) -> int:
        return max(self.requests or concurrency, 1)

    def cases(self) -> Iterator[Case]:
        for test in self.tests:
            for name in self.strategies:
                sizes = self.chunk_sizes if make_strategy(name).uses_chunk_size else [None]
                for c in self.concurrency:
                    for size in sizes:
                        yield Case(test, name, c, size)

    def tokens_to_emit(self) -> int:
        """Tokens the whole benchmark emits, for a progress bar."""
        return sum(
            self.repetitions * self.n_requests(case.concurrency) * case.test.tokens_to_generate for case in self.cases()
        )


@dataclass
class CaseResult:
    case: Case
    row: ResultRow
    runs: list[RunRecord]


#: Warm-up prompts are cut to this length: enough to exercise every kernel, short enough to cost little.
WARMUP_PROMPT_TOKENS = 128


def warm_up(backend: Backend, strategy: Strategy, case: Case, config: BenchConfig) -> None:
    """One untimed pass at the case's concurrency: the first pass after load, and the first
    at a new batch shape, pay for allocation and kernel selection; keep that out of the numbers."""
    warm = make_requests(case.test, case.concurrency, backend.vocab_size, config.seed + 1)
    short = [Request(r.prompt[:WARMUP_PROMPT_TOKENS], min(r.n_gen, 2)) for r in warm]
    engine.run(backend, strategy, short, case.concurrency)


def prepare_case(backend: Backend, case: Case, config: BenchConfig) -> tuple[Strategy, list[Request]]:
    """The case's strategy and requests, with the backend warmed up for it."""
    strategy = make_strategy(case.strategy, case.chunk_size or 256)
    requests = make_requests(case.test, config.n_requests(case.concurrency), backend.vocab_size, config.seed)
    if config.warmup:
        warm_up(backend, strategy, case, config)
    return strategy, requests


def case_result(backend: Backend, case: Case, runs: list[RunRecord]) -> CaseResult:
    row = summarize(
        case.test,
        runs,
        model=backend.model_name,
        backend=backend.label,
        strategy=case.strategy,
        concurrency=case.concurrency,
        chunk_size=case.chunk_size,
    )
    return CaseResult(case, row, runs)


def run_case(backend: Backend, case: Case, config: BenchConfig, on_token: Callable[[int], None] | None = None) -> CaseResult:
    strategy, requests = prepare_case(backend, case, config)
    runs = [engine.run(backend, strategy, requests, case.concurrency, on_token=on_token) for _ in range(config.repetitions)]
    return case_result(backend, case, runs)


def verify(results: list[CaseResult]) -> list[str]:
    """Greedy tokens must not depend on the strategy; return a line per disagreement."""
    groups: dict[tuple, list[CaseResult]] = {}
    for r in results:
        groups.setdefault((r.case.test, r.case.concurrency), []).append(r)
    problems = []
    for (test, c), members in groups.items():
        ref = members[0]
        ref_tokens = [req.tokens for req in ref.runs[0].requests]
        for other in members[1:]:
            for i, req in enumerate(other.runs[0].requests):
                if req.tokens != ref_tokens[i]:
                    first = next(k for k, (a, b) in enumerate(zip(req.tokens, ref_tokens[i])) if a != b)
                    problems.append(
                        f"{test.name} c={c} request {i}: {_label(other.case)} differs from {_label(ref.case)} at generated token {first}"
                    )
    return problems


def _label(case: Case) -> str:
    return f"{case.strategy}({case.chunk_size})" if case.chunk_size else case.strategy

"""A benchmark: every test × strategy × concurrency × chunk size (× arrival rate), warmed up and repeated."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from strategies import Strategy, make_strategy

from . import engine
from .backends.base import Backend
from .engine import RunRecord
from .metrics import SLO, Load, ResultRow, summarize
from .workloads import ArrivalSpec, Request, TestSpec, make_requests, request_lengths

#: Requests per open-loop run when --requests is not given: enough for a p90, few enough for a CPU.
DEFAULT_OPEN_LOOP_REQUESTS = 10


@dataclass(frozen=True)
class Case:
    test: TestSpec
    strategy: str
    concurrency: int  # open loop: the cap on requests in flight, 0 for none
    chunk_size: int | None  # None for strategies that ignore it
    rate: float | None = None  # open loop at a set rate: requests/s


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
    arrival: str = "closed"  # closed, poisson, gamma, or trace (a workload file's own arrival times)
    rates: list[float] = field(default_factory=list)  # poisson and gamma: one case per rate
    burstiness: float = 1.0
    slo: SLO | None = None

    @property
    def open_loop(self) -> bool:
        return self.arrival != "closed"

    def arrival_spec(self, rate: float | None) -> ArrivalSpec:
        return ArrivalSpec(self.arrival, rate, self.burstiness)

    def load(self, case: Case) -> Load:
        return Load(self.arrival, case.rate, self.burstiness if self.arrival == "gamma" else None)

    def validate(self) -> None:
        for c in self.concurrency:
            if c < (0 if self.open_loop else 1):
                raise ValueError(f"concurrency must be at least {0 if self.open_loop else 1}, got {c}")
        if self.arrival in ("poisson", "gamma"):
            if not self.rates:
                raise ValueError(f"--arrival {self.arrival} needs --rate (requests per second)")
            for rate in self.rates:
                self.arrival_spec(rate)
        elif self.rates:
            raise ValueError("--rate needs --arrival poisson or gamma")
        else:
            self.arrival_spec(None)
        if self.arrival == "trace" and any(t.workload is None or t.workload.arrivals is None for t in self.tests):
            raise ValueError("replaying arrivals needs a workload file with arrival_s")
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

    def n_requests(self, case: Case) -> int:
        """A workload file's rows, --requests, or the default: the concurrency (closed) or a fixed count (open)."""
        if case.test.workload is not None:
            return len(case.test.workload)
        default = DEFAULT_OPEN_LOOP_REQUESTS if self.open_loop else case.concurrency
        return max(self.requests or default, 1)

    def requests_for(self, case: Case, vocab_size: int) -> list[Request]:
        n = self.n_requests(case)
        arrivals = self.arrival_spec(case.rate).times(n, self.seed, case.test)
        return make_requests(case.test, n, vocab_size, self.seed, arrivals)

    def cases(self) -> Iterator[Case]:
        rates: list[float | None] = list(self.rates) if self.rates else [None]
        for test in self.tests:
            for name in self.strategies:
                sizes = self.chunk_sizes if make_strategy(name).uses_chunk_size else [None]
                for c in self.concurrency:
                    for rate in rates:
                        for size in sizes:
                            yield Case(test, name, c, size, rate)

    def tokens_to_emit(self) -> int:
        """Tokens the whole benchmark emits, for a progress bar."""
        return sum(
            self.repetitions * sum(g for _, g in request_lengths(case.test, self.n_requests(case), self.seed))
            for case in self.cases()
        )


@dataclass
class CaseResult:
    case: Case
    row: ResultRow
    runs: list[RunRecord]


#: Warm-up prompts are cut to this length: enough to exercise every kernel, short enough to cost little.
WARMUP_PROMPT_TOKENS = 128


#: Sequences in flight during an open-loop case's warm-up when it has no cap.
WARMUP_OPEN_LOOP_CONCURRENCY = 4


def warm_up(backend: Backend, strategy: Strategy, case: Case, config: BenchConfig) -> None:
    """One untimed closed-loop pass at the case's concurrency: the first pass after load, and the first
    at a new batch shape, pay for allocation and kernel selection; keep that out of the numbers."""
    c = case.concurrency or WARMUP_OPEN_LOOP_CONCURRENCY
    warm = make_requests(case.test, c, backend.vocab_size, config.seed + 1)[:c]
    short = [Request(r.prompt[:WARMUP_PROMPT_TOKENS], min(r.n_gen, 2)) for r in warm]
    engine.run(backend, strategy, short, c)


def prepare_case(backend: Backend, case: Case, config: BenchConfig) -> tuple[Strategy, list[Request]]:
    """The case's strategy and requests, with the backend warmed up for it."""
    strategy = make_strategy(case.strategy, case.chunk_size or 256)
    requests = config.requests_for(case, backend.vocab_size)
    if config.warmup:
        warm_up(backend, strategy, case, config)
    return strategy, requests


def case_result(backend: Backend, case: Case, runs: list[RunRecord], config: BenchConfig) -> CaseResult:
    row = summarize(
        case.test,
        runs,
        model=backend.model_name,
        backend=backend.label,
        strategy=case.strategy,
        concurrency=case.concurrency,
        chunk_size=case.chunk_size,
        load=config.load(case),
        slo=config.slo,
    )
    return CaseResult(case, row, runs)


def run_case(backend: Backend, case: Case, config: BenchConfig, on_token: Callable[[int], None] | None = None) -> CaseResult:
    strategy, requests = prepare_case(backend, case, config)
    runs = [engine.run(backend, strategy, requests, case.concurrency, on_token=on_token) for _ in range(config.repetitions)]
    return case_result(backend, case, runs, config)


def verify(results: list[CaseResult]) -> list[str]:
    """Greedy tokens must not depend on the strategy; return a line per disagreement."""
    groups: dict[tuple, list[CaseResult]] = {}
    for r in results:
        groups.setdefault((r.case.test, r.case.concurrency, r.case.rate), []).append(r)
    problems = []
    for (test, c, _), members in groups.items():
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

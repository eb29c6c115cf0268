"""A benchmark: every test × strategy × concurrency × chunk size (× arrival rate), warmed up and repeated."""
from __future__ import annotations

import math

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from strategies import Strategy, configurations, make_strategy, strategy_label

from prefillbench import engine
from prefillbench.backends.base import Backend, LogitTolerance, ServingBackend
from prefillbench.engine import RunRecord
from prefillbench.bench.metrics import SLO, Load, ResultRow, host_label, implied_hit_rate, row_strategy, summarize
from prefillbench.bench.slo_pricing import StepPricing, priced
from prefillbench.deploy import Disaggregation, run_requests
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, arriving, make_requests, request_lengths
from prefillbench.sequence import Request

#: Requests per open-loop run when --requests is not given: enough for a p90, few enough for a CPU.
DEFAULT_OPEN_LOOP_REQUESTS = 10


@dataclass(frozen=True)
class Case:
    test: TestSpec
    strategy: str
    concurrency: int  # open loop: the cap on requests in flight, 0 for none
    chunk_size: int | None  # None for strategies that ignore it
    rate: float | None = None  # open loop at a set rate: requests/s
    #: GiB of host memory below the GPU's KV blocks, one size of a grid (0: none); None: the backend's own
    kv_host_gib: float | None = None


def case_backend(backend: Backend, case: Case) -> Backend:
    """The backend a case runs on: with the host tier its grid sizes (--kv-host-cache A,B), else as loaded."""
    return backend if case.kv_host_gib is None else backend.with_kv_host_cache(case.kv_host_gib)


def host_gib(backend: Backend, case: Case) -> float | None:
    """The row's host-tier size: the grid's (0 where it runs none), else the backend's (None: none asked)."""
    return case.kv_host_gib if case.kv_host_gib is not None else backend.kv_host_gib


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
    deployment: Disaggregation | None = None  # prefill apart from decode (deploy/); None: one engine
    pricing: StepPricing | None = None  # what a strategy that prices its steps (slo-budget) prices them by
    #: host-tier sizes, one configuration each (--kv-host-cache A,B; 0: none); [None]: the backend's own
    host_sizes: list[float | None] = field(default_factory=lambda: [None])

    def strategy_for(self, case: Case) -> Strategy:
        """The case's strategy, priced against the SLO where it prices its steps (bench/slo_pricing.py)."""
        slo = self.slo
        return priced(make_strategy(case.strategy, case.chunk_size), self.pricing, slo.tbt_ms if slo else None,
                      slo.tpot_ms if slo else None)

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
        if case.test.sessions is not None:
            return case.test.sessions.n * case.test.sessions.turns
        default = DEFAULT_OPEN_LOOP_REQUESTS if self.open_loop else case.concurrency
        return max(self.requests or default, 1)

    def requests_for(self, case: Case, vocab_size: int) -> list[Request]:
        n = self.n_requests(case)
        arrivals = self.arrival_spec(case.rate).times(arriving(case.test, n), self.seed, case.test)
        return make_requests(case.test, n, vocab_size, self.seed, arrivals)

    def cases(self) -> Iterator[Case]:
        rates: list[float | None] = list(self.rates) if self.rates else [None]
        budgets_of: dict[str, list[int | None]] = {}
        for name, size in configurations(self.strategies, self.chunk_sizes):
            budgets_of.setdefault(name, []).append(size)
        for test in self.tests:
            for name, sizes in budgets_of.items():
                for c in self.concurrency:
                    for rate in rates:
                        for size in sizes:
                            for host in self.host_sizes:
                                yield Case(test, name, c, size, rate, host)

    def case_groups(self) -> list[list[Case]]:
        """The cases of each test, concurrency and rate, in the order `cases()` gives them."""
        groups: dict[tuple, list[Case]] = {}
        for case in self.cases():
            groups.setdefault((case.test, case.concurrency, case.rate), []).append(case)
        return list(groups.values())

    def tokens_to_process(self) -> int:
        """Tokens the whole benchmark processes (see engine.run's on_tokens), for a progress bar."""
        return sum(
            self.repetitions * request_tokens(request_lengths(case.test, self.n_requests(case), self.seed))
            for case in self.cases()
        )


def request_tokens(lengths: list[tuple[int, int]]) -> int:
    """The tokens requests of these (prompt, generation) lengths make the engine process: every prompt token, and
    one decode per generated token after the first, which the prompt's last chunk yields."""
    return sum(p + max(g - 1, 0) for p, g in lengths)


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
    at a new batch shape, pay for allocation and kernel selection; keep that out of the numbers. A server warms
    itself after each launch (its flags follow the case), so nothing is sent here."""
    if isinstance(backend, ServingBackend):
        return
    c = case.concurrency or WARMUP_OPEN_LOOP_CONCURRENCY
    sessions = case.test.sessions
    warm = (sessions.requests(backend.vocab_size, config.seed + 1, [0.0] * sessions.n) if sessions is not None
            else make_requests(case.test, c, backend.vocab_size, config.seed + 1))[:c]
    short = [Request(r.prompt[:WARMUP_PROMPT_TOKENS], min(r.n_gen, 2)) for r in warm]
    # Its short sequences fit where the case's may not: a clamp of its own would be said first and hide the case's
    # (note_clamp says one line per asked count), so it is neither said nor kept.
    clamped, said = getattr(backend, "clamped", []), getattr(backend, "said_clamps", frozenset())
    say = backend.__dict__.get("say_clamp")
    backend.say_clamp = lambda asked, allowed, limit="": None
    try:
        engine.run(backend, strategy, short, c)
    finally:
        backend.clamped, backend.said_clamps = clamped, said
        if say is None:
            del backend.say_clamp
        else:
            backend.say_clamp = say


def prepare_case(backend: Backend, case: Case, config: BenchConfig) -> tuple[Strategy, list[Request]]:
    """The case's strategy and requests, with the backend warmed up for it."""
    strategy = config.strategy_for(case)
    requests = config.requests_for(case, backend.vocab_size)
    if config.warmup:
        warm_up(backend, strategy, case, config)
    return strategy, requests


def case_result(backend: Backend, case: Case, runs: list[RunRecord], config: BenchConfig) -> CaseResult:
    backend = case_backend(backend, case)
    implied = (implied_hit_rate(backend, [r.prompt for r in config.requests_for(case, backend.vocab_size)])
               if backend.caches_prefixes else math.nan)  # not rebuilding the requests where there is no cache
    row = summarize(
        case.test,
        runs,
        model=backend.model_name,
        backend=backend.label,
        strategy=row_strategy(backend, case.strategy),
        concurrency=case.concurrency,
        chunk_size=case.chunk_size,
        load=config.load(case),
        slo=config.slo,
        prefix_implied=implied,
        deployment=config.deployment.label if config.deployment else "",
        kv_host_gib=host_gib(backend, case),
    )
    return CaseResult(case, row, runs)


def run_case(backend: Backend, case: Case, config: BenchConfig, on_tokens: Callable[[int], None] | None = None) -> CaseResult:
    if config.deployment is not None:
        requests = config.requests_for(case, backend.vocab_size)
        if config.warmup and backend.name != "sim":  # both instances' first passes, untimed (warm_up's reason)
            short = [replace(r, prompt=r.prompt[:WARMUP_PROMPT_TOKENS], n_gen=min(r.n_gen, 2), arrival_s=0.0)
                     for r in requests[:WARMUP_OPEN_LOOP_CONCURRENCY]]
            run_requests(backend, case.strategy, case.chunk_size, short, case.concurrency, config.deployment)
        runs = [run_requests(backend, case.strategy, case.chunk_size, requests, case.concurrency, config.deployment,
                             on_tokens) for _ in range(config.repetitions)]
        return case_result(backend, case, runs, config)
    backend = case_backend(backend, case)
    strategy, requests = prepare_case(backend, case, config)
    runs = [engine.run(backend, strategy, requests, case.concurrency, on_tokens=on_tokens) for _ in range(config.repetitions)]
    return case_result(backend, case, runs, config)


def case_label(case: Case) -> str:
    """Its scheduler, and the host tier where its grid sizes one: what progress lines name."""
    return strategy_label(case.strategy, case.chunk_size) + host_label(case.kv_host_gib)


def _label(case: Case) -> str:
    return strategy_label(case.strategy, case.chunk_size)


@dataclass(frozen=True)
class LogitAgreement:
    """One strategy's logits against the reference strategy's, both fed the reference's tokens."""

    test: str
    concurrency: int
    strategy: str
    reference: str
    positions: int  # emitted positions compared, all requests
    max_abs_diff: float  # largest |logit difference| over every position and vocabulary entry
    confident: int  # positions where the reference's top-1 leads by more than the tolerance's margin
    top1_agree: int  # of those, positions with the same top-1
    near_ties: int  # positions with a different top-1 where the reference's lead is within the margin
    tolerance: LogitTolerance

    @property
    def top1_flips(self) -> int:
        return self.confident - self.top1_agree

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.tolerance.max_abs and self.top1_flips == 0


def in_request_order(run: RunRecord) -> list:
    """A run's request records in the order of the requests it was given. A run keeps admission order, which is the
    requests' own except for multi-turn sessions, whose later turns enter when the turn before them finishes (so two
    runs of the same sessions admit them in different orders): those are put back by (session, turn)."""
    if all(r.session is None for r in run.requests):
        return run.requests
    return sorted(run.requests, key=lambda r: (r.session is not None, r.session or 0, r.turn))


def teacher_forced(requests: list[Request], run: RunRecord) -> list[Request]:
    """The requests, each fed the tokens `run` made for it (a session's turn by its session and turn)."""
    key = lambda r, i: (r.session, r.turn) if r.session is not None else i  # noqa: E731
    tokens = {key(rec, i): rec.tokens for i, rec in enumerate(in_request_order(run))}
    return [replace(req, forced_tokens=tuple(tokens[key(req, i)])) for i, req in enumerate(requests)]


def compare_logits(reference: RunRecord, other: RunRecord) -> tuple[np.ndarray, np.ndarray]:
    """Both runs' logits, one row per emitted position, requests in order."""
    stack = lambda run: np.concatenate([np.stack(r.logits) for r in in_request_order(run)]).astype(np.float32)  # noqa: E731
    ref, got = stack(reference), stack(other)
    if ref.shape != got.shape:
        raise RuntimeError(f"the runs emitted {got.shape[0]} positions, the reference {ref.shape[0]}")
    return ref, got


def logit_agreement(case: Case, ref_case: Case, reference: RunRecord, other: RunRecord, tol: LogitTolerance) -> LogitAgreement:
    ref, got = compare_logits(reference, other)
    top2 = np.partition(ref, -2, axis=1)[:, -2:]
    confident = top2[:, 1] - top2[:, 0] > tol.margin
    same = got.argmax(axis=1) == ref.argmax(axis=1)
    return LogitAgreement(
        case.test.name, case.concurrency, _label(case), _label(ref_case), len(ref),
        float(np.abs(got - ref).max()) if len(ref) else 0.0,
        int(confident.sum()), int((same & confident).sum()), int((~same & ~confident).sum()), tol,
    )


def verify_logits(backend: Backend, config: BenchConfig, on_case: Callable[[str], None] | None = None) -> list[LogitAgreement]:
    """Teacher-forced verification: per test and concurrency, the first strategy runs free, and every
    other strategy is fed that run's tokens, so all compute logits for the same sequences and only the
    batching differs. Free-running tokens would diverge for good at the first near tie."""
    tol = backend.logit_tolerance()
    if tol is None:
        raise ValueError(f"--verify compares logits, and the {backend.name} backend computes none")
    results = []
    for ref_case, *others in config.case_groups():
        requests = config.requests_for(ref_case, backend.vocab_size)
        if on_case is not None:
            on_case(f"verify {ref_case.test.name} c={ref_case.concurrency}")
        reference = engine.run(backend, config.strategy_for(ref_case), requests, ref_case.concurrency, keep_logits=True)
        forced = teacher_forced(requests, reference)
        for case in others:
            run = engine.run(backend, config.strategy_for(case), forced, case.concurrency, keep_logits=True)
            results.append(logit_agreement(case, ref_case, reference, run, tol))
    return results


def verify_handoff(backend: Backend, config: BenchConfig,
                   on_case: Callable[[str], None] | None = None) -> list[LogitAgreement]:
    """--verify with --disaggregate: per case, one engine like the deployment's instances (gguf: one thread; another
    thread count sums in another order) runs free, and the deployment is fed its tokens: the first position's
    logits come from the prefill instance, the rest from the decode instance continuing the moved KV, each held to
    the backend's tolerance against the engine's."""
    from prefillbench.deploy import deployment_for

    tol = backend.logit_tolerance()
    if tol is None:
        raise ValueError(f"--verify compares logits, and the {backend.name} backend computes none")
    reference = getattr(deployment_for(backend, config.deployment), "reference", backend)
    out = []
    for case in config.cases():
        if on_case is not None:
            on_case(f"verify {case.test.name} {_label(case)}")
        requests = config.requests_for(case, backend.vocab_size)
        alone = engine.run(reference, make_strategy(case.strategy, case.chunk_size), requests, case.concurrency,
                           keep_logits=True)
        forced = teacher_forced(requests, alone)
        apart = deployment_for(backend, config.deployment).run(case.strategy, case.chunk_size, forced,
                                                               case.concurrency, keep_logits=True)
        agreement = logit_agreement(case, case, alone, apart, tol)
        out.append(replace(agreement, strategy=f"{agreement.strategy} {config.deployment.label}",
                           reference=f"{agreement.reference}, one engine"))
    return out

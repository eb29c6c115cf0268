"""Capacity: the highest request rate a strategy sustains within a latency SLO (Sarathi-Serve's method).

A probe runs `requests` requests arriving as a Poisson process (or a gamma
process) at one rate and checks Sarathi-Serve's two criteria: P99 time between
tokens within the SLO, and median scheduling delay (arrival to the first step
that carries the request) within a bound. The delay criterion tells a system
that keeps up from one whose queue grows for as long as requests keep coming:
above capacity the delay grows with the length of the run, below it stays near
zero.

The search brackets the capacity (doubling the rate from `start_rate` while
probes pass, halving it while they fail), then bisects the bracket until it is
narrower than `precision` times its low end. The capacity is the highest rate
seen to pass. The seeded arrival times at rate r are those at rate 1 divided by
r, so every probe replays the same requests, only compressed or stretched in time.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends.base import Backend
from prefillbench.bench.cases import BenchConfig, Case, warm_up
from prefillbench.bench.metrics import SLO, Load, ResultRow, summarize
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, make_requests, request_lengths

#: Sarathi-Serve's bound on the median scheduling delay.
DEFAULT_MAX_SCHED_DELAY_MS = 2000.0
DEFAULT_PRECISION = 0.05
DEFAULT_START_RATE = 1.0
#: Requests per probe. Above capacity the queue, and so the scheduling delay, grows for as long as requests
#: keep arriving: too few requests and a probe ends before the delay passes its bound. The sim runs in
#: virtual time, so it can afford a long trace; a real backend pays for every probe in wall time.
DEFAULT_REQUESTS_SIM = 1000
DEFAULT_REQUESTS = 30
#: The search gives up bracketing after this many doublings or halvings.
MAX_BRACKET_STEPS = 20


@dataclass(frozen=True)
class Criteria:
    """What a rate must meet to be within capacity."""

    tbt_p99_ms: float
    sched_delay_p50_ms: float = DEFAULT_MAX_SCHED_DELAY_MS

    def __post_init__(self) -> None:
        if not self.tbt_p99_ms > 0:
            raise ValueError(f"the P99 TBT SLO must be positive, got {self.tbt_p99_ms}")
        if not self.sched_delay_p50_ms > 0:
            raise ValueError(f"the median scheduling delay bound must be positive, got {self.sched_delay_p50_ms}")

    def met(self, row: ResultRow) -> bool:
        # A run without a single gap between tokens (one-token requests) has no TBT to miss.
        tbt_ok = math.isnan(row.tbt_p99_ms) or row.tbt_p99_ms <= self.tbt_p99_ms
        return tbt_ok and row.sched_delay_p50_ms <= self.sched_delay_p50_ms


@dataclass
class Probe:
    rate: float
    passed: bool
    row: ResultRow


@dataclass
class SearchResult:
    capacity: float  # 0: not even the lowest rate tried passed
    probes: list[Probe] = field(default_factory=list)

    @property
    def at_capacity(self) -> Probe:
        """The probe at the capacity, or the lowest one tried if none passed."""
        passing = [p for p in self.probes if p.passed and p.rate == self.capacity]
        return passing[0] if passing else min(self.probes, key=lambda p: p.rate)


def search(probe: Callable[[float], Probe], start_rate: float = DEFAULT_START_RATE,
           precision: float = DEFAULT_PRECISION) -> SearchResult:
    """Bracket, then bisect, the highest rate whose probe passes."""
    if not start_rate > 0:
        raise ValueError(f"the start rate must be positive, got {start_rate}")
    if not 0 < precision < 1:
        raise ValueError(f"the precision must be in (0, 1), got {precision}")
    probes: list[Probe] = []

    def run(rate: float) -> bool:
        p = probe(rate)
        probes.append(p)
        return p.passed

    lo, hi = None, None
    if run(start_rate):
        lo = start_rate
        for _ in range(MAX_BRACKET_STEPS):
            if not run(lo * 2):
                hi = lo * 2
                break
            lo *= 2
        else:
            return SearchResult(lo, probes)  # passes at every rate tried: report the highest
    else:
        hi = start_rate
        for _ in range(MAX_BRACKET_STEPS):
            if run(hi / 2):
                lo = hi / 2
                break
            hi /= 2
        else:
            return SearchResult(0.0, probes)
    while hi - lo > precision * lo:
        mid = (lo + hi) / 2
        if run(mid):
            lo = mid
        else:
            hi = mid
    return SearchResult(lo, probes)


@dataclass
class CapacityConfig:
    test: TestSpec
    strategies: list[str]
    chunk_sizes: list[int]
    criteria: Criteria
    requests: int = 100  # per probe
    concurrency: int = 0  # cap on requests in flight; 0: none (the KV cache still bounds it)
    arrival: str = "poisson"
    burstiness: float = 1.0
    seed: int = 42
    start_rate: float = DEFAULT_START_RATE
    precision: float = DEFAULT_PRECISION
    warmup: bool = True
    slo: SLO | None = None  # for the rows' goodput; None: the criteria's TBT alone

    def validate(self) -> None:
        if self.requests < 2:
            raise ValueError(f"a probe needs at least 2 requests, got {self.requests}")
        if self.concurrency < 0:
            raise ValueError(f"concurrency must be at least 0, got {self.concurrency}")
        if self.arrival not in ("poisson", "gamma"):
            raise ValueError(f"capacity probes arrive as a poisson or gamma process, not {self.arrival!r}")
        ArrivalSpec(self.arrival, self.start_rate, self.burstiness)
        if not 0 < self.precision < 1:
            raise ValueError(f"the precision must be in (0, 1), got {self.precision}")
        for name in self.strategies:
            make_strategy(name)
        for size in self.chunk_sizes:
            if size < 1:
                raise ValueError(f"chunk size must be at least 1, got {size}")

    def cases(self) -> list[Case]:
        out = []
        for name in self.strategies:
            sizes = self.chunk_sizes if make_strategy(name).uses_chunk_size else [None]
            out += [Case(self.test, name, self.concurrency, size) for size in sizes]
        return out

    @property
    def row_slo(self) -> SLO:
        return self.slo or SLO(tbt_ms=self.criteria.tbt_p99_ms)

    def tokens_per_probe(self) -> int:
        """Tokens one probe emits, for a progress bar."""
        return sum(g for _, g in request_lengths(self.test, self.requests, self.seed))

    def settings(self) -> dict[str, Any]:
        """The search's settings, for the export's metadata."""
        return {
            "capacity_tbt_p99_ms": self.criteria.tbt_p99_ms,
            "capacity_max_sched_delay_ms": self.criteria.sched_delay_p50_ms,
            "capacity_requests_per_probe": self.requests,
            "capacity_precision": self.precision,
            "capacity_start_rate": self.start_rate,
        }


@dataclass
class CapacityResult:
    case: Case
    search: SearchResult

    @property
    def capacity(self) -> float:
        return self.search.capacity

    @property
    def row(self) -> ResultRow:
        """The row measured at the capacity, with capacity_rps set and no fixed rate (the rate is what was searched),
        so that `compare` joins the rows of two capacity runs whatever rates they found."""
        return replace(self.search.at_capacity.row, capacity_rps=self.capacity, rate=None,
                       capacity_probes=len(self.search.probes))


def probe_case(backend: Backend, case: Case, config: CapacityConfig, rate: float,
               on_token: Callable[[int], None] | None = None) -> Probe:
    """One run of the case's requests at `rate`, checked against the criteria."""
    strategy = make_strategy(case.strategy, case.chunk_size or 256)
    spec = ArrivalSpec(config.arrival, rate, config.burstiness)
    requests = make_requests(case.test, config.requests, backend.vocab_size, config.seed,
                             spec.times(config.requests, config.seed, case.test))
    run = engine.run(backend, strategy, requests, case.concurrency, on_token=on_token)
    row = summarize(case.test, [run], model=backend.model_name, backend=backend.label, strategy=case.strategy,
                    concurrency=case.concurrency, chunk_size=case.chunk_size,
                    load=Load(config.arrival, rate, config.burstiness if config.arrival == "gamma" else None),
                    slo=config.row_slo)
    return Probe(rate, config.criteria.met(row), row)


def find_capacity(backend: Backend, case: Case, config: CapacityConfig,
                  on_probe_start: Callable[[Case, int, float], None] | None = None,
                  on_probe_done: Callable[[Case, Probe], None] | None = None,
                  on_token: Callable[[int], None] | None = None) -> CapacityResult:
    if config.warmup:
        warm_up(backend, make_strategy(case.strategy, case.chunk_size or 256), case,
                BenchConfig([case.test], [case.strategy], [case.concurrency], seed=config.seed))

    n_probes = 0

    def probe(rate: float) -> Probe:
        nonlocal n_probes
        n_probes += 1
        if on_probe_start is not None:
            on_probe_start(case, n_probes, rate)
        p = probe_case(backend, case, config, rate, on_token)
        if on_probe_done is not None:
            on_probe_done(case, p)
        return p

    return CapacityResult(case, search(probe, config.start_rate, config.precision))


def relative_capacities(results: list[CapacityResult], baseline: str) -> list[float]:
    """Each capacity over the baseline strategy's (NaN where it has none, or it is 0)."""
    refs = [r.capacity for r in results if r.case.strategy == baseline]
    ref = refs[0] if len(refs) == 1 else math.nan
    return [r.capacity / ref if ref and not math.isnan(ref) else math.nan for r in results]

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

from strategies import Strategy, configurations, make_strategy

from prefillbench import engine
from prefillbench.backends.base import Backend
from prefillbench.bench.cases import BenchConfig, Case, case_backend, host_gib, warm_up, request_tokens
from prefillbench.bench.engine_columns import memory_note
from prefillbench.bench.metrics import (SLO, Load, ResultRow, e2e_ms, implied_hit_rate, percentile, queue_growth, row_strategy,
                                        sched_delay_ms, summarize, tbts_ms, tpot_ms, ttft_ms, ttfts_ms)
from prefillbench.bench.pricing import Pricer, priced_by_kind
from prefillbench.bench.slo_pricing import StepPricing, priced
from prefillbench.deploy import Disaggregation, run_requests
from prefillbench.engine import Progress, RunRecord
from prefillbench.sequence import Request
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, arriving, make_requests, request_lengths

#: Sarathi-Serve's bound on the median scheduling delay.
DEFAULT_MAX_SCHED_DELAY_MS = 2000.0
DEFAULT_PRECISION = 0.05
#: The wait may grow by at most this share of the time requests arrive over (metrics.queue_growth, its lower 95%
#: bound): over capacity by a share x, the wait grows by x. The search's precision: a rate over capacity by less
#: cannot be told from one at capacity anyway, and one over it by more fails however short the probe.
DEFAULT_MAX_QUEUE_GROWTH = DEFAULT_PRECISION
DEFAULT_START_RATE = 1.0
#: Requests per probe. Above capacity the queue, and so the scheduling delay, grows for as long as requests
#: keep arriving: too few requests and a probe ends before the delay passes its bound. The sim runs in
#: virtual time, so it can afford a long trace; a real backend pays for every probe in wall time.
DEFAULT_REQUESTS_SIM = 1000
DEFAULT_REQUESTS = 30
#: The search gives up bracketing after this many doublings or halvings.
MAX_BRACKET_STEPS = 20


#: What can limit a capacity, as the tables name it.
LIMITS = {"tbt": "TBT", "ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E", "sched": "scheduling delay",
          "growth": "queue growth"}


@dataclass(frozen=True)
class Criteria:
    """What a rate must meet to be within capacity: latency limits at one percentile (P99 by default),
    Sarathi-Serve's bound on the median scheduling delay, and a wait that does not keep growing while requests
    arrive (`max_queue_growth`, metrics.queue_growth): Sarathi-Serve's traces are long enough for a growing queue to
    pass the delay bound; a probe of 30 requests on a real engine is not. `tbt_p99_ms` is the TBT limit at
    `percentile`."""

    tbt_p99_ms: float | None = None
    sched_delay_p50_ms: float = DEFAULT_MAX_SCHED_DELAY_MS
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    percentile: float = 99.0
    max_queue_growth: float = DEFAULT_MAX_QUEUE_GROWTH

    def __post_init__(self) -> None:
        for key in ("tbt", "ttft", "tpot", "e2e"):
            value = self.limit(key)
            if value is not None and not value > 0:
                raise ValueError(f"the {key} SLO must be positive, got {value}")
        if not self.sched_delay_p50_ms > 0:
            raise ValueError(f"the median scheduling delay bound must be positive, got {self.sched_delay_p50_ms}")
        if not 0 < self.percentile <= 100:
            raise ValueError(f"the percentile must be in (0, 100], got {self.percentile}")
        if not self.max_queue_growth > 0:
            raise ValueError(f"the queue growth bound must be positive, got {self.max_queue_growth}")

    @classmethod
    def from_slo(cls, slo: SLO, sched_delay_ms: float = DEFAULT_MAX_SCHED_DELAY_MS, percentile: float = 99.0,
                 max_queue_growth: float = DEFAULT_MAX_QUEUE_GROWTH) -> "Criteria":
        return cls(slo.tbt_ms, sched_delay_ms, slo.ttft_ms, slo.tpot_ms, slo.e2e_ms, percentile, max_queue_growth)

    def limit(self, key: str) -> float | None:
        return self.tbt_p99_ms if key == "tbt" else getattr(self, f"{key}_ms")

    def describe(self) -> str:
        """'TBT p99 <= 100 ms', for the verdict."""
        p = f"p{self.percentile:g}"
        return ", ".join(f"{LIMITS[k]} {p} <= {self.limit(k):g} ms" for k in ("tbt", "ttft", "tpot", "e2e")
                         if self.limit(k) is not None)

    def exceeded(self, values: dict[str, float]) -> list[str]:
        """The keys of LIMITS whose measured value (NaN: nothing to measure, so nothing missed) passes its limit."""
        over = [k for k in ("tbt", "ttft", "tpot", "e2e")
                if self.limit(k) is not None and not math.isnan(values[k]) and values[k] > self.limit(k)]
        if values["sched"] > self.sched_delay_p50_ms:
            over.append("sched")
        if values.get("growth", math.nan) > self.max_queue_growth:
            over.append("growth")
        return over

    def values(self, run: RunRecord) -> dict[str, float]:
        """Each criterion's figure of one run: latencies at the percentile, the median scheduling delay."""
        q = self.percentile
        reqs = run.requests
        return {"tbt": percentile(tbts_ms(run), q), "ttft": percentile(ttfts_ms(run), q),
                "tpot": percentile([tpot_ms(r) for r in reqs], q), "e2e": percentile([e2e_ms(r) for r in reqs], q),
                "sched": percentile([sched_delay_ms(r) for r in reqs], 50), "growth": queue_growth(run)}

    def met(self, row: ResultRow) -> bool:
        """At P99, from a row's own columns (a one-token run has no TBT to miss)."""
        values = {"tbt": row.tbt_p99_ms, "ttft": row.ttft_p99_ms, "tpot": row.tpot_p99_ms, "e2e": row.e2e_p99_ms,
                  "sched": row.sched_delay_p50_ms, "growth": row.queue_growth}
        return not self.exceeded(values)


@dataclass
class Probe:
    rate: float
    passed: bool
    row: ResultRow
    limited_by: list[str] = field(default_factory=list)  # the LIMITS keys this probe exceeded
    seed: int | None = None
    values: dict[str, float] = field(default_factory=dict)  # each criterion's figure (Criteria.values)
    #: Stopped once every criteria it was watched for had certainly failed (CertainFailure): `row` and `values`
    #: are those of the requests finished by then.
    stopped_early: bool = False
    #: When stopped early: the keys each watched criteria had certainly exceeded.
    certain: dict[Criteria, list[str]] = field(default_factory=dict)
    #: When priced (tune's measured stage), by step kind (pricing.STEP_KINDS): (seconds its steps took, seconds
    #: the calibrated sim charges for them).
    by_kind: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def busy_s(self) -> float:
        """Seconds its steps took (0 when not priced)."""
        return sum(took for took, _ in self.by_kind.values())

    @property
    def priced_s(self) -> float:
        """Seconds the calibrated sim charges for its steps (0 when not priced)."""
        return sum(priced for _, priced in self.by_kind.values())


class CertainFailure:
    """Tells, during a probe's run, when the criteria must fail however the run ends: a run above capacity
    need not be finished to fail it, and the runs above capacity (a queue that keeps growing) are the long ones.

    A percentile of n values (numpy's linear interpolation) is at least the value of rank floor((n-1)q/100),
    so it exceeds a limit L once n - floor((n-1)q/100) values are known to exceed L. What is known before a
    request ends: a finished request's figures; for one not yet scheduled, its scheduling delay, TTFT and E2E
    are at least now - arrival; for a running one, its next TBT is at least now - its last token, and its E2E
    at least now - arrival. n is known from the requests (TBTs: n_gen - 1 each). TPOT, a mean, is never
    called early. With several criteria (tune's list of SLOs) the run stops only when all of them fail.

    TBTs are counted once each as they appear (a check costs the tokens since the last one, not the run's).
    """

    KEYS = ("tbt", "ttft", "e2e", "sched")

    def __init__(self, criteria: list[Criteria], requests: list[Request]) -> None:
        self.criteria = criteria
        n_requests = len(requests)
        self.n = {"tbt": sum(max(r.n_gen - 1, 0) for r in requests), "ttft": n_requests, "e2e": n_requests,
                  "sched": n_requests}
        self.limits = [{k: (c.sched_delay_p50_ms if k == "sched" else c.limit(k)) for k in self.KEYS} for c in criteria]
        self.needed = [{k: self._needed(k, 50.0 if k == "sched" else c.percentile) for k in self.KEYS} for c in criteria]
        self._finished = 0
        self._done_over = [dict.fromkeys(self.KEYS, 0) for _ in criteria]  # finished requests' values over each limit
        # TBTs over each limit so far, per token list (a live request and its finished record share it), keyed by
        # the list's id: (the list, kept so that its id is not reused; tokens scanned; counts per criteria).
        self._tbt_scan: dict[int, tuple[list[float], int, list[int]]] = {}
        self.found: dict[Criteria, list[str]] = {}

    def _needed(self, key: str, q: float) -> int:
        """Values over the limit that make the percentile exceed it: its rank as numpy computes it, (q/100)(n-1)."""
        n = self.n[key]
        return n - math.floor(q / 100 * (n - 1)) if n else 0

    def _tbts_over(self, times: list[float]) -> list[int]:
        """Per criteria, the TBTs of this token list over its limit, counting only the tokens new since last time."""
        entry = self._tbt_scan.get(id(times))
        scanned, counts = (entry[1], entry[2]) if entry is not None else (1, [0] * len(self.criteria))
        if len(times) > scanned:
            gaps = [1000 * (b - a) for a, b in zip(times[scanned - 1:], times[scanned:])]
            for i, limits in enumerate(self.limits):
                if limits["tbt"] is not None:
                    counts[i] += sum(g > limits["tbt"] for g in gaps)
            self._tbt_scan[id(times)] = (times, len(times), counts)
        return counts

    def __call__(self, run: Progress) -> bool:
        for r in run.finished[self._finished:]:
            tbt = self._tbts_over(r.token_times)
            self._tbt_scan.pop(id(r.token_times), None)
            figures = {"ttft": ttft_ms(r), "e2e": e2e_ms(r), "sched": sched_delay_ms(r)}
            for i, limits in enumerate(self.limits):
                self._done_over[i]["tbt"] += tbt[i]
                for k, v in figures.items():
                    self._done_over[i][k] += limits[k] is not None and v > limits[k]
        self._finished = len(run.finished)
        now = run.now
        over = [dict(d) for d in self._done_over]
        # Lower bounds for what has not finished: time waited so far.
        waits: dict[str, list[float]] = {"sched": [], "ttft": [], "e2e": []}
        for seq in run.live:
            waited = 1000 * (now - seq.arrival)
            waits["e2e"].append(waited)
            for k, known in (("sched", seq.first_scheduled), ("ttft", seq.token_times[0] if seq.token_times else None)):
                waits[k].append(waited if known is None else 1000 * (known - seq.arrival))
            if seq.token_times:
                tbt = self._tbts_over(seq.token_times)
                gap = 1000 * (now - seq.token_times[-1])  # the next TBT is at least this
                for i, limits in enumerate(self.limits):
                    over[i]["tbt"] += tbt[i] + (limits["tbt"] is not None and gap > limits["tbt"])
        for req in run.pending:
            arrival = run.start + req.arrival_s if req.arrival_s is not None else now
            if arrival > now:
                break  # pending is in arrival order
            for k in waits:
                waits[k].append(1000 * (now - arrival))
        found: dict[Criteria, list[str]] = {}
        for i, c in enumerate(self.criteria):
            limits, needed = self.limits[i], self.needed[i]
            for k, values in waits.items():
                if limits[k] is not None:
                    over[i][k] += sum(v > limits[k] for v in values)
            keys = [k for k in self.KEYS if limits[k] is not None and self.n[k] and over[i][k] >= needed[k]]
            if not keys:
                return False
            found[c] = keys
        self.found = found
        return True


@dataclass
class SearchResult:
    capacity: float  # 0: not even the lowest rate tried passed
    probes: list[Probe] = field(default_factory=list)
    interrupted: bool = False  # stopped (Ctrl-C, a time budget) before its stopping rule: what its probes showed

    @classmethod
    def partial(cls, probes: list[Probe]) -> "SearchResult":
        """What an unfinished search's probes show: the highest rate that passed below the lowest that failed."""
        failed = min((p.rate for p in probes if not p.passed), default=math.inf)
        passed = [p.rate for p in probes if p.passed and p.rate < failed]
        return cls(max(passed, default=0.0), list(probes), interrupted=True)

    @property
    def at_capacity(self) -> Probe:
        """The probe at the capacity, or the lowest one tried if none passed."""
        passing = [p for p in self.probes if p.passed and p.rate == self.capacity]
        return passing[0] if passing else min(self.probes, key=lambda p: p.rate)

    @property
    def failed_above(self) -> Probe | None:
        """The lowest failing probe above the capacity: the bracket's top and what limited the capacity."""
        above = [p for p in self.probes if not p.passed and p.rate > self.capacity]
        return min(above, key=lambda p: p.rate) if above else None

    @property
    def hit_bound(self) -> bool:
        """Every rate tried passed: the capacity is at least this, the search did not find its top."""
        return self.capacity > 0 and self.failed_above is None

    @property
    def upper(self) -> float:
        """The lowest rate seen to fail (inf when none did): the capacity lies in [capacity, upper)."""
        top = self.failed_above
        return top.rate if top is not None else math.inf

    @property
    def limited_by(self) -> str:
        """What the first rate over capacity missed ('TBT', 'scheduling delay', ...); '' when none failed."""
        top = self.failed_above
        if top is None:
            return ""
        missed = ", ".join(LIMITS[k] for k in top.limited_by)
        memory = memory_note(top.row)  # what made it miss, where the KV memory was full or preempting
        return f"{missed} ({memory})" if memory and missed else memory or missed


def search(probe: Callable[[float], Probe], start_rate: float = DEFAULT_START_RATE,
           precision: float = DEFAULT_PRECISION, growth: float = 2.0) -> SearchResult:
    """Bracket, then bisect, the highest rate whose probe passes.

    The stopping rule: bracketing multiplies the rate by `growth` while probes pass (divides it while they
    fail), at most MAX_BRACKET_STEPS times; bisection stops once the bracket [lo, hi) is at most `precision`
    times lo. A start rate that passes and a first step that fails therefore take 2 + ceil(log2((growth - 1)
    / precision)) probes.
    """
    if not start_rate > 0:
        raise ValueError(f"the start rate must be positive, got {start_rate}")
    if not 0 < precision < 1:
        raise ValueError(f"the precision must be in (0, 1), got {precision}")
    if not growth > 1:
        raise ValueError(f"the bracketing growth must be above 1, got {growth}")
    probes: list[Probe] = []

    def run(rate: float) -> bool:
        p = probe(rate)
        probes.append(p)
        return p.passed

    lo, hi = None, None
    if run(start_rate):
        lo = start_rate
        for _ in range(MAX_BRACKET_STEPS):
            if not run(lo * growth):
                hi = lo * growth
                break
            lo *= growth
        else:
            return SearchResult(lo, probes)  # passes at every rate tried: report the highest (hit_bound)
    else:
        hi = start_rate
        for _ in range(MAX_BRACKET_STEPS):
            if run(hi / growth):
                lo = hi / growth
                break
            hi /= growth
        else:
            return SearchResult(0.0, probes)
    while hi - lo > precision * lo * (1 + 1e-9):  # a bracket lo..lo*(1+precision) is done, float rounding aside
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
    deployment: Disaggregation | None = None  # prefill apart from decode (deploy/); None: one engine
    pricing: StepPricing | None = None  # what a strategy that prices its steps (slo-budget) prices them by
    #: host-tier sizes, one search each (--kv-host-cache A,B; 0: none); [None]: the backend's own
    host_sizes: list[float | None] = field(default_factory=lambda: [None])

    def strategy_for(self, case: Case) -> Strategy:
        """The case's strategy, priced against the criteria where it prices its steps (bench/slo_pricing.py)."""
        c = self.criteria
        return priced(make_strategy(case.strategy, case.chunk_size), self.pricing, c.tbt_p99_ms, c.tpot_ms, c.percentile)

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
        return [Case(self.test, name, self.concurrency, size, kv_host_gib=host)
                for name, size in configurations(self.strategies, self.chunk_sizes) for host in self.host_sizes]

    @property
    def row_slo(self) -> SLO:
        c = self.criteria
        return self.slo or SLO(ttft_ms=c.ttft_ms, tpot_ms=c.tpot_ms, tbt_ms=c.tbt_p99_ms, e2e_ms=c.e2e_ms)

    @property
    def unit(self) -> str:
        """What the searched rate counts: requests a second, or for multi-turn sessions, sessions started a second."""
        return rate_unit(self.test)

    def tokens_per_probe(self) -> int:
        """Tokens one probe processes (see engine.run's on_tokens), for a progress bar."""
        return request_tokens(request_lengths(self.test, self.requests, self.seed))

    def settings(self) -> dict[str, Any]:
        """The search's settings, for the export's metadata."""
        return {
            "capacity_tbt_p99_ms": self.criteria.tbt_p99_ms,
            "capacity_slo": self.criteria.describe(),
            "capacity_max_sched_delay_ms": self.criteria.sched_delay_p50_ms,
            "capacity_max_queue_growth": self.criteria.max_queue_growth,
            "capacity_requests_per_probe": self.requests,
            "capacity_precision": self.precision,
            "capacity_start_rate": self.start_rate,
        }


def rate_unit(test: TestSpec) -> str:
    """What a probe's rate counts: requests a second; for multi-turn sessions, sessions started a second (each
    session's later turns follow its own answers, a closed loop within it)."""
    return "sessions/s" if test.sessions is not None else "req/s"


def requests_per_arrival(test: TestSpec) -> int:
    """Requests each arrival of the searched rate brings: a session's turns, else one."""
    return test.sessions.turns if test.sessions is not None else 1


@dataclass
class CapacityResult:
    case: Case
    search: SearchResult

    @property
    def capacity(self) -> float:
        """In the search's unit (rate_unit): requests a second, or sessions started a second."""
        return self.search.capacity

    @property
    def capacity_rps(self) -> float:
        """Requests a second offered at the capacity: a session's turns each count."""
        return self.capacity * requests_per_arrival(self.case.test)

    @property
    def row(self) -> ResultRow:
        """The row measured at the capacity, with capacity_rps set and no fixed rate (the rate is what was searched),
        so that `compare` joins the rows of two capacity runs whatever rates they found."""
        sessions = self.capacity if self.case.test.sessions is not None else math.nan
        return replace(self.search.at_capacity.row, capacity_rps=self.capacity_rps, rate=None,
                       capacity_probes=len(self.search.probes), capacity_sessions_per_s=sessions)


def probe_case(backend: Backend, case: Case, config: CapacityConfig, rate: float,
               on_tokens: Callable[[int], None] | None = None, seed: int | None = None,
               watch: list[Criteria] | None = None, price: Pricer | None = None) -> Probe:
    """One run of the case's requests at `rate`, checked against the criteria.

    The trace is the seed's (the config's unless given): its arrival times at rate r are those at rate 1 over r,
    so every probe of every case under one seed replays the same requests (common random numbers). The run
    stops once every criteria in `watch` (default: the config's) has certainly failed (CertainFailure); [] runs
    it to the end. `price`: each step's seconds on a calibrated sim, summed beside the measured ones."""
    seed = config.seed if seed is None else seed
    backend = case_backend(backend, case)
    strategy = config.strategy_for(case)
    spec = ArrivalSpec(config.arrival, rate, config.burstiness)
    requests = make_requests(case.test, config.requests, backend.vocab_size, seed,
                             spec.times(arriving(case.test, config.requests), seed, case.test))
    watch = [config.criteria] if watch is None else watch
    certain = CertainFailure(watch, requests) if watch else None
    if config.deployment is None:
        run = engine.run(backend, strategy, requests, case.concurrency, on_tokens=on_tokens, stop=certain)
    else:  # a deployment runs to its end: `stop` watches one engine's progress
        run, certain = run_requests(backend, case.strategy, case.chunk_size, requests, case.concurrency,
                                    config.deployment, on_tokens), None
    row = summarize(case.test, [run], model=backend.model_name, backend=backend.label,
                    strategy=row_strategy(backend, case.strategy),
                    concurrency=case.concurrency, chunk_size=case.chunk_size,
                    load=Load(config.arrival, rate, config.burstiness if config.arrival == "gamma" else None),
                    slo=config.row_slo,
                    prefix_implied=implied_hit_rate(backend, [r.prompt for r in requests]),
                    deployment=config.deployment.label if config.deployment else "",
                    kv_host_gib=host_gib(backend, case))
    values = config.criteria.values(run)
    priced = {}
    if price is not None:
        priced = {"by_kind": priced_by_kind(run.steps, price)}
    if run.stopped:
        found = certain.found
        return Probe(rate, False, row, found.get(config.criteria, []), seed, values, True, found, **priced)
    over = config.criteria.exceeded(values)
    return Probe(rate, not over, row, over, seed, values, **priced)


def find_capacity(backend: Backend, case: Case, config: CapacityConfig,
                  on_probe_start: Callable[[Case, int, float], None] | None = None,
                  on_probe_done: Callable[[Case, Probe], None] | None = None,
                  on_tokens: Callable[[int], None] | None = None) -> CapacityResult:
    if config.warmup and config.deployment is None:
        warm_up(case_backend(backend, case), config.strategy_for(case), case,
                BenchConfig([case.test], [case.strategy], [case.concurrency], seed=config.seed))

    n_probes = 0

    def probe(rate: float) -> Probe:
        nonlocal n_probes
        n_probes += 1
        if on_probe_start is not None:
            on_probe_start(case, n_probes, rate)
        p = probe_case(backend, case, config, rate, on_tokens)
        if on_probe_done is not None:
            on_probe_done(case, p)
        return p

    return CapacityResult(case, search(probe, config.start_rate, config.precision))


def relative_capacities(results: list[CapacityResult], baseline: str) -> list[float]:
    """Each capacity over the baseline strategy's (NaN where it has none, or it is 0)."""
    refs = [r.capacity for r in results if r.case.strategy == baseline]
    ref = refs[0] if len(refs) == 1 else math.nan
    return [r.capacity / ref if ref and not math.isnan(ref) else math.nan for r in results]

"""Tune: the scheduler and token budget that hold the most load under an SLO.

A configuration is a strategy and a token budget (strategies that ignore the budget appear once). Its
capacity is found by `capacity.search` once per seed: the first seed brackets from the start rate (or a
hint, such as the sim's prediction) and bisects; each further seed searches near the first one's
capacity with fresh requests and arrivals. Seed k is the same for every configuration, so all of them
are probed on identical traces (common random numbers), and the spread across seeds is the capacity's
interval: [lowest seed's capacity, highest seed's lowest failing rate). Two configurations whose
intervals overlap are a tie.

Configurations are independent: on the sim a pool of processes searches them side by side. On a real
backend the sim goes first: bench.sim_first measures its top K.
"""
from __future__ import annotations

import concurrent.futures as cf
import gc
import math
import queue as queue_mod
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from strategies import configurations

from prefillbench import engine
from prefillbench.backends.base import Backend, BackendError
from prefillbench.bench import workers
from prefillbench.bench.capacity import DEFAULT_START_RATE, CapacityConfig, Criteria, Probe, SearchResult, probe_case, search
from prefillbench.bench.cases import BenchConfig, Case, case_backend, warm_up
from prefillbench.bench.metrics import host_label, strategy_label
from prefillbench.bench.pricing import Pricer
from prefillbench.bench.slo_pricing import StepPricing, prices_steps
from prefillbench.bench.turns import BackendCall, run_here, take_turns
from prefillbench.bench.workloads import TestSpec, make_requests, request_lengths

#: Seeds of the repeats: far apart, so that no two traces share a stream.
SEED_STRIDE = 1000
#: Bracketing near a known capacity (a neighbouring budget's, the sim's prediction) grows the rate by this many
#: precisions a step: one or two steps bracket it, two bisections finish.
NEAR_GROWTH_PRECISIONS = 4
#: A further seed brackets from the first seed's capacity one precision a step: seeds differ by a few percent,
#: so a pass there and a fail one step up (or the reverse) is the whole search, two probes instead of four.
REPEAT_GROWTH_PRECISIONS = 1
#: Probes a search takes, for the progress bar's first estimate (then the mean of those finished).
EXPECTED_FIRST_PROBES, EXPECTED_NEAR_PROBES = 8, 3


class OutOfTime(Exception):
    """The time budget would end during the next probe."""


@dataclass(frozen=True, order=True)
class Config:
    strategy: str
    budget: int | None
    #: GiB of host memory below the GPU's KV blocks, one size of a grid (0: none); None: the backend's own
    kv_host_gib: float | None = None

    @property
    def label(self) -> str:
        return strategy_label(self.strategy, self.budget) + host_label(self.kv_host_gib)


def grid(strategies: list[str], budgets: list[int], host_sizes: list[float | None] | None = None) -> list[Config]:
    """Every strategy at every budget and host-tier size; a strategy that ignores the budget once a size."""
    return [Config(name, budget, host) for name, budget in configurations(strategies, budgets)
            for host in host_sizes or [None]]


@dataclass(frozen=True)
class TuneSettings:
    """How every configuration is probed: the same requests, seeds and criteria for all of them."""

    test: TestSpec
    criteria: list[Criteria]  # one search per entry: several for capacity against the SLO
    requests: int
    concurrency: int = 0
    arrival: str = "poisson"
    burstiness: float = 1.0
    seed: int = 42
    repeats: int = 1  # seeds per configuration
    start_rate: float | None = None  # None: each strategy's first search starts at its saturated throughput
    precision: float = 0.05
    warmup: bool = True
    #: What every capacity is compared with and always measured: sequential; on a serving engine, its own default
    #: configuration (it cannot run sequential), named `baseline_name`.
    baseline: Config | None = None
    baseline_name: str = ""
    #: What a strategy that prices its steps (slo-budget) prices them by: the run's cost model (bench/slo_pricing.py)
    pricing: StepPricing | None = None

    def __post_init__(self) -> None:
        if self.baseline is None:
            object.__setattr__(self, "baseline", Config("sequential", None))
        object.__setattr__(self, "baseline_name", self.baseline_name or self.baseline.label)
        if self.repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {self.repeats}")
        if not self.criteria:
            raise ValueError("tune needs an SLO")

    @property
    def seeds(self) -> list[int]:
        return [self.seed + SEED_STRIDE * k for k in range(self.repeats)]

    def capacity_config(self, criteria: Criteria, strategy: str = "sequential") -> CapacityConfig:
        config = CapacityConfig(self.test, [strategy], [], criteria, requests=self.requests, concurrency=self.concurrency,
                                arrival=self.arrival, burstiness=self.burstiness, seed=self.seed,
                                start_rate=self.start_rate or DEFAULT_START_RATE, precision=self.precision,
                                warmup=self.warmup, pricing=self.pricing)
        config.validate()
        return config

    @property
    def tokens_per_request(self) -> float:
        """Mean prompt + generated tokens of the first seed's requests: capacity in req/s times this is tokens/s."""
        lengths = request_lengths(self.test, self.requests, self.seed)
        return sum(p + g for p, g in lengths) / len(lengths)

    @property
    def expected_probes(self) -> int:
        return EXPECTED_FIRST_PROBES + EXPECTED_NEAR_PROBES * (self.repeats - 1)


@dataclass
class ConfigResult:
    """One configuration under one criteria: a search per seed."""

    config: Config
    criteria: Criteria
    searches: list[SearchResult] = field(default_factory=list)
    stage: str = "sim"  # sim | measured | short (successive halving's short round, for a configuration it dropped)
    planned_seeds: int = 1

    @property
    def probes(self) -> list[Probe]:
        return [p for s in self.searches for p in s.probes]

    @property
    def interrupted(self) -> bool:
        return len(self.searches) < self.planned_seeds or any(s.interrupted for s in self.searches)

    @property
    def median_search(self) -> SearchResult:
        """The seed whose capacity is the (lower) median: its probe at capacity is the reported row."""
        ordered = sorted(self.searches, key=lambda s: s.capacity)
        return ordered[(len(ordered) - 1) // 2]

    @property
    def capacity(self) -> float:
        return self.median_search.capacity if self.searches else 0.0

    @property
    def low(self) -> float:
        return min((s.capacity for s in self.searches), default=0.0)

    @property
    def high(self) -> float:
        return max((s.upper for s in self.searches), default=math.inf)

    @property
    def at_capacity(self) -> Probe | None:
        return self.median_search.at_capacity if self.probes else None

    @property
    def hit_bound(self) -> bool:
        return any(s.hit_bound for s in self.searches)

    @property
    def limited_by(self) -> str:
        return self.median_search.limited_by if self.searches else ""

    @property
    def step_speed(self) -> float:
        """Its probes' step time over the calibrated sim's price for the same steps (NaN when not priced): 1.25
        means the machine ran these steps 25% slower than the calibration said it would."""
        priced = sum(p.priced_s for p in self.probes)
        return sum(p.busy_s for p in self.probes) / priced if priced > 0 else math.nan

    def kind_speeds(self) -> dict[str, float]:
        """step_speed by step kind (pricing.STEP_KINDS), over all its probes; kinds never priced left out."""
        sums: dict[str, list[float]] = {}
        for p in self.probes:
            for kind, (took, priced) in p.by_kind.items():
                s = sums.setdefault(kind, [0.0, 0.0])
                s[0] += took
                s[1] += priced
        return {k: took / priced for k, (took, priced) in sums.items() if priced > 0}

    def ties(self, other: "ConfigResult") -> bool:
        """Whether the two capacity intervals overlap."""
        return self.low < other.high and other.low < self.high


ProbeCallback = Callable[[Config, int, Probe], None]  # configuration, criteria index, probe


def tune_config(backend: Backend, config: Config, settings: TuneSettings, on_probe: ProbeCallback | None = None,
                hint: float | None = None, deadline: float | None = None, stage: str = "sim",
                seeds: list[int] | None = None, firsts: list[float] | None = None,
                price: Pricer | None = None, call: BackendCall | None = None) -> list[ConfigResult]:
    """The configuration's capacity under each criteria. A run's figures serve every criteria (and a rate probed
    again under another criteria is not run again); so a list of SLOs costs little more than one.

    `seeds`: which of the settings' seeds to search (their indices; default all), so that a pool can search a
    configuration's further seeds apart; `firsts`: then, each criteria's first-seed capacity, where they start.
    `price`: every probe's steps are priced by it too (the calibrated sim, in the measured stage). `call` runs
    each piece of backend work (warm-up, probe) when searches take turns (bench.turns); default: here, now.
    A Ctrl-C, the deadline or a failing backend raises Stopped with what was finished, the search under way included."""
    on_backend = call or run_here
    case = Case(settings.test, config.strategy, settings.concurrency, config.budget, kv_host_gib=config.kv_host_gib)
    base = settings.capacity_config(settings.criteria[0], config.strategy)
    cache: dict[tuple[float, int], Probe] = {}
    near = 1 + NEAR_GROWTH_PRECISIONS * settings.precision
    step = 1 + REPEAT_GROWTH_PRECISIONS * settings.precision
    results = [ConfigResult(config, c, stage=stage, planned_seeds=settings.repeats) for c in settings.criteria]
    # A strategy that prices its steps aims at each criteria's own SLO: its runs serve that criteria alone.
    own_runs = prices_steps(config.strategy)
    current: list[Probe] = []
    last_e2e_s = 0.0
    index = 0

    def probe(index: int, seed: int, rate: float) -> Probe:
        nonlocal last_e2e_s
        criteria = settings.criteria[index]
        key = (rate, seed, index if own_runs else None)
        raw = cache.get(key)
        if raw is None:
            if deadline is not None and time.monotonic() + (settings.requests - 1) / rate + last_e2e_s > deadline:
                raise OutOfTime(f"{config.label} at {rate:.3g} req/s would end past the time budget")
            probed = settings.capacity_config(criteria, config.strategy) if own_runs else base
            raw = cache[key] = on_backend(lambda: probe_case(backend, case, probed, rate, seed=seed,
                                                             watch=[criteria] if own_runs else settings.criteria,
                                                             price=price))
            last_e2e_s = raw.row.e2e_p50_ms / 1e3 if not math.isnan(raw.row.e2e_p50_ms) else last_e2e_s
        over = raw.certain[criteria] if raw.stopped_early else criteria.exceeded(raw.values)
        p = replace(raw, passed=not over, limited_by=over)
        current.append(p)
        if on_probe is not None:
            on_probe(config, index, p)
        return p

    try:
        if settings.warmup and backend.name != "sim":
            on_backend(lambda: warm_up(case_backend(backend, case), base.strategy_for(case), case,
                                       BenchConfig([case.test], [config.strategy], [case.concurrency], seed=settings.seed)))
        for index, result in enumerate(results):
            for k in range(settings.repeats) if seeds is None else seeds:
                seed = settings.seeds[k]
                current.clear()
                first = result.searches[0].capacity if result.searches else firsts[index] if firsts else 0.0
                if k == 0 and hint:
                    start, growth = hint, near
                elif k > 0 and first:
                    start, growth = first, step
                elif settings.start_rate:
                    start, growth = settings.start_rate, 2.0
                else:
                    start, growth = on_backend(lambda: saturated_rate(backend, case, settings, seed, result.criteria)), 2.0
                result.searches.append(search(lambda r: probe(index, seed, r), start, settings.precision, growth))
    except (KeyboardInterrupt, OutOfTime, BackendError) as e:
        for result in results:
            if result.criteria is settings.criteria[index] and current:
                result.searches.append(SearchResult.partial(current))
        raise Stopped([r for r in results if r.searches], e) from None
    return results


def saturated_rate(backend: Backend, case: Case, settings: TuneSettings, seed: int,
                   criteria: Criteria | None = None) -> float:
    """Requests per second the configuration completes with every request in flight from the start (a closed
    loop, the KV cache the only cap): no arrival rate above it can keep the queue from growing, so a search
    that starts there brackets downwards, and a probe above capacity stops as soon as it has certainly failed.
    A start far below capacity would cost the most: a lightly loaded run takes the most steps (small batches)."""
    requests = make_requests(settings.test, settings.requests, backend.vocab_size, seed)
    strategy = settings.capacity_config(criteria or settings.criteria[0], case.strategy).strategy_for(case)
    run = engine.run(case_backend(backend, case), strategy, requests, case.concurrency or len(requests))
    return len(requests) / run.wall if run.wall > 0 else DEFAULT_START_RATE


class Stopped(Exception):
    """A Ctrl-C, the time budget or a failing backend, with the results finished so far."""

    def __init__(self, results: list[ConfigResult], cause: BaseException) -> None:
        super().__init__(str(cause) or type(cause).__name__)
        self.results, self.cause = results, cause

    @property
    def interrupted(self) -> bool:
        return isinstance(self.cause, KeyboardInterrupt)

    @property
    def why(self) -> str:
        """GridResult.stopped's words for it."""
        if self.interrupted:
            return "interrupted"
        if isinstance(self.cause, BackendError):
            return f"the backend failed: {self.cause}"
        return f"time budget: {self}"


@dataclass
class GridResult:
    results: list[ConfigResult] = field(default_factory=list)
    stopped: str = ""  # why the grid stopped early ('' when it finished)
    left: list[Config] = field(default_factory=list)  # configurations not started, or not finished
    failure: BackendError | None = None  # the backend's error, where that is what stopped it


def chains(configs: list[Config]) -> list[list[Config]]:
    """The configurations by strategy, budgets in the order given: each search starts near its neighbour's capacity."""
    out: dict[str, list[Config]] = {}
    for c in configs:
        out.setdefault(c.strategy, []).append(c)
    return list(out.values())


def _run_chain(backend: Backend, chain: list[Config], settings: TuneSettings, on_probe: ProbeCallback | None,
               on_config: Callable[[Config, list[ConfigResult]], None] | None, hints: dict[Config, float],
               deadline: float | None, stage: str, seeds: list[int] | None = None,
               price: Pricer | None = None, call: BackendCall | None = None) -> list[ConfigResult]:
    """One strategy's budgets in turn; without a hint of its own a budget's search starts at the previous budget's
    first-seed capacity, bracketing near it (adjacent budgets' capacities differ by tens of percent: two or three
    probes instead of the climb from the start rate). The first seed's, not the median: a pool that searches the
    further seeds apart (`seeds`) hands on the same hint, so both find the same capacities."""
    results: list[ConfigResult] = []
    previous = 0.0
    for config in chain:
        try:
            found = tune_config(backend, config, settings, on_probe, hints.get(config) or previous or None, deadline,
                                stage, seeds, price=price, call=call)
        except Stopped as e:
            raise Stopped(results + e.results, e.cause) from None
        results += found
        previous = found[0].searches[0].capacity if found[0].searches else 0.0
        if on_config is not None:
            on_config(config, found)
    return results


#: Told each configuration's results (one per criteria) as soon as it is finished.
ConfigCallback = Callable[[Config, list["ConfigResult"]], None]


def run_grid(backend: Backend, configs: list[Config], settings: TuneSettings, on_probe: ProbeCallback | None = None,
             on_config: ConfigCallback | None = None, hints: dict[Config, float] | None = None,
             deadline: float | None = None, stage: str = "sim", jobs: int = 1, price: Pricer | None = None) -> GridResult:
    """Every configuration's capacity; a Ctrl-C or the deadline keeps what finished, probes included. `price`
    prices every probe's steps too (one process: the measured stage, never the sim's pool). In one process the
    strategies' chains take turns, a probe each (bench.turns): on a real backend the machine's drift falls on
    all alike; on the sim, whose clock is virtual, the order changes nothing."""
    groups = chains(configs)
    if jobs > 1 and len(groups) > 1 and backend.name == "sim" and price is None:
        return _run_pool(backend, groups, settings, on_probe, on_config, hints or {}, stage, jobs)
    out = GridResult()
    outcomes = take_turns([
        lambda call, chain=chain: _run_chain(backend, chain, settings, on_probe, on_config, hints or {}, deadline, stage,
                                             price=price, call=call)
        for chain in groups])
    for chain, outcome in zip(groups, outcomes):
        if isinstance(outcome, Stopped):
            out.results += outcome.results
            out.stopped = out.stopped or outcome.why
            if isinstance(outcome.cause, BackendError):
                out.failure = out.failure or outcome.cause
            finished = {r.config for r in outcome.results if not r.interrupted}
            out.left += [c for c in chain if c not in finished]
        elif isinstance(outcome, KeyboardInterrupt):  # never started
            out.stopped = out.stopped or "interrupted"
            out.left += chain
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            out.results += outcome
    return out


# ---- a pool of processes, for the sim ---------------------------------------------------------------------
_worker_backend: Backend | None = None
_worker_queue = None


def _worker_init(backend: Backend, messages) -> None:
    global _worker_backend, _worker_queue
    gc.freeze()  # the parent's heap, inherited: out of the collector's full passes (see commands.session.open_backend)
    # A probe makes millions of small objects and keeps a record per step: at the default first threshold (700) the
    # collector ran every few steps, 7-13% of a probe's time, 4-6% at 20,000 (gc.callbacks, one 1000-request probe).
    gc.set_threshold(20_000, 20, 20)
    _worker_backend, _worker_queue = backend, messages
    # The parent says each clamp once for the whole pool.
    backend.say_clamp = lambda asked, allowed, limit="": messages.put(("clamp", limit, asked, allowed))


def _worker_first_seeds(chain: list[Config], settings: TuneSettings, hints: dict[Config, float], stage: str) -> None:
    """A chain's first seeds; each configuration's results go to the parent as it finishes."""
    _run_chain(_worker_backend, chain, settings, lambda c, index, p: _worker_queue.put(("probe", c, index, p)),
               lambda c, found: _worker_queue.put(("found", c, 0, found)), hints, None, stage, seeds=[0])


def _worker_repeat(config: Config, k: int, firsts: list[float], settings: TuneSettings, stage: str) -> list[ConfigResult]:
    """One further seed of one configuration, starting at the first seed's capacities."""
    return tune_config(_worker_backend, config, settings, lambda c, index, p: _worker_queue.put(("probe", c, index, p)),
                       None, None, stage, seeds=[k], firsts=firsts)


def _run_pool(backend: Backend, groups: list[list[Config]], settings: TuneSettings, on_probe: ProbeCallback | None,
              on_config: ConfigCallback | None, hints: dict[Config, float], stage: str, jobs: int) -> GridResult:
    """The grid on a pool of processes. A chain's first seeds run in turn (each budget starts near its neighbour's
    capacity); every further seed of a configuration is a task of its own, submitted as soon as the first seed's
    capacities are known. So the pool's last tasks are short ones: whole chains left one worker running a chain
    alone for the last fifth of the grid (benchmarks.sim.steps --grid). The results are those of the serial path."""
    import multiprocessing as mp

    messages = mp.get_context("fork").Queue()
    seen: dict[tuple[Config, int], list[Probe]] = {}
    found: dict[tuple[Config, int], dict[int, SearchResult]] = {}  # (configuration, criteria index): seed k's search
    seeds_left: dict[Config, int] = {}
    out = GridResult()
    n_configs = sum(map(len, groups))
    tasks = len(groups) + n_configs * (settings.repeats - 1)
    futures: dict[cf.Future, tuple[Config | None, int]] = {}

    def results_of(c: Config) -> list[ConfigResult]:
        """c's results from the searches finished (and the probes seen of one under way), in seed order."""
        out = []
        for index, criteria in enumerate(settings.criteria):
            searches = []
            for k, seed in enumerate(settings.seeds):
                if k in found.get((c, index), {}):
                    searches.append(found[(c, index)][k])
                elif mine := [p for p in seen.get((c, index), []) if p.seed == seed]:
                    searches.append(SearchResult.partial(mine))  # interrupted during this seed's search
            if searches:
                out.append(ConfigResult(c, criteria, searches, stage, settings.repeats))
        return out

    def keep(c: Config, k: int, results: list[ConfigResult]) -> None:
        for index, r in enumerate(results):
            found.setdefault((c, index), {})[k] = r.searches[0]
        seeds_left[c] -= 1
        if not seeds_left[c] and on_config is not None:
            on_config(c, results_of(c))

    def drain() -> None:
        while True:
            try:
                kind, c, index, p = messages.get_nowait()
            except queue_mod.Empty:
                return
            if kind == "clamp":
                backend.note_clamp(index, p, c)
            elif kind == "found":
                seeds_left[c] = settings.repeats
                firsts = [r.searches[0].capacity for r in p]
                for k in range(1, settings.repeats) if not out.stopped else ():
                    futures[pool.submit(_worker_repeat, c, k, firsts, settings, stage)] = (c, k)
                keep(c, 0, p)
            else:
                seen.setdefault((c, index), []).append(p)
                if on_probe is not None:
                    on_probe(c, index, p)

    try:
        with workers.forked_pool(min(jobs, tasks), _worker_init, (backend, messages)) as pool:
            # The longest chains first: their first seeds are the grid's longest run of work that cannot be split.
            for chain in sorted(groups, key=len, reverse=True):
                futures[pool.submit(_worker_first_seeds, chain, settings, hints, stage)] = (None, 0)
            # A chain's future can be done before the parent has read its last configuration's results: wait for
            # both.
            while futures or len(seeds_left) < n_configs:
                ready: set[cf.Future] = set()
                if futures:
                    ready = cf.wait(list(futures), timeout=0.2, return_when=cf.FIRST_COMPLETED).done
                else:
                    time.sleep(0.01)
                drain()  # before the results: a repeat's probes were sent before its future was done
                for f in ready:
                    c, k = futures.pop(f)
                    results = f.result()
                    if c is not None:
                        keep(c, k, results)
        drain()
    except KeyboardInterrupt:
        # The pool has ended its workers: keep what they reported (finished probes of unfinished configurations).
        out.stopped = "interrupted"
        drain()
    for chain in groups:
        for c in chain:
            if out.stopped and seeds_left.get(c, 1):
                out.left.append(c)
            out.results += results_of(c)
    return out


# ---- ranking --------------------------------------------------------------------------------------------------
def ranked(results: list[ConfigResult]) -> list[ConfigResult]:
    """Highest capacity first; at equal capacity the smaller budget (less work per step), then the name."""
    return sorted(results, key=lambda r: (-r.capacity, r.config.budget or 0, r.config.kv_host_gib or 0, r.config.strategy))


def by_criteria(results: list[ConfigResult], criteria: Criteria) -> list[ConfigResult]:
    return [r for r in results if r.criteria == criteria]

"""`prefillbench run`'s options."""
from __future__ import annotations

from dataclasses import dataclass, field

from prefillbench.bench import stats
from prefillbench.bench.cases import BenchConfig
from prefillbench.bench.metrics import SLO
from prefillbench.bench.workloads import ARRIVALS
from prefillbench.bench.workloads import TraceReading
from prefillbench.commands.options import priced
from prefillbench.commands.options.common import (BackendOptions, Measuring, check_export, check_relative_to,
                                                 check_seed, note, strategy_names, test_specs, unique)
from prefillbench.errors import UsageError


@dataclass
class RunOptions(Measuring):
    """`prefillbench run`, validated: `config` is the benchmark the flags describe."""

    load: BackendOptions
    n_prompt: list[int] | None = None
    n_gen: list[int] | None = None
    pg: list[tuple[int, int]] | None = None
    concurrency: list[int] | None = None
    strategy: list[str] | None = None
    chunk_size: list[int] | None = None
    budget: list[str] | None = None  # --budget: the budget part of each scheduler (compose.py)
    cadence: list[str] | None = None  # --cadence: its cadence part
    spec: list[str] | None = None  # --spec: speculative decoding, its spec part (one scheduler per value)
    repetitions: int | None = None
    requests: int | None = None
    seed: int = 42
    no_warmup: bool = False
    len_spread: float = 0.0
    workload: str | None = None
    reading: TraceReading = field(default_factory=TraceReading)
    arrival: str | None = None
    rate: list[float] | None = None
    burstiness: float = 1.0
    slo: SLO | None = None
    interleave: bool = False
    output: str = "md"
    export: str | None = None
    export_requests: str | None = None
    relative_to: str | None = None
    noisy_cv: float = 100 * stats.DEFAULT_NOISY_CV  # percent
    results_dir: str = "results"
    no_results_file: bool = False
    verify: bool = False
    no_progress: bool = False
    no_verdict: bool = False
    strict: bool = False  # exit 1 where a row's client sent late (bench/client_columns.py)
    config: BenchConfig = field(init=False, repr=False)
    pricing_calibration: str | None = field(default=None, init=False, repr=False)  # what prices slo-budget (priced.py)

    def validate(self) -> None:
        check_seed(self.seed)
        if self.repetitions is not None and self.repetitions < 1:
            raise UsageError(f"-r {self.repetitions}: at least 1 repetition")
        self.config = self.bench_config()
        if self.load.url and self.relative_to:
            raise UsageError("--url measures one configuration, the server's own: --relative-to has nothing to compare")
        check_relative_to(self.relative_to, self.config.strategies, "run")
        check_export(self.export)
        if self.export_requests and not self.export_requests.endswith((".jsonl", ".ndjson")):
            raise UsageError(f"--export-requests writes JSON lines: use a .jsonl name, not {self.export_requests}")
        if self.requests is not None and not self.config.open_loop and self.requests < max(self.config.concurrency):
            raise UsageError(f"--requests {self.requests} is below -c {max(self.config.concurrency)}: a closed loop "
                             f"never has more requests in flight than it has requests; raise --requests or lower -c")
        self.load.check_concurrency(max(self.config.concurrency))
        self.load.validate()
        if self.load.skip_idle and not self.config.open_loop:
            note("warning: --skip-idle does nothing in a closed loop (no step there waits for an arrival)")

    def bench_config(self) -> BenchConfig:
        strategies = strategy_names(self.strategy, self.load, self.budget, self.cadence, self.spec)
        slo = self.slo
        strategies = priced.checked(strategies, bool(self.strategy), self.load, slo.tbt_ms if slo else None,
                                    slo.tpot_ms if slo else None, self.load.name == "sim" or bool(self.load.calibration),
                                    "--disaggregate" if self.load.disaggregate else "")
        self.load, self.pricing_calibration = priced.pricing_file(strategies, self.load)
        tests = test_specs(self.n_prompt, self.n_gen, self.pg, self.arrival, self.len_spread, self.workload, self.reading)
        self.settle_prefix_cache(tests)
        if any(t.sessions is not None for t in tests):
            if self.arrival not in ("poisson", "gamma"):
                raise UsageError("multi-turn sessions arrive in an open loop: give --arrival poisson (or gamma) and "
                                 "--rate, the sessions a second")
        arrival = self.arrival or ("trace" if tests and tests[0].workload and tests[0].workload.arrivals else "closed")
        if arrival not in ARRIVALS + ("trace",):
            raise UsageError(f"--arrival {arrival}: choose from {', '.join(ARRIVALS)}")
        open_loop = arrival != "closed"
        config = BenchConfig(
            tests=tests,
            strategies=strategies,
            concurrency=unique(self.concurrency, "-c") or ([0] if open_loop else [1, 2, 4]),
            chunk_sizes=unique(self.chunk_size, "--chunk-size") or [256],
            repetitions=self.repetitions or (1 if open_loop else 3),
            requests=self.requests,
            seed=self.seed,
            warmup=not self.no_warmup,
            arrival=arrival,
            rates=unique(self.rate, "--rate") or [],
            burstiness=self.burstiness,
            slo=self.slo,
            deployment=self.load.deployment(),
            host_sizes=self.load.host_sizes(),
        )
        if config.deployment is not None and not open_loop:
            raise UsageError("--disaggregate runs an open loop: give --arrival poisson (or gamma) and --rate, or a "
                             "workload with arrival times")
        if config.deployment is not None and any(t.sessions is not None for t in tests):
            raise UsageError("--disaggregate runs no multi-turn sessions (a turn's next waits on its decode)")
        if self.load.url and self.chunk_size:
            raise UsageError("--url measures a server already running, whose budget is its own: drop --chunk-size")
        try:
            config.validate()
        except ValueError as e:
            raise UsageError(str(e)) from None
        if self.load.url:
            config.chunk_sizes = [None]  # the server's own budget, unknown here: one case per test and load
        return config

"""`prefillbench capacity`'s options."""
from __future__ import annotations

from dataclasses import dataclass, field

from prefillbench.bench import capacity
from prefillbench.bench.metrics import SLO
from prefillbench.bench.workloads import TraceReading
from prefillbench.commands.options import priced
from prefillbench.commands.options.common import (BackendOptions, Measuring, check_export, check_precision,
                                                 check_queue_growth, check_relative_to, check_seed, strategy_names,
                                                 unique, workload_requests)
from prefillbench.errors import UsageError


@dataclass
class CapacityOptions(Measuring):
    """`prefillbench capacity`, validated; `config` needs the backend's name only, so it is known before loading."""

    load: BackendOptions
    pg: list[tuple[int, int]] | None = None
    len_spread: float = 0.0
    workload: str | None = None
    reading: TraceReading = field(default_factory=TraceReading)
    strategy: list[str] | None = None
    chunk_size: list[int] | None = None
    budget: list[str] | None = None  # --budget: the budget part of each scheduler (compose.py)
    cadence: list[str] | None = None  # --cadence: its cadence part
    spec: list[str] | None = None  # --spec: speculative decoding, its spec part (one scheduler per value)
    concurrency: int = 0
    seed: int = 42
    no_warmup: bool = False
    slo: SLO | None = None
    max_sched_delay: float = capacity.DEFAULT_MAX_SCHED_DELAY_MS
    max_queue_growth: float = 100 * capacity.DEFAULT_MAX_QUEUE_GROWTH  # percent
    requests: int | None = None
    precision: float = 100 * capacity.DEFAULT_PRECISION  # percent
    start_rate: float = capacity.DEFAULT_START_RATE
    arrival: str = "poisson"
    burstiness: float = 1.0
    relative_to: str | None = None
    output: str = "md"
    export: str | None = None
    no_progress: bool = False
    config: capacity.CapacityConfig = field(init=False, repr=False)
    pricing_calibration: str | None = field(default=None, init=False, repr=False)  # what prices slo-budget (priced.py)

    def validate(self) -> None:
        check_seed(self.seed)
        if self.slo is None or self.slo.tbt_ms is None:
            raise UsageError("capacity needs --slo tbt=MS: the highest rate whose P99 time between tokens stays within it")
        test = self.searched_test(self.pg, self.arrival, "capacity", sessions=True)
        strategies = strategy_names(self.strategy, self.load, self.budget, self.cadence, self.spec)
        strategies = priced.checked(strategies, bool(self.strategy), self.load, self.slo.tbt_ms, self.slo.tpot_ms,
                                    self.load.name == "sim" or bool(self.load.calibration),
                                    "--disaggregate" if self.load.disaggregate else "")
        self.load, self.pricing_calibration = priced.pricing_file(strategies, self.load)
        if self.load.url:
            if self.chunk_size:
                raise UsageError("--url measures a server already running, whose budget is its own: drop --chunk-size "
                                 "(the rate is searched)")
            strategies = strategies[:1]  # the server as it runs: one search
        check_relative_to(self.relative_to, strategies, "searched")
        check_precision(self.precision)
        check_queue_growth(self.max_queue_growth)
        check_export(self.export)
        sim = self.load.name == "sim"
        self.config = capacity.CapacityConfig(
            test, strategies, unique(self.chunk_size, "--chunk-size") or [256],
            # every limit the SLO names binds the search (a TTFT limit given beside the TBT one was read for the
            # rows' goodput alone, and the search passed rates whose TTFT p99 broke it)
            capacity.Criteria.from_slo(self.slo, self.max_sched_delay, max_queue_growth=self.max_queue_growth / 100),
            requests=workload_requests(test, self.requests) or self.requests or (
                capacity.DEFAULT_REQUESTS_SIM if sim else capacity.DEFAULT_REQUESTS),
            concurrency=self.concurrency, arrival=self.arrival, burstiness=self.burstiness, seed=self.seed,
            start_rate=self.start_rate, precision=self.precision / 100, warmup=not self.no_warmup, slo=self.slo,
            deployment=self.load.deployment(), host_sizes=self.load.host_sizes(),
        )
        try:
            self.config.validate()
        except ValueError as e:
            raise UsageError(str(e)) from None
        if self.load.url:
            self.config.chunk_sizes = [None]  # the server's own budget, unknown here: the rows name none
        self.load.check_concurrency(self.concurrency)
        self.load.validate()

"""`prefillbench tune`'s options, and the --quick preset."""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from prefillbench.bench import capacity, slo_pricing, tune
from prefillbench.bench.workloads import TraceReading
from prefillbench.commands.options import priced
from prefillbench.commands.options.common import (BackendOptions, Measuring, check_precision, check_queue_growth,
                                                 check_seed, strategy_names, trace_reading, unique, workload_requests)
from prefillbench.commands.parsers import parse_slo_list
from prefillbench.errors import UsageError
from prefillbench.writers import RECORD_FORMATS, format_for_path


#: Sarathi-Serve's budgets around its 512 (and vLLM's 2048 default): 128 to 4096.
DEFAULT_BUDGETS = [128, 256, 512, 1024, 2048, 4096]
DEFAULT_TOP_K = 3
#: --quick on a real backend: short requests and few of them, one seed, a coarse precision, idle time skipped;
#: about 10 minutes for the shipped model on a 2-core CPU. P99 TBT 500 ms leaves the smallest budget's step (a
#: 32-token chunk beside its decodes: 200-300 ms there) a margin: at 300 ms every chunked configuration sat at the
#: edge of the SLO, where a 10% slower minute moved its capacity by 20-50%. The next budget's step nears 500 ms:
#: the picks, ranked by what they keep with slower steps, pass over it (docs/history/2026-12-02). slo-budget is
#: listed beside the budgets (where the backend can run it): it and the sim's best fixed budget are measured as well,
#: one or two searches more than those 10 minutes (not yet timed on a quiet machine).
QUICK = dict(pg=(256, 32), slo="tbt=500", requests=20, precision=10.0, budgets=[32, 64, 128, 256], top_k=2,
             strategies=["sequential", "chunked", "sarathi-serve", "packed", "slo-budget"], skip_idle=True)
#: vLLM's scheduler with its head-of-line settings, searched beside the budgets where -s names no strategy (and no
#: server runs them): a per-request cap on prompt tokens a step (long_prefill_token_threshold), and V0's limits on
#: prompts in progress, one of them long (docs/memory.md, Short requests behind long prompts).
VLLM_VARIANTS = ["vllm-v1:threshold=512", "vllm-v1:threshold=2048:partial=4:long-partial=1"]
#: The flags that, on a real backend, describe the sim that carries tune's search rather than the backend.
SIM_OF_TUNE = ("sim_model", "sim_gpu", "calibration")
TUNE_OUTPUTS = ("md", "csv", "json")
#: Where a server's sim is calibrated (--calibrate-on): the server's own probes, or the gguf backend (llama-server).
CALIBRATE_ON = ("server", "gguf")


@dataclass
class TuneOptions(Measuring):
    """`prefillbench tune`, validated: `settings` (how every configuration is probed), `criteria` (one per SLO
    listed) and `configs` (the grid of strategy x budget) are known before loading the backend.

    On a real backend --sim-model, --sim-gpu and --calibration are the calibrated sim's, kept here; on the sim
    they stay in `load`, the sim backend's own."""

    load: BackendOptions
    pg: list[tuple[int, int]] | None = None
    len_spread: float = 0.0
    workload: str | None = None
    reading: TraceReading = field(default_factory=TraceReading)
    strategy: list[str] | None = None
    chunk_size: list[int] | None = None  # token budgets
    budget: list[str] | None = None  # --budget: the budget part of each scheduler (compose.py)
    cadence: list[str] | None = None  # --cadence: its cadence part
    spec: list[str] | None = None  # --spec: speculative decoding, its spec part (one scheduler per value)
    concurrency: int = 0
    seed: int = 42
    no_warmup: bool = False
    slo: str | None = None  # KEY=MS[,MS...][,KEY=MS]
    percentile: float = 99.0
    max_sched_delay: float = capacity.DEFAULT_MAX_SCHED_DELAY_MS
    max_queue_growth: float = 100 * capacity.DEFAULT_MAX_QUEUE_GROWTH  # percent
    requests: int | None = None
    repeats: int | None = None
    precision: float | None = None  # percent; None: capacity's default, or --quick's
    start_rate: float | None = None  # None: the saturated throughput on the sim, DEFAULT_START_RATE elsewhere
    arrival: str = "poisson"
    burstiness: float = 1.0
    top_k: int | None = None  # None: DEFAULT_TOP_K, or --quick's
    no_sim: bool = False
    full_grid: bool = False  # the sim's grid searched whole, no successive halving (bench/halving.py)
    sim_only: bool = False
    time_budget: float | None = None  # seconds
    quick: bool = False
    jobs: int | None = None
    output: str = "md"
    export: str | None = None
    plot: str | None = None
    verbose: bool = False  # every column and the diagnostic lines
    no_progress: bool = False
    sim_model: str | None = None  # a real backend's sim: shapes (default: read from the backend's model)
    sim_gpu: str | None = None  # a real backend's sim: the nominal spec
    calibration: str | None = None  # a real backend's sim: a calibration file instead of a quick sweep
    calibrate_on: str | None = None  # a server's sim: probed on the server itself (None, "server") or the gguf backend
    gpus: int | None = None  # both designs on this many GPUs (bench/designs.py); None: the strategy x budget grid
    attainment: float = 90.0  # percent
    slo_scales: list[float] | None = None
    prefill_strategy: list[str] | None = None
    out: Any = field(default=None, repr=False)  # stdout, replaceable in tests
    err: Any = field(default=None, repr=False)
    settings: tune.TuneSettings = field(init=False, repr=False)
    criteria: list[capacity.Criteria] = field(init=False, repr=False)
    configs: list[tune.Config] = field(init=False, repr=False)
    design_slo: Any = field(default=None, init=False, repr=False)  # --gpus: the one SLO (metrics.SLO)
    design_tests: list = field(default_factory=list, init=False, repr=False)  # --gpus: a search per --pg

    @classmethod
    def from_flags(cls, **flags: Any) -> TuneOptions:
        load = BackendOptions.pick(flags)
        own = {f.name for f in fields(cls) if f.init} - {"load"}
        if load.name == "sim":
            own -= set(SIM_OF_TUNE)
        else:
            load = replace(load, **{k: None for k in SIM_OF_TUNE})
        own.discard("reading")
        options = cls(load, **{k: v for k, v in flags.items() if k in own}, reading=trace_reading(flags))
        options.validate()
        return options

    def _serve_with(self, engine) -> None:
        """On a serving engine: the baseline is the engine's own default configuration (it cannot run sequential);
        a server already running (--url) has its own budget, so only the rate is searched; the sim is calibrated on
        the server itself (_check_calibrate_on)."""
        if self.load.url:
            if self.chunk_size:
                raise UsageError("--url measures a server already running, whose budget is its own: drop --chunk-size "
                                 "(the rate is searched)")
            self.configs = [tune.Config(engine.default_strategy, None)]
            baseline = self.configs[0]
            name = "the server as it runs"
        else:
            baseline = tune.Config(engine.default_strategy, engine.default_budget)
            if baseline not in self.configs:
                self.configs.append(baseline)
            name = f"{engine.name}'s default ({baseline.label})"
        self._check_calibrate_on(engine)
        self.settings = replace(self.settings, baseline=baseline, baseline_name=name)

    def _check_calibrate_on(self, engine) -> None:
        """Where a server's sim is calibrated: on the server itself by its probes (the default, any engine, launched
        or at --url), or, for llama-server prefillbench launches, on the gguf backend stepping the same llama.cpp
        (the proxy of before, kept for the comparison)."""
        if self.calibrate_on is None:
            return
        if self.calibrate_on not in CALIBRATE_ON:
            raise UsageError(f"--calibrate-on {self.calibrate_on}: choose {' or '.join(CALIBRATE_ON)}")
        if self.calibration or self.no_sim:
            given = "--calibration FILE is its calibration" if self.calibration else "--no-sim has none"
            raise UsageError(f"--calibrate-on calibrates the sim; {given}: drop one of them")
        if self.calibrate_on == "gguf" and (engine.name != "llama-server" or self.load.url):
            raise UsageError("--calibrate-on gguf steps llama.cpp on the gguf backend: only for llama-server that "
                             f"prefillbench launches, not {engine.name}{' at --url' if self.load.url else ''}")

    @property
    def on_sim(self) -> bool:
        return self.load.name == "sim"

    def apply_quick(self) -> None:
        """--quick's preset, under whatever was given."""
        if not self.pg and not self.workload:
            self.pg = [QUICK["pg"]]
        self.slo = self.slo or QUICK["slo"]
        self.requests = QUICK["requests"] if self.requests is None else self.requests
        self.precision = QUICK["precision"] if self.precision is None else self.precision
        if not self.load.url:  # at --url the budget is the server's own
            self.chunk_size = self.chunk_size or QUICK["budgets"]
        served = self.load.served_engine()
        if not self.load.url:  # a server already running has one configuration, its own: no -s to preset
            self.strategy = self.strategy or [s for s in QUICK["strategies"] if served is None or served.expresses(s)]
        self.top_k = QUICK["top_k"] if self.top_k is None else self.top_k
        if self.load.skip_idle is None and self.load.name != "sim" and self.load.served_engine() is None:
            self.load.skip_idle = QUICK["skip_idle"]  # the baseline's probes at its low capacity are two-thirds idle

    def _check_designs(self) -> None:
        """--gpus: both designs on the sim, under one SLO at an attainment; its flags refused elsewhere."""
        given = [f"--{f.replace('_', '-')}" for f in ("slo_scales", "prefill_strategy") if getattr(self, f)]
        if self.attainment != 90.0:
            given.append("--attainment")
        if self.gpus is None:
            if given:
                raise UsageError(f"{given[0]} is for the search of both designs: give --gpus N")
            return
        if not self.on_sim:
            raise UsageError(f"--gpus searches deployments on the sim, not on the {self.load.name} backend")
        if self.gpus < 2:
            raise UsageError(f"--gpus {self.gpus}: a disaggregated design needs at least 2 GPUs")
        if self.load.disaggregate is not None:
            raise UsageError("--gpus searches every prefill:decode split: drop --disaggregate")
        if not 0 < self.attainment <= 100:
            raise UsageError(f"--attainment {self.attainment:g}: a percentage in (0, 100]")
        if any(not x > 0 for x in self.slo_scales or []):
            raise UsageError("--slo-scales: every scale must be positive")

    def validate(self) -> None:
        self._check_designs()
        if self.gpus is None and self.load.disaggregate is not None:
            raise UsageError("tune searches one engine's strategies and budgets; --gpus N searches every P:D split "
                             "beside them (capacity --disaggregate P:D measures one split)")
        named = bool(self.strategy)  # -s given, not --quick's preset: a strategy it names that cannot run is refused
        if self.quick:
            self.apply_quick()
        # Unset until here, so that --quick can tell a value given from the default (--quick --top-k 3 is 3).
        self.precision = 100 * capacity.DEFAULT_PRECISION if self.precision is None else self.precision
        self.top_k = DEFAULT_TOP_K if self.top_k is None else self.top_k
        check_seed(self.seed)
        if self.no_sim and self.sim_only:
            raise UsageError("--no-sim and --sim-only exclude each other")
        if self.top_k < 1:
            raise UsageError(f"--top-k must be at least 1, got {self.top_k}")
        if self.jobs is not None and self.jobs < 1:
            raise UsageError(f"--jobs must be at least 1, got {self.jobs}")
        if self.start_rate is not None and not self.start_rate > 0:
            raise UsageError(f"--start-rate must be positive, got {self.start_rate:g}")
        if self.time_budget is not None and not self.time_budget > 0:
            raise UsageError(f"--time-budget must be positive, got {self.time_budget:g}")
        check_queue_growth(self.max_queue_growth)
        if self.slo is None:
            raise UsageError("tune needs --slo, e.g. --slo tbt=100 (P99 time between tokens within 100 ms)")
        try:
            slos = parse_slo_list(self.slo)
            self.criteria = [capacity.Criteria.from_slo(s, self.max_sched_delay, self.percentile, self.max_queue_growth / 100) for s in slos]
        except ValueError as e:
            raise UsageError(f"--slo: {e}") from None
        if self.gpus is not None:
            if len(slos) > 1:
                raise UsageError("--gpus takes one SLO, e.g. --slo ttft=250,tpot=100 (--slo-scales tightens it)")
            self.design_slo = slos[0]
        check_precision(self.precision)
        # --gpus with several --pg: the crossover across prompt:output ratios, one design search per shape
        shapes = [[pg] for pg in self.pg] if self.gpus is not None and self.pg and len(self.pg) > 1 else [self.pg]
        self.design_tests = [self.searched_test(shape, self.arrival, "tune") for shape in shapes]
        test = self.design_tests[0]
        strategies = strategy_names(self.strategy, self.load, self.budget, self.cadence, self.spec)
        unaimed = [k for k in self.criteria if slo_pricing.step_limit_ms(k.tbt_p99_ms, k.tpot_ms) is None]
        aim = (unaimed or self.criteria)[0]  # slo-budget aims at every SLO listed: each needs a TBT or TPOT limit
        strategies = priced.checked(strategies, named, self.load, aim.tbt_p99_ms, aim.tpot_ms,
                                    self.on_sim or not self.no_sim or bool(self.calibration),
                                    "--gpus" if self.gpus is not None else "")
        if self.output not in TUNE_OUTPUTS:
            raise UsageError(f"-o {self.output}: tune prints {', '.join(TUNE_OUTPUTS)}")
        if self.export:
            try:
                format_for_path(self.export, RECORD_FORMATS)
            except ValueError as e:
                raise UsageError(str(e)) from None
        sim = self.on_sim
        requests = workload_requests(test, self.requests) or (self.requests if self.requests is not None else (
            capacity.DEFAULT_REQUESTS_SIM if sim else capacity.DEFAULT_REQUESTS))
        repeats = self.repeats if self.repeats is not None else (3 if sim else 1)
        try:
            self.settings = tune.TuneSettings(test, self.criteria, requests, self.concurrency, self.arrival,
                                              self.burstiness, self.seed, repeats,
                                              self.start_rate or (None if sim else capacity.DEFAULT_START_RATE),
                                              self.precision / 100,
                                              not self.no_warmup)
            self.settings.capacity_config(self.criteria[0])  # validates requests, concurrency, arrival
        except ValueError as e:
            raise UsageError(str(e)) from None
        served = self.load.served_engine()
        if not self.strategy and served is None and "vllm-v1" in strategies:
            strategies = [*strategies, *VLLM_VARIANTS]
        self.configs = tune.grid(strategies, unique(self.chunk_size, "--chunk-size") or DEFAULT_BUDGETS,
                                 self.load.host_sizes())
        if served is not None:
            self._serve_with(served)
        elif self.calibrate_on is not None:
            raise UsageError(f"--calibrate-on is for a server's sim (--backend llama-server or server); the "
                             f"{self.load.name} backend {'is the sim' if self.on_sim else 'calibrates the sim on itself'}")
        self.load.check_concurrency(self.concurrency)
        self.load.validate()

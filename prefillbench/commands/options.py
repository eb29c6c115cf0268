"""Each command's options as one typed, validated value, built from the parsed flags here and nowhere else.

cli.py declares the flags and hands them, by parameter name, to a `from_flags` below (hyperfine's
cli.rs / options.rs split). A `from_flags` checks what the parser cannot: values out of range,
flags that do not go together, a flag the chosen backend ignores (warned about once, naming flag
and backend, from the backends' own declarations: prefillbench.backends.check_options), repeated
list values (dropped, with a note). A bad value ends in UsageError: one line, exit 2.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from strategies import STRATEGIES

from prefillbench.backends import backend_class, check_options, choose_backend
from prefillbench.backends.distributed import is_rank_zero
from prefillbench.bench import capacity, stats, tune
from prefillbench.bench.cases import BenchConfig
from prefillbench.bench.metrics import SLO
from prefillbench.bench.workloads import ARRIVALS, TestSpec, load_workload, make_tests, workload_test
from prefillbench.errors import BackendError, UsageError
from prefillbench.report.ab import AB_METRICS, DEFAULT_GATED, DEFAULT_THRESHOLD
from prefillbench.report.compare import DEFAULT_METRICS
from prefillbench.report.tables import format_for_path


def note(text: str) -> None:
    """A line on stderr about how the input was read; under torchrun, from rank 0 only."""
    if is_rank_zero():
        print(f"prefillbench: {text}", file=sys.stderr)


def unique(values: list[Any] | None, flag: str) -> list[Any] | None:
    """The values in their order, each once; a note names the flag when some were given twice."""
    if values is None:
        return None
    once = list(dict.fromkeys(values))
    if len(once) < len(values):
        twice = [v for i, v in enumerate(once) if values.count(v) > 1]
        shown = ", ".join(",".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in twice)
        note(f"note: {flag} lists {shown} more than once; each value runs once")
    return once


def _check_export(path: str | None) -> None:
    if path:
        try:
            format_for_path(path)
        except ValueError as e:
            raise UsageError(str(e)) from None


def _check_seed(seed: int) -> None:
    if seed < 0:
        raise UsageError(f"--seed must be 0 or more, got {seed}")


def check_precision(pct: float) -> None:
    """--precision is a percentage of the capacity: 5 means bisect to within 5%."""
    if not 0 < pct < 100:
        raise UsageError(f"--precision is a percentage of the capacity between 0 and 100 (5 means 5%), got {pct:g}")


def _check_relative_to(strategy: str | None, strategies: list[str], what: str) -> None:
    if strategy and strategy not in strategies:
        raise UsageError(f"--relative-to {strategy}: not among the strategies {what} ({', '.join(strategies)})")


def strategy_names(given: list[str] | None) -> list[str]:
    names = unique(given, "-s") or list(STRATEGIES)
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown:
        raise UsageError(f"unknown strategy {unknown[0]!r}; choose from {', '.join(STRATEGIES)}")
    return names


# ---------------------------------------------------------------- the backend


def _backend_option(default: Any, flag: str, option: str, negated: bool = False) -> Any:
    """A field that stands for load option `option` of the backends; `negated`: a --no-X flag for X=False."""
    return field(default=default, metadata={"flag": flag, "option": option, "negated": negated})


@dataclass
class BackendOptions:
    """What loads the backend: shared by run, capacity and calibrate."""

    model: str | None = None
    backend: str = "auto"
    device: str = _backend_option("auto", "--device", "device")
    dtype: str = _backend_option("float32", "--dtype", "dtype")
    threads: int | None = _backend_option(None, "-t", "threads")
    n_gpu_layers: int | None = _backend_option(None, "-ngl", "n_gpu_layers")
    ubatch: int | None = _backend_option(None, "--ubatch", "n_ubatch")
    flash_attn: str | None = _backend_option(None, "-fa", "flash_attn")
    no_cuda_graphs: bool = _backend_option(False, "--no-cuda-graphs", "cuda_graphs", negated=True)
    no_tune_linear: bool = _backend_option(False, "--no-tune-linear", "tune_linear", negated=True)
    compile_decode: bool = _backend_option(False, "--compile", "compile_decode")
    kernels: str = _backend_option("auto", "--kernels", "kernels")
    sim_model: str | None = _backend_option(None, "--sim-model", "sim_model")
    sim_gpu: str | None = _backend_option(None, "--sim-gpu", "sim_gpu")
    tp: int = _backend_option(1, "--tp", "tp")
    pp: int = _backend_option(1, "--pp", "pp")
    calibration: str | None = _backend_option(None, "--calibration", "calibration")
    trace: str | None = _backend_option(None, "--trace", "trace")
    skip_idle: bool | None = None  # the engine's clock, not a load option: None leaves it to the command (tune --quick)

    @classmethod
    def pick(cls, flags: dict[str, Any]) -> BackendOptions:
        """The backend's options out of a command's flags (those this class has a field for)."""
        return cls(**{f.name: flags[f.name] for f in fields(cls) if f.name in flags})

    @property
    def name(self) -> str:
        """The backend that runs: --backend with auto resolved for this model."""
        return choose_backend(self.backend, self.model, self.tp)

    def _given(self) -> list[tuple[Any, Any]]:
        """(field, value) of each option set away from its default."""
        return [(f, getattr(self, f.name)) for f in fields(self) if "option" in f.metadata and getattr(self, f.name) != f.default]

    def load_options(self) -> dict[str, Any]:
        """The load_backend options the flags stand for: only those given, so each backend keeps its own defaults."""
        return {f.metadata["option"]: (not v if f.metadata["negated"] else v) for f, v in self._given()}

    def validate(self) -> None:
        """Refuse what cannot run and warn, once each, about every flag the backend will not use."""
        name = self.name
        if name != "sim" and self.model and Path(self.model).is_dir():
            folder = Path(self.model)
            if not (folder / "config.json").is_file() and not any(folder.glob("*.gguf")):
                raise UsageError(f"-m {self.model}: the folder holds no model (no config.json and no .gguf file)")
        try:
            ignored = check_options(name, self.load_options())
        except BackendError as e:
            raise UsageError(str(e)) from None
        for f, value in self._given():
            option = f.metadata["option"]
            if option in ignored:
                shown = f.metadata["flag"] if isinstance(value, bool) else f"{f.metadata['flag']} {value}"
                why = f" ({ignored[option]})" if ignored[option] else ""
                note(f"warning: {shown} is ignored by the {name} backend{why}")
        if self.skip_idle and name == "sim":
            note("warning: --skip-idle is ignored by the sim backend (its clock never sleeps)")

    def check_concurrency(self, most: int) -> None:
        """Refuse a -c the backend cannot hold, before loading a model to find out."""
        limit = backend_class(self.name).sequence_limit
        if limit is not None and most > limit:
            raise UsageError(f"-c {most}: the {self.name} backend runs at most {limit} sequences at once")


# ---------------------------------------------------------------- tests


def test_specs(n_prompt: list[int] | None, n_gen: list[int] | None, pg: list[tuple[int, int]] | None,
               arrival: str | None, len_spread: float, workload: str | None) -> list[TestSpec]:
    """-p/-n/--pg with --len-spread, or the one test a --workload file makes.

    In an open loop, --pg alone means just that test: pp-only and tg-only requests are not what a server sees.
    """
    try:
        if workload:
            if n_prompt or n_gen or pg or len_spread:
                raise UsageError("--workload gives the lengths: drop -p, -n, --pg and --len-spread")
            return [workload_test(load_workload(workload))]
        defaults = not (pg and arrival not in (None, "closed"))
        return make_tests(unique(n_prompt, "-p") or ([512] if defaults else []), unique(n_gen, "-n") or ([128] if defaults else []),
                          unique(pg, "--pg") or [], len_spread)
    except UsageError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from None


def request_shape(pg: list[tuple[int, int]] | None, workload: str | None) -> list[tuple[int, int]]:
    """capacity's and tune's --pg: 512,128 unless given, or none with a --workload, which gives the lengths."""
    return pg or ([] if workload else [(512, 128)])


class Measuring:
    """What run and capacity share: options built around the backend they load, and requests made from a seed."""

    load: BackendOptions
    seed: int
    len_spread: float
    workload: str | None

    @classmethod
    def from_flags(cls, **flags: Any) -> Any:
        own = {f.name for f in fields(cls) if f.init} - {"load"}  # type: ignore[arg-type]
        options = cls(BackendOptions.pick(flags), **{k: v for k, v in flags.items() if k in own})  # type: ignore[call-arg]
        options.validate()
        return options

    def validate(self) -> None:
        raise NotImplementedError

    def workload_settings(self) -> dict[str, Any]:
        """What made the requests, for the export's metadata (arrival, rate and SLO are columns of every row)."""
        return {"seed": self.seed, "len_spread": self.len_spread, "workload": self.workload or ""}


# ---------------------------------------------------------------- run


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
    repetitions: int | None = None
    requests: int | None = None
    seed: int = 42
    no_warmup: bool = False
    len_spread: float = 0.0
    workload: str | None = None
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
    config: BenchConfig = field(init=False, repr=False)

    def validate(self) -> None:
        _check_seed(self.seed)
        if self.repetitions is not None and self.repetitions < 1:
            raise UsageError(f"-r {self.repetitions}: at least 1 repetition")
        self.config = self.bench_config()
        _check_relative_to(self.relative_to, self.config.strategies, "run")
        _check_export(self.export)
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
        strategies = strategy_names(self.strategy)
        tests = test_specs(self.n_prompt, self.n_gen, self.pg, self.arrival, self.len_spread, self.workload)
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
        )
        try:
            config.validate()
        except ValueError as e:
            raise UsageError(str(e)) from None
        return config


# ---------------------------------------------------------------- capacity


@dataclass
class CapacityOptions(Measuring):
    """`prefillbench capacity`, validated; `config` needs the backend's name only, so it is known before loading."""

    load: BackendOptions
    pg: list[tuple[int, int]] | None = None
    len_spread: float = 0.0
    workload: str | None = None
    strategy: list[str] | None = None
    chunk_size: list[int] | None = None
    concurrency: int = 0
    seed: int = 42
    no_warmup: bool = False
    slo: SLO | None = None
    max_sched_delay: float = capacity.DEFAULT_MAX_SCHED_DELAY_MS
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

    def validate(self) -> None:
        _check_seed(self.seed)
        if self.slo is None or self.slo.tbt_ms is None:
            raise UsageError("capacity needs --slo tbt=MS: the highest rate whose P99 time between tokens stays within it")
        tests = test_specs(None, None, request_shape(self.pg, self.workload), self.arrival, self.len_spread, self.workload)
        if len(tests) != 1:
            raise UsageError("capacity searches one test: give one --pg or a --workload")
        strategies = strategy_names(self.strategy)
        _check_relative_to(self.relative_to, strategies, "searched")
        check_precision(self.precision)
        _check_export(self.export)
        sim = self.load.name == "sim"
        self.config = capacity.CapacityConfig(
            tests[0], strategies, unique(self.chunk_size, "--chunk-size") or [256],
            capacity.Criteria(self.slo.tbt_ms, self.max_sched_delay),
            requests=self.requests or (capacity.DEFAULT_REQUESTS_SIM if sim else capacity.DEFAULT_REQUESTS),
            concurrency=self.concurrency, arrival=self.arrival, burstiness=self.burstiness, seed=self.seed,
            start_rate=self.start_rate, precision=self.precision / 100, warmup=not self.no_warmup, slo=self.slo,
        )
        try:
            self.config.validate()
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.load.check_concurrency(self.concurrency)
        self.load.validate()


# ---------------------------------------------------------------- tune

#: Sarathi-Serve's budgets around its 512 (and vLLM's 2048 default): 128 to 4096.
DEFAULT_BUDGETS = [128, 256, 512, 1024, 2048, 4096]
DEFAULT_TOP_K = 3
#: --quick on a real backend: short requests and few of them, one seed, a coarse precision; about 15 minutes
#: for the shipped model on a 2-core CPU.
QUICK = dict(pg=(256, 32), slo="tbt=300", requests=20, precision=10.0, budgets=[32, 64, 128, 256], top_k=2,
             strategies=["sequential", "chunked", "sarathi-serve", "packed"], skip_idle=True)
#: The flags that, on a real backend, describe the sim that carries tune's search rather than the backend.
SIM_OF_TUNE = ("sim_model", "sim_gpu", "calibration")
TUNE_OUTPUTS = ("md", "csv", "json")


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
    strategy: list[str] | None = None
    chunk_size: list[int] | None = None  # token budgets
    concurrency: int = 0
    seed: int = 42
    no_warmup: bool = False
    slo: str | None = None  # KEY=MS[,MS...][,KEY=MS]
    percentile: float = 99.0
    max_sched_delay: float = capacity.DEFAULT_MAX_SCHED_DELAY_MS
    requests: int | None = None
    repeats: int | None = None
    precision: float = 100 * capacity.DEFAULT_PRECISION  # percent
    start_rate: float | None = None  # None: the saturated throughput on the sim, DEFAULT_START_RATE elsewhere
    arrival: str = "poisson"
    burstiness: float = 1.0
    top_k: int = DEFAULT_TOP_K
    no_sim: bool = False
    sim_only: bool = False
    time_budget: float | None = None  # seconds
    quick: bool = False
    jobs: int | None = None
    output: str = "md"
    export: str | None = None
    plot: str | None = None
    no_progress: bool = False
    sim_model: str | None = None  # a real backend's sim: shapes (default: read from the backend's model)
    sim_gpu: str | None = None  # a real backend's sim: the nominal spec
    calibration: str | None = None  # a real backend's sim: a calibration file instead of a quick sweep
    out: Any = field(default=None, repr=False)  # stdout, replaceable in tests
    err: Any = field(default=None, repr=False)
    settings: tune.TuneSettings = field(init=False, repr=False)
    criteria: list[capacity.Criteria] = field(init=False, repr=False)
    configs: list[tune.Config] = field(init=False, repr=False)

    @classmethod
    def from_flags(cls, **flags: Any) -> TuneOptions:
        load = BackendOptions.pick(flags)
        own = {f.name for f in fields(cls) if f.init} - {"load"}
        if load.name == "sim":
            own -= set(SIM_OF_TUNE)
        else:
            load = replace(load, **{k: None for k in SIM_OF_TUNE})
        options = cls(load, **{k: v for k, v in flags.items() if k in own})
        options.validate()
        return options

    @property
    def on_sim(self) -> bool:
        return self.load.name == "sim"

    def apply_quick(self) -> None:
        """--quick's preset, under whatever was given."""
        if not self.pg and not self.workload:
            self.pg = [QUICK["pg"]]
        self.slo = self.slo or QUICK["slo"]
        self.requests = QUICK["requests"] if self.requests is None else self.requests
        self.precision = QUICK["precision"] if self.precision == 100 * capacity.DEFAULT_PRECISION else self.precision
        self.chunk_size = self.chunk_size or QUICK["budgets"]
        self.strategy = self.strategy or QUICK["strategies"]
        self.top_k = QUICK["top_k"] if self.top_k == DEFAULT_TOP_K else self.top_k
        if self.load.skip_idle is None and self.load.name != "sim":
            self.load.skip_idle = QUICK["skip_idle"]  # the baseline's probes at its low capacity are two-thirds idle

    def validate(self) -> None:
        if self.quick:
            self.apply_quick()
        _check_seed(self.seed)
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
        if self.slo is None:
            raise UsageError("tune needs --slo, e.g. --slo tbt=100 (P99 time between tokens within 100 ms)")
        try:
            slos = tune.parse_slo_list(self.slo)
            self.criteria = [capacity.Criteria.from_slo(s, self.max_sched_delay, self.percentile) for s in slos]
        except ValueError as e:
            raise UsageError(f"--slo: {e}") from None
        check_precision(self.precision)
        tests = test_specs(None, None, request_shape(self.pg, self.workload), self.arrival, self.len_spread, self.workload)
        if len(tests) != 1:
            raise UsageError("tune searches one test: give one --pg or a --workload")
        strategies = strategy_names(self.strategy)
        if self.output not in TUNE_OUTPUTS:
            raise UsageError(f"-o {self.output}: tune prints {', '.join(TUNE_OUTPUTS)}")
        if self.export and not self.export.endswith((".json", ".csv")):
            raise UsageError(f"--export writes .json or .csv, not {self.export}")
        sim = self.on_sim
        requests = self.requests if self.requests is not None else (
            capacity.DEFAULT_REQUESTS_SIM if sim else capacity.DEFAULT_REQUESTS)
        repeats = self.repeats if self.repeats is not None else (3 if sim else 1)
        try:
            self.settings = tune.TuneSettings(tests[0], self.criteria, requests, self.concurrency, self.arrival,
                                              self.burstiness, self.seed, repeats,
                                              self.start_rate or (None if sim else capacity.DEFAULT_START_RATE),
                                              self.precision / 100,
                                              not self.no_warmup)
            self.settings.capacity_config(self.criteria[0])  # validates requests, concurrency, arrival
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.configs = tune.grid(strategies, unique(self.chunk_size, "--chunk-size") or DEFAULT_BUDGETS)
        self.load.check_concurrency(self.concurrency)
        self.load.validate()


# ---------------------------------------------------------------- compare, plot, calibrate


@dataclass
class CompareOptions:
    base: str
    current: str
    metric: list[str] = field(default_factory=lambda: list(DEFAULT_METRICS))
    threshold: float = 10.0  # percent
    relative_to: str | None = None
    noisy_cv: float = 100 * stats.DEFAULT_NOISY_CV  # percent
    output: str = "md"
    no_verdict: bool = False

    @classmethod
    def from_flags(cls, **flags: Any) -> CompareOptions:
        return cls(**{**flags, "metric": flags.get("metric") or list(DEFAULT_METRICS)})


@dataclass
class PlotOptions:
    files: list[str]
    out: str

    @classmethod
    def from_flags(cls, **flags: Any) -> PlotOptions:
        return cls(**flags)


@dataclass
class CalibrateOptions:
    load: BackendOptions
    sim_model: str | None = None  # shapes for the sim; None: the real backend's model config
    sim_gpu: str | None = None  # the nominal spec the fractions are relative to
    quick: bool = False
    repeats: int = 3
    output: str = "calibration.json"
    errors: str | None = None
    check: bool = False
    check_run: tuple[int, ...] = (192, 16, 4, 8, 64)

    @classmethod
    def from_flags(cls, **flags: Any) -> CalibrateOptions:
        # --sim-model and --sim-gpu describe the sim being fitted here, not a sim backend to load.
        backend_flags = {k: v for k, v in flags.items() if k not in ("sim_model", "sim_gpu")}
        own = {f.name for f in fields(cls)} - {"load"}
        options = cls(BackendOptions.pick(backend_flags), **{k: v for k, v in flags.items() if k in own})
        if options.repeats < 1:
            raise UsageError(f"--repeats must be at least 1, got {options.repeats}")
        options.load.validate()
        return options


# ---------------------------------------------------------------- ab

# Small on purpose: each side runs it once per round, and short runs keep a round's two runs
# close in time. One thread: llama.cpp's threads spin-wait on each other, and with as many
# threads as cores any other process on the runner can slow a run several-fold (measured 7x
# on a shared 2-core machine), noise no pairing can cancel. About 15 s a run on a quiet 2-core CPU.
DEFAULT_PRESET = ["--backend", "auto", "-t", "1", "-p", "0", "-n", "0", "--pg", "64,16", "-c", "4",
                  "-s", "sequential,padded,chunked", "--chunk-size", "32", "-r", "1", "--interleave"]
DEFAULT_MIN_ROUNDS = 5
DEFAULT_MAX_ROUNDS = 12
DEFAULT_MAX_SECONDS = 480.0


@dataclass
class ABOptions:
    base_ref: str
    preset: list[str] = field(default_factory=lambda: list(DEFAULT_PRESET))
    repo: Path = Path(".")
    metrics: list[str] = field(default_factory=lambda: list(AB_METRICS))
    gated: list[str] = field(default_factory=lambda: list(DEFAULT_GATED))
    threshold: float = DEFAULT_THRESHOLD
    confidence: float = stats.DEFAULT_CONFIDENCE
    min_rounds: int = DEFAULT_MIN_ROUNDS
    max_rounds: int = DEFAULT_MAX_ROUNDS
    max_seconds: float = DEFAULT_MAX_SECONDS
    out: Path | None = None  # keep every round's exports here
    summary: Path | None = None

    @classmethod
    def from_flags(cls, base: str, run_args: list[str] | None, metric: list[str] | None, gate: list[str] | None,
                   confidence: float, **flags: Any) -> ABOptions:
        metrics = metric or list(AB_METRICS)
        options = cls(base_ref=base, preset=list(run_args or DEFAULT_PRESET), metrics=metrics,
                      gated=gate or [m for m in DEFAULT_GATED if m in metrics], confidence=confidence / 100, **flags)
        options.validate()
        return options

    def validate(self) -> None:
        if self.min_rounds < 2:
            raise UsageError(f"--min-rounds must be at least 2 (an interval needs two rounds), got {self.min_rounds}")
        if self.max_rounds < self.min_rounds:
            raise UsageError(f"--max-rounds ({self.max_rounds}) is below --min-rounds ({self.min_rounds})")
        if not 0 < self.confidence < 1:
            raise UsageError(f"--confidence must lie between 0 and 100%, got {100 * self.confidence:g}%")
        unknown = [m for m in self.gated if m not in self.metrics]
        if unknown:
            raise UsageError(f"--gate {unknown[0]} is not among the compared metrics ({', '.join(self.metrics)})")
        for flag in ("--export", "--export-requests", "-o", "--output", "--relative-to", "--verify"):
            if flag in self.preset:
                raise UsageError(f"the preset may not set {flag}: the A/B job sets its own output")

"""prefillbench's command line (Typer), in llama-bench's conventions: the app and the flags, nothing else.

Short flags as llama-bench spells them (-p, -n, -c, -r, -s, -t, -ngl, -o), and list flags take
comma lists, repeated flags, or both (`-p 128,512 -p 1024`). Each option is declared once, as an
Annotated alias in its help panel's block (prefillbench.commands.flags); a command lists the aliases it takes and hands
them, under their parameter names, to its options' `from_flags` (prefillbench.commands.options),
which validates them into one typed value for the command's handler (prefillbench.commands.<name>).
Adding a flag to `run` is therefore: one alias in flags.py, one parameter in `run`, one field in RunOptions,
and its use where it matters.
"""
from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from prefillbench import __version__
from prefillbench.backends.base import BackendError
from prefillbench.bench.capacity import DEFAULT_PRECISION, DEFAULT_REQUESTS, DEFAULT_REQUESTS_SIM, DEFAULT_START_RATE
from prefillbench.commands import ab, calibrate, capacity, compare, designs, merge, plot, run, tune
from prefillbench.commands.flags import (CAPACITY_PANEL, DEPLOY_PANEL, MODEL_PANEL, OUTPUT_PANEL, TESTS_PANEL, Arrival, BackendName,
                                         ClientRay, ClientWorkers, DataParallel, EngineName, ExpertParallel, LatencyFrom, Shard, Strict, KvDtype, ServerBin, ServerCmd, ServerTimeout, SimDtype, SimLink, SimOverheads, SimPricing, MaxNumSeqs, KvCacheTokens, KvHostCache, KvHostLink, HicacheWritePolicy, Url,
                                         Budget, Burstiness, Cadence, Spec, Calibration, ChunkSize, CompileDecode, Concurrency, Device, DType,
                                         Export, ExportRequests, FlashAttn, GpuLayers, Interleave, Kernels, LenSpread,
                                         MaxQueueGrowth, MaxSchedDelay, Model, NGen, NoCudaGraphs, NoisyCV, NoProgress, NoResultsFile,
                                         NoTuneLinear, NoVerdict, NoWarmup, NPrompt, Output, PipelineStages, ProbeArrival,
                                         PromptGen, Rate, RelativeTo, Repetitions, Requests, RequestShape, ResultsDir, Seed,
                                         SimGpu, SkipIdle, Disaggregate, PrefillTp, DecodeTp, KvLink, KvTransfer, SimModel, SLOOption, Strategy, TensorParallel, Threads, Trace, UBatch,
                                         Verify, Workload, PrefixBlock, PrefixCache, TimeScale, TokenScale, TraceFirst,
                                         TraceFormat, TraceMaxLen, TraceSpan, flag, option)
from prefillbench.bench.traces import TraceReading
from prefillbench.commands.options import (DEFAULT_PRESET, DEFAULT_TOP_K, QUICK, TUNE_OUTPUTS, ABOptions, BackendOptions,
                                           CalibrateOptions, CapacityOptions, CompareOptions, MergeOptions, PlotOptions, RunOptions,
                                           TuneOptions)
from prefillbench.commands.parsers import budgets, choice, five_ints, float_list, str_list, metric_list, metrics_if_given, percent, slo_spec
from prefillbench.commands.session import close_sessions, error_prefix
from prefillbench.errors import UsageError
from prefillbench.report.ab import AB_METRICS, DEFAULT_GATED
from prefillbench.report.compare import METRICS
from prefillbench.report.plots import DEFAULT_OUT

# ---------------------------------------------------------------- the app


class _PlainHelp:
    """A help screen that shows no type where a flag takes none: no `<bool>` beside -h/--help, --version or
    --install-completion, and a list argument as `FILE...` in the usage line, without `<list[str]>` beside it."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if isinstance(param, TyperArgument) and param.nargs != 1:
                name = param.metavar or param.name
                param.display_type_rich = lambda ctx: None
                param.get_usage_pieces = lambda ctx, name=name: [f"{name}..."]
            elif getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class Command(_PlainHelp, TyperCommand):
    pass


class Group(_PlainHelp, TyperGroup):
    pass


def _version(value: bool) -> None:
    if value:
        print(f"prefillbench {__version__}")
        raise typer.Exit()


app = typer.Typer(
    name="prefillbench",
    cls=Group,
    help="Measure how LLM engines should schedule prefill against decode.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(
    version: Annotated[bool, flag("--version", is_eager=True, callback=_version, help="print the version and exit")] = False,
) -> None:
    pass


def command(name: str, help: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Register a command; whatever module raises the bad-input error, it ends in one line and exit 2."""

    def register(fn: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> int:
            try:
                return fn(*args, **kwargs)
            except (UsageError, BackendError, ValueError, ab.SideFailed) as e:
                return fail(e)
            except KeyboardInterrupt:
                print("prefillbench: interrupted", file=sys.stderr)
                return 130
            finally:
                close_sessions()  # a server a command started never outlives it

        app.command(name, help=help, cls=Command)(guarded)
        return fn

    return register


def fail(error: Exception | str) -> int:
    print(f"{error_prefix()}: {' '.join(str(error).split())}", file=sys.stderr)
    return 2


# ---------------------------------------------------------------- commands
# Each hands its flags to its options' from_flags (validation) and the value to its handler.
# Defaults come from the options' dataclasses, so each is written once.
R, C, T, B = RunOptions, CapacityOptions, TuneOptions, BackendOptions


def _model_and_backend(
    model: Model = None,
    backend: BackendName = B.backend,
    device: Device = B.device,
    dtype: DType = B.dtype,
    threads: Threads = None,
    n_gpu_layers: GpuLayers = None,
    ubatch: UBatch = None,
    flash_attn: FlashAttn = None,
    no_cuda_graphs: NoCudaGraphs = False,
    no_tune_linear: NoTuneLinear = False,
    compile_decode: CompileDecode = False,
    kernels: Kernels = "auto",
    sim_model: SimModel = None,
    sim_gpu: SimGpu = None,
    sim_link: SimLink = None,
    tp: TensorParallel = B.tp,
    pp: PipelineStages = B.pp,
    ep: ExpertParallel = B.ep,
    dp: DataParallel = B.dp,
    sim_dtype: SimDtype = None,
    kv_dtype: KvDtype = None,
    sim_pricing: SimPricing = None,
    sim_overheads: SimOverheads = None,
    max_num_seqs: MaxNumSeqs = None,
    kv_cache_tokens: KvCacheTokens = None,
    kv_host_cache: KvHostCache = None,
    kv_host_link: KvHostLink = None,
    hicache_write_policy: HicacheWritePolicy = None,
    calibration: Calibration = None,
    prefix_cache: PrefixCache = None,
    prefix_block: PrefixBlock = None,
    trace: Trace = None,
    server_bin: ServerBin = None,
    server_cmd: ServerCmd = None,
    engine: EngineName = None,
    url: Url = None,
    server_timeout: ServerTimeout = None,
    client_workers: ClientWorkers = None,
    client_ray: ClientRay = False,
    shard: Shard = None,
    latency_from: LatencyFrom = None,
    skip_idle: SkipIdle = None,
    disaggregate: Disaggregate = None,
    prefill_tp: PrefillTp = None,
    decode_tp: DecodeTp = None,
    kv_link: KvLink = None,
    kv_transfer: KvTransfer = None,
) -> None:
    """The model-and-backend flags of run, capacity and tune, declared once (see model_flags)."""


def _trace_reading(
    trace_format: TraceFormat = TraceReading.format,
    time_scale: TimeScale = TraceReading.time_scale,
    token_scale: TokenScale = TraceReading.token_scale,
    trace_first: TraceFirst = None,
    trace_span: TraceSpan = None,
    trace_max_len: TraceMaxLen = None,
) -> None:
    """How run, capacity and tune read a --workload trace, declared once (see model_flags)."""


def model_flags(fn: Callable[..., int]) -> Callable[..., int]:
    """A command whose `**shared` takes _model_and_backend's flags and _trace_reading's: Typer reads one signature,
    the model's flags first, the trace's after the command's own."""
    shared = inspect.signature(_model_and_backend, eval_str=True).parameters.values()
    reading = inspect.signature(_trace_reading, eval_str=True).parameters.values()
    own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.kind is not p.VAR_KEYWORD]
    own = [*own, *reading]

    @functools.wraps(fn)
    def with_shared(**kwargs: Any) -> int:
        return fn(**kwargs)

    with_shared.__signature__ = inspect.Signature([*shared, *own], return_annotation=int)  # type: ignore[attr-defined]
    with_shared.__annotations__ = {p.name: p.annotation for p in [*shared, *own]} | {"return": int}
    return with_shared


def flags(values: dict[str, Any]) -> dict[str, Any]:
    """A command's locals() as its options' from_flags takes them: the shared flags in `shared` spread out."""
    return {**{k: v for k, v in values.items() if k != "shared"}, **values.get("shared", {})}


@command("run", help="run the benchmark and print a table")
@model_flags
def run_command(
    n_prompt: NPrompt = None,
    n_gen: NGen = None,
    pg: PromptGen = None,
    concurrency: Concurrency = None,
    strategy: Strategy = None,
    chunk_size: ChunkSize = None,
    budget: Budget = None,
    cadence: Cadence = None,
    spec: Spec = None,
    repetitions: Repetitions = None,
    requests: Requests = None,
    seed: Seed = R.seed,
    no_warmup: NoWarmup = False,
    len_spread: LenSpread = R.len_spread,
    workload: Workload = None,
    arrival: Arrival = None,
    rate: Rate = None,
    burstiness: Burstiness = R.burstiness,
    slo: SLOOption = None,
    interleave: Interleave = False,
    output: Output = R.output,
    export: Export = None,
    export_requests: ExportRequests = None,
    relative_to: RelativeTo = None,
    noisy_cv: NoisyCV = R.noisy_cv,
    results_dir: ResultsDir = R.results_dir,
    no_results_file: NoResultsFile = False,
    verify: Verify = False,
    no_progress: NoProgress = False,
    no_verdict: NoVerdict = False,
    strict: Strict = False,
    **shared: Any,
) -> int:
    return run.cmd_run(RunOptions.from_flags(**flags(locals())))


@command("compare", help="compare two exported runs; exit 1 on a regression beyond --threshold")
def compare_command(
    base: Annotated[str, typer.Argument(metavar="BASE", help="the reference export (.csv, .json or .jsonl)", show_default=False)],
    current: Annotated[str, typer.Argument(metavar="CURRENT", help="the export to check against it", show_default=False)],
    metric: Annotated[Optional[list[str]], typer.Option(
        "--metric", callback=metric_list, metavar="NAME[,NAME]",
        help=f"metrics to compare and gate, repeatable: {', '.join(METRICS)} (default: throughput)")] = None,
    threshold: Annotated[float, typer.Option(
        parser=percent, metavar="PCT", help="exit 1 when a row is worse by more than this percentage")] = CompareOptions.threshold,
    relative_to: Annotated[Optional[str], typer.Option(
        metavar="STRATEGY", help="compare each row's ratio to this strategy's row of the same file (e.g. sequential)")] = None,
    noisy_cv: Annotated[float, typer.Option(
        parser=percent, metavar="PCT", help="mark rows whose CV across repetitions exceeds this")] = CompareOptions.noisy_cv,
    output: Output = CompareOptions.output,
    no_verdict: Annotated[bool, flag("--no-verdict", help="no sentence per metric on stderr, only the exit's summary")] = False,
) -> int:
    return compare.cmd_compare(CompareOptions.from_flags(**locals()))


@command("plot", help="write PNG charts from exported results and per-request traces")
def plot_command(
    files: Annotated[list[str], typer.Argument(
        metavar="FILE", show_default=False,
        help="result exports (.csv, .json, .jsonl) and per-request traces (.requests.jsonl); X.requests.jsonl beside X.json[l] is read too")],
    out: Annotated[str, typer.Option(metavar="DIR", help="where the PNG files go")] = DEFAULT_OUT,
) -> int:
    return plot.cmd_plot(PlotOptions.from_flags(**locals()))


@command("merge", help="join the exports of one run's shards (run --shard I/N --export X.json) into one report")
def merge_command(
    files: Annotated[list[str], typer.Argument(
        metavar="FILE", show_default=False,
        help="each shard's .json or .jsonl export, its per-request trace (X.requests.jsonl) beside it")],
    output: Output = R.output,
    export: Export = None,
) -> int:
    return merge.cmd_merge(MergeOptions.from_flags(**locals()))


@command("capacity", help="search each strategy's capacity: the highest Poisson request rate within a P99 TBT SLO "
                         "and a median scheduling delay bound (Sarathi-Serve's method)")
@model_flags
def capacity_command(
    pg: RequestShape = None,
    len_spread: LenSpread = C.len_spread,
    workload: Workload = None,
    strategy: Strategy = None,
    chunk_size: ChunkSize = None,
    budget: Budget = None,
    cadence: Cadence = None,
    spec: Spec = None,
    concurrency: Annotated[int, option(
        "-c", "--concurrency", panel=TESTS_PANEL,
        help="cap on requests in flight; 0: none (a bounded KV cache, as on the sim, still caps them)")] = C.concurrency,
    seed: Seed = C.seed,
    no_warmup: NoWarmup = False,
    slo: Annotated[Optional[str], option(
        "--slo", panel=CAPACITY_PANEL, callback=slo_spec, metavar="tbt=MS[,ttft=MS,...]",
        help="tbt: the P99 TBT a rate must keep to (required); any other objective adds goodput to the rows")] = None,
    max_sched_delay: MaxSchedDelay = C.max_sched_delay,
    max_queue_growth: MaxQueueGrowth = C.max_queue_growth,
    requests: Annotated[Optional[int], option(
        "--requests", panel=CAPACITY_PANEL,
        help=f"requests per probe (default: {DEFAULT_REQUESTS_SIM} on the sim, {DEFAULT_REQUESTS} on "
        "real backends); too few let an overloaded rate pass, since its queue has no time to grow")] = None,
    precision: Annotated[float, option(
        "--precision", panel=CAPACITY_PANEL, parser=percent, metavar="PCT",
        help="bisect until the bracket is narrower than this share of the capacity")] = C.precision,
    start_rate: Annotated[float, option(
        "--start-rate", panel=CAPACITY_PANEL, metavar="QPS", help="the first probe's rate; the search doubles or halves from it")]
    = C.start_rate,
    arrival: ProbeArrival = C.arrival,
    burstiness: Burstiness = C.burstiness,
    relative_to: Annotated[Optional[str], option(
        "--relative-to", panel=OUTPUT_PANEL, metavar="STRATEGY",
        help="show each capacity's ratio to this strategy's capacity")] = None,
    output: Output = C.output,
    export: Export = None,
    no_progress: NoProgress = False,
    **shared: Any,
) -> int:
    return capacity.cmd_capacity(CapacityOptions.from_flags(**flags(locals())))


@command("tune", help="find the strategy and token budget with the most capacity within an SLO: searched on the "
                     "calibrated sim, the best confirmed on the backend")
@model_flags
def tune_command(
    pg: RequestShape = None,
    len_spread: LenSpread = T.len_spread,
    workload: Workload = None,
    strategy: Strategy = None,
    chunk_size: Annotated[Optional[list[str]], option(
        "--chunk-size", "--token-budget", panel=TESTS_PANEL, callback=budgets, metavar="N[,N]|LO:HI:xF",
        help="token budgets: a list, or a range such as 64:4096:x2 (default: 128:4096:x2)")] = None,
    budget: Budget = None,
    cadence: Cadence = None,
    spec: Spec = None,
    concurrency: Annotated[int, option(
        "-c", "--concurrency", panel=TESTS_PANEL, help="cap on requests in flight; 0: none")] = T.concurrency,
    seed: Seed = T.seed,
    no_warmup: NoWarmup = False,
    slo: Annotated[Optional[str], option(
        "--slo", panel=CAPACITY_PANEL, metavar="KEY=MS[,MS...][,KEY=MS]",
        help="latency limits (ttft, tbt, tpot, e2e) at --percentile; one key may list values (tbt=50,100,200) "
        "for capacity against the SLO")] = None,
    percentile: Annotated[float, option(
        "--percentile", panel=CAPACITY_PANEL, metavar="P", help="the percentile the SLO limits")] = T.percentile,
    max_sched_delay: MaxSchedDelay = T.max_sched_delay,
    max_queue_growth: MaxQueueGrowth = T.max_queue_growth,
    requests: Annotated[Optional[int], option(
        "--requests", panel=CAPACITY_PANEL,
        help=f"requests per probe (default: {DEFAULT_REQUESTS_SIM} on the sim, {DEFAULT_REQUESTS} on real backends)")] = None,
    repeats: Annotated[Optional[int], option(
        "--repeats", panel=CAPACITY_PANEL,
        help="seeds per configuration, searched near the first one's capacity: the capacity's interval "
        "(default: 3 on the sim, 1 elsewhere)")] = None,
    precision: Annotated[Optional[float], option(
        "--precision", panel=CAPACITY_PANEL, parser=percent, metavar="PCT",
        help=f"bisect until the bracket is narrower than this percentage of the capacity "
        f"(default: {100 * DEFAULT_PRECISION:g})")] = None,
    start_rate: Annotated[Optional[float], option(
        "--start-rate", panel=CAPACITY_PANEL, metavar="QPS",
        help="the first probe's rate (default: on the sim, each strategy's throughput with every request in flight; "
        f"elsewhere {DEFAULT_START_RATE:g})")] = None,
    arrival: ProbeArrival = T.arrival,
    burstiness: Burstiness = T.burstiness,
    top_k: Annotated[Optional[int], option(
        "--top-k", panel=CAPACITY_PANEL,
        help=f"real backend: measure the sim's best K and sequential (default: {DEFAULT_TOP_K})")] = None,
    no_sim: Annotated[bool, flag("--no-sim", CAPACITY_PANEL, help="real backend: measure every configuration, no sim")] = False,
    full_grid: Annotated[bool, flag(
        "--full-grid", CAPACITY_PANEL, help="sim: search every configuration in full (default: a grid of 8 or more "
        "first drops, on short probes, those under 80% of the best)")] = False,
    sim_only: Annotated[bool, flag(
        "--sim-only", CAPACITY_PANEL, help="real backend: stop after the calibrated sim's prediction")] = False,
    calibrate_on: Annotated[Optional[str], option(
        "--calibrate-on", panel=CAPACITY_PANEL, metavar="server|gguf",
        help="a server's sim: calibrated by probing the server itself (default), or on the gguf backend stepping the "
        "same llama.cpp (llama-server only)")] = None,
    time_budget: Annotated[Optional[float], option(
        "--time-budget", panel=CAPACITY_PANEL, metavar="S",
        help="start no real-backend probe that would end after this many seconds")] = None,
    quick: Annotated[bool, flag(
        "--quick", CAPACITY_PANEL, help=f"a short preset: {' '.join(f'{k}={v}' for k, v in QUICK.items())}")] = False,
    jobs: Annotated[Optional[int], option("--jobs", panel=CAPACITY_PANEL, help="processes for the sim's grid (default: 2)")] = None,
    output: Annotated[str, option(
        "-o", "--output", panel=OUTPUT_PANEL, callback=choice(*TUNE_OUTPUTS), metavar="|".join(TUNE_OUTPUTS),
        help="format on stdout: md tables, csv or json (one record per configuration)")] = T.output,
    export: Annotated[Optional[str], option(
        "--export", panel=OUTPUT_PANEL, metavar="FILE", help="every configuration and probe: .json, .jsonl, or .csv (+ .probes.csv)")] = None,
    plot: Annotated[Optional[str], option("--plot", panel=OUTPUT_PANEL, metavar="DIR", help="write the charts here")] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", rich_help_panel=OUTPUT_PANEL, metavar="", show_default=False, help="the table's every column (intervals, the sim's errors, the slowed sim, probes) and "
        "the diagnostic lines (steps by kind, drift, the edge of the SLO); the export has them all")] = False,
    no_progress: NoProgress = False,
    gpus: Annotated[Optional[int], option(
        "--gpus", panel=DEPLOY_PANEL, metavar="N",
        help="sim: search both designs on N GPUs, colocated replicas (strategy x budget x TP) beside every "
        "prefill:decode split, by goodput per GPU under --slo at --attainment, and where one overtakes the other "
        "as the SLO tightens (docs/disaggregation.md)")] = None,
    attainment: Annotated[float, option(
        "--attainment", panel=DEPLOY_PANEL, parser=percent, metavar="PCT",
        help="--gpus: the share of requests that must meet every limit of --slo (DistServe's 90%)")] = 90.0,
    slo_scales: Annotated[Optional[list[str]], option(
        "--slo-scales", panel=DEPLOY_PANEL, callback=float_list, metavar="X[,X]",
        help="--gpus: the SLO's limits times each of these, for the crossover (default: 0.5,0.75,1,1.5,2,3)")] = None,
    prefill_strategy: Annotated[Optional[list[str]], option(
        "--prefill-strategy", panel=DEPLOY_PANEL, callback=str_list, metavar="NAME[,NAME]",
        help="--gpus: what the prefill instances run (default: sequential, whole prompts as DistServe's)")] = None,
    **shared: Any,
) -> int:
    options = TuneOptions.from_flags(**flags(locals()))
    return designs.run_designs(options) if options.gpus else tune.run_tune(options)


@command("ab", help="the working tree against a base commit, both measured here in one job; exit 1 on a regression")
def ab_command(
    base: Annotated[str, typer.Argument(
        metavar="BASE", show_default=False, help="the git ref to measure the working tree against (main, HEAD~1, a SHA)")],
    run_args: Annotated[Optional[list[str]], typer.Argument(
        metavar="[-- RUN_ARGS...]", show_default=False,
        help=f"the `prefillbench run` options both sides run (default: {' '.join(DEFAULT_PRESET)})")] = None,
    repo: Annotated[Path, typer.Option(metavar="DIR", help="the checkout whose working tree is the change")] = ABOptions.repo,
    metric: Annotated[Optional[list[str]], typer.Option(
        "--metric", callback=metrics_if_given, metavar="NAME[,NAME]",
        help=f"metrics to compare, repeatable (default: {','.join(AB_METRICS)})")] = None,
    gate: Annotated[Optional[list[str]], typer.Option(
        "--gate", callback=metrics_if_given, metavar="NAME[,NAME]",
        help=f"metrics whose regression fails the job (default: {','.join(DEFAULT_GATED)})")] = None,
    threshold: Annotated[float, typer.Option(
        parser=percent, metavar="PCT", help="a regression is worse than this, with an interval that excludes no change")] = ABOptions.threshold,
    confidence: Annotated[float, typer.Option(
        parser=percent, metavar="PCT", help="confidence of the table's intervals as a whole")] = 100 * ABOptions.confidence,
    min_rounds: Annotated[int, typer.Option(help="rounds (one run of each side) always run")] = ABOptions.min_rounds,
    max_rounds: Annotated[int, typer.Option(help="rounds at most, while a gated interval straddles the threshold")] = ABOptions.max_rounds,
    max_seconds: Annotated[float, typer.Option(help="start no round past --min-rounds that would end after this")] = ABOptions.max_seconds,
    out: Annotated[Optional[Path], typer.Option(metavar="DIR", help="keep every round's exports here")] = None,
    summary: Annotated[Optional[Path], typer.Option(metavar="FILE.md", help="write a markdown summary for a CI job page or PR comment")] = None,
) -> int:
    return ab.run_ab(ABOptions.from_flags(**locals()))


@command("calibrate", help="fit the sim's attainable fractions and step overhead to a real backend")
def calibrate_command(
    model: Model = None,
    backend: Annotated[str, option(
        "--backend", panel=MODEL_PANEL, callback=choice("torch", "gguf", "llama-server", "server"),
        metavar="torch|gguf|llama-server|server",
        help="real backend to measure; a server (llama-server, or server: --engine, --server-cmd or --url) is probed "
        "with requests whose steps are known")] = "torch",
    device: Device = B.device,
    dtype: DType = B.dtype,
    threads: Threads = None,
    server_bin: ServerBin = None,
    server_cmd: ServerCmd = None,
    engine: EngineName = None,
    url: Url = None,
    server_timeout: ServerTimeout = None,
    sim_model: Annotated[Optional[str], typer.Option(help="shapes for the sim (default: read from the real backend's model config)")] = None,
    sim_gpu: Annotated[Optional[str], typer.Option(help="nominal spec the fractions are relative to (default: cpu, or a spec file)")] = None,
    quick: Annotated[bool, flag("--quick", help="a smaller sweep")] = False,
    repeats: Annotated[int, typer.Option(help="timed repeats per sweep point; the median counts")] = CalibrateOptions.repeats,
    output: Annotated[str, typer.Option("--export", "--output", metavar="FILE", help="calibration file to write (as run's --export, a file; -o is a format everywhere)")] = CalibrateOptions.output,
    errors: Annotated[Optional[str], typer.Option(help="also write the per-step measured/predicted times here (.csv)")] = None,
    check: Annotated[bool, flag("--check", help="then run sequential and chunked on the real backend and on the "
                                 "calibrated sim and compare their throughput ratios")] = False,
    check_run: Annotated[str, typer.Option(
        callback=five_ints, metavar="P,N,C,R,CHUNK",
        help="the --check run: prompt, generation, concurrency, requests, chunk size")] = "192,16,4,8,64",
) -> int:
    return calibrate.cmd_calibrate(CalibrateOptions.from_flags(**locals()))


def main(argv: list[str] | None = None) -> int:
    """The console entry point; returns the exit status (tests call it with argv)."""
    try:
        status = app(args=argv, prog_name="prefillbench", standalone_mode=False)
    except typer.TyperException as e:  # the parser's own errors: unknown flag, bad value, missing argument
        ctx = getattr(e, "ctx", None)
        if ctx is not None and type(e).__name__ == "NoArgsIsHelpError":
            print(ctx.get_help(), file=sys.stderr)
            return 2
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        return fail(f"{e.format_message()}{hint}")
    return status or 0


if __name__ == "__main__":
    sys.exit(main())

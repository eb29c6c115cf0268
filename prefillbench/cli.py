"""prefillbench's command line (Typer), in llama-bench's conventions: the app and the flags, nothing else.

Short flags as llama-bench spells them (-p, -n, -c, -r, -s, -t, -ngl, -o), and list flags take
comma lists, repeated flags, or both (`-p 128,512 -p 1024`). Each option is declared once, as an
Annotated alias in its help panel's block below; a command lists the aliases it takes and hands
them, under their parameter names, to its options' `from_flags` (prefillbench.commands.options),
which validates them into one typed value for the command's handler (prefillbench.commands.<name>).
Adding a flag to `run` is therefore: one alias here, one parameter in `run`, one field in RunOptions,
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

from strategies import STRATEGIES

from prefillbench import __version__
from prefillbench.backends import BACKEND_CHOICES
from prefillbench.backends.base import BackendError
from prefillbench.bench.capacity import DEFAULT_REQUESTS, DEFAULT_REQUESTS_SIM, DEFAULT_START_RATE
from prefillbench.bench.cases import DEFAULT_OPEN_LOOP_REQUESTS
from prefillbench.bench.workloads import ARRIVALS
from prefillbench.commands import ab, calibrate, capacity, compare, plot, run, tune
from prefillbench.commands.options import (DEFAULT_PRESET, QUICK, TUNE_OUTPUTS, ABOptions, BackendOptions, CalibrateOptions,
                                           CapacityOptions, CompareOptions, PlotOptions, RunOptions, TuneOptions)
from prefillbench.commands.parsers import (budgets, choice, float_list, five_ints, int_list, lengths, metric_list, metrics_if_given,
                                           percent, pp_tg_pairs, slo_spec, str_list)
from prefillbench.commands.runner import error_prefix
from prefillbench.errors import UsageError
from prefillbench.report.ab import AB_METRICS, DEFAULT_GATED
from prefillbench.report.compare import METRICS
from prefillbench.report.plots import DEFAULT_OUT
from prefillbench.report.tables import OUTPUT_FORMATS

MODEL_PANEL, TESTS_PANEL, OUTPUT_PANEL = "model and backend", "tests", "output"
LOAD_PANEL, CAPACITY_PANEL = "arrivals and SLOs (serving)", "capacity search"
SIM_PANEL = "sim backend (--backend sim)"
DEVICES = ("auto", "cuda", "cpu")
DTYPES = ("float32", "bfloat16", "float16")


def _option(*names: str, panel: str | None = None, **kwargs: Any) -> Any:
    return typer.Option(*names, rich_help_panel=panel, **kwargs)


def _flag(name: str, panel: str | None = None, **kwargs: Any) -> Any:
    """An on/off flag, off unless given: `--no-warmup` is the parameter no_warmup=True."""
    return typer.Option(name, rich_help_panel=panel, metavar="", show_default=False, **kwargs)


# ---------------------------------------------------------------- options, by help panel
# model and backend
Model = Annotated[Optional[str], _option(
    "-m", "--model", panel=MODEL_PANEL,
    help="checkpoint folder, hub id or .gguf file (default: the shipped SmolLM2-135M-Instruct Q4_1)")]
BackendName = Annotated[str, _option(
    "--backend", panel=MODEL_PANEL, callback=choice(*BACKEND_CHOICES), metavar="|".join(BACKEND_CHOICES),
    help="auto: torch with CUDA, else gguf")]
Device = Annotated[str, _option(
    "--device", panel=MODEL_PANEL, callback=choice(*DEVICES), metavar="|".join(DEVICES), help="torch and gguf device")]
DType = Annotated[str, _option(
    "--dtype", panel=MODEL_PANEL, callback=choice(*DTYPES), metavar="|".join(DTYPES), help="torch dtype")]
Threads = Annotated[Optional[int], _option("-t", "--threads", panel=MODEL_PANEL, help="CPU threads (default: the library's choice)")]
GpuLayers = Annotated[Optional[int], _option("-ngl", "--n-gpu-layers", panel=MODEL_PANEL, help="gguf: layers to offload to the GPU")]
UBatch = Annotated[Optional[int], _option("--ubatch", panel=MODEL_PANEL, help="gguf: llama.cpp n_ubatch")]
NoCudaGraphs = Annotated[bool, _flag(
    "--no-cuda-graphs", MODEL_PANEL, help="torch on CUDA: run decode-only steps eagerly instead of replaying captured CUDA graphs")]
NoTuneLinear = Annotated[bool, _flag(
    "--no-tune-linear", MODEL_PANEL,
    help="torch: keep transformers' own linear layers instead of timing F.linear, matmuls and oneDNN per shape and row count")]
CompileDecode = Annotated[bool, _flag(
    "--compile", MODEL_PANEL,
    help="torch on CPU: run decode-only steps through inductor-compiled graphs (about 2 minutes to compile, before timing)")]
Kernels = Annotated[str, _option(
    "--kernels", panel=MODEL_PANEL, callback=choice("auto", "torch"), metavar="auto|torch",
    help="torch on CPU: auto, this package's C kernels where they build and beat torch when timed; torch, plain torch only")]
FlashAttn = Annotated[Optional[str], _option(
    "-fa", "--flash-attn", panel=MODEL_PANEL, callback=choice("on", "off", "auto"), metavar="on|off|auto",
    help="gguf: llama.cpp flash attention, llama-bench's values (default: auto, llama.cpp's choice: on on a CPU)")]

# sim backend (used only with --backend sim)
SimModel = Annotated[Optional[str], _option(
    "--sim-model", panel=SIM_PANEL, help="sim: model preset (llama-13b, llama-33b, llama-2-70b, mistral-7b, gpt3-175b) "
    "or a transformers config.json (default: llama-13b)")]
SimGpu = Annotated[Optional[str], _option(
    "--sim-gpu", panel=SIM_PANEL,
    help="sim: GPU preset (a6000, a100-sxm, a100-pcie, h100-sxm, h200) or a spec .yaml/.json (default: a6000)")]
TensorParallel = Annotated[int, _option(
    "--tp", panel=MODEL_PANEL,
    help="tensor-parallel ranks: torch runs one process per rank under torchrun (see the README's \"Past one machine\"); "
    "the sim predicts GPUs per stage")]
PipelineStages = Annotated[int, _option("--pp", panel=SIM_PANEL, help="sim: pipeline stages, run as a pipeline of micro-batches")]
Calibration = Annotated[Optional[str], _option(
    "--calibration", panel=SIM_PANEL, help="sim: calibration file written by `prefillbench calibrate`")]
Trace = Annotated[Optional[str], _option(
    "--trace", panel=SIM_PANEL, metavar="FILE", help="sim: write every step's per-operator cost breakdown here (JSONL)")]

# tests
NPrompt = Annotated[Optional[list[str]], _option(
    "-p", "--n-prompt", panel=TESTS_PANEL, callback=lengths, metavar="N[,N]",
    help="prompt lengths for pp tests (default: 512)")]
NGen = Annotated[Optional[list[str]], _option(
    "-n", "--n-gen", panel=TESTS_PANEL, callback=lengths, metavar="N[,N]",
    help="generation lengths for tg tests (default: 128)")]
PromptGen = Annotated[Optional[list[str]], _option(
    "--pg", panel=TESTS_PANEL, callback=pp_tg_pairs, metavar="PP,TG",
    help="combined prompt+generation test (repeatable)")]
Concurrency = Annotated[Optional[list[str]], _option(
    "-c", "--concurrency", panel=TESTS_PANEL, callback=int_list, metavar="N[,N]",
    help="requests in flight (default: 1,2,4)")]
Strategy = Annotated[Optional[list[str]], _option(
    "-s", "--strategy", panel=TESTS_PANEL, callback=str_list, metavar="NAME[,NAME]",
    # ", " so the help wraps between names instead of cutting the list at the terminal's edge
    help=f"strategies (default: {', '.join(STRATEGIES)})")]
ChunkSize = Annotated[Optional[list[str]], _option(
    "--chunk-size", "--token-budget", panel=TESTS_PANEL, callback=int_list, metavar="N[,N]",
    help="chunked's chunk size and sarathi-serve's token budget per step; one case per value (default: 256)")]
Repetitions = Annotated[Optional[int], _option(
    "-r", "--repetitions", panel=TESTS_PANEL,
    help="timed repetitions after a warm-up (default: 3 in a closed loop, 1 in an open loop, whose requests already vary)")]
Requests = Annotated[Optional[int], _option(
    "--requests", panel=TESTS_PANEL,
    help=f"requests per test (default: the concurrency in a closed loop, {DEFAULT_OPEN_LOOP_REQUESTS} in an open loop)")]
Seed = Annotated[int, _option("--seed", panel=TESTS_PANEL, help="seed of the random prompts")]
NoWarmup = Annotated[bool, _flag("--no-warmup", TESTS_PANEL, help="skip the untimed warm-up run")]
LenSpread = Annotated[float, _option(
    "--len-spread", panel=TESTS_PANEL, metavar="R",
    help="draw each request's prompt and generation lengths uniformly from [L(1-R), L(1+R)] (vLLM's --random-range-ratio)")]
Workload = Annotated[Optional[str], _option(
    "--workload", panel=TESTS_PANEL, metavar="FILE",
    help="replay a trace instead of -p/-n/--pg: CSV or JSON lines with prompt_len, gen_len and optional arrival_s "
    "(with arrival_s and no --arrival, its arrival times are replayed)")]

# arrivals and SLOs
Arrival = Annotated[Optional[str], _option(
    "--arrival", panel=LOAD_PANEL, metavar="|".join(ARRIVALS),
    help="closed: c requests in flight, each replaced when it finishes (default); poisson or gamma: requests arrive "
    "at --rate per second, -c caps those in flight (default: no cap) and the rest queue")]
Rate = Annotated[Optional[list[str]], _option(
    "--rate", panel=LOAD_PANEL, callback=float_list, metavar="QPS[,QPS]", help="arrival rates in requests/s, one row each")]
Burstiness = Annotated[float, _option(
    "--burstiness", panel=LOAD_PANEL, metavar="B",
    help="gamma arrivals: shape of the intervals (vLLM's convention: 1 is Poisson, below 1 burstier)")]
SLOOption = Annotated[Optional[str], _option(
    "--slo", panel=LOAD_PANEL, callback=slo_spec, metavar="ttft=MS,tpot=MS,tbt=MS,e2e=MS",
    help="latency objectives (any subset): adds goodput, the requests/s that met them all, and their share")]
Interleave = Annotated[bool, _flag(
    "--interleave", TESTS_PANEL,
    help="measure the strategies of each test and concurrency in turns (ABBA), so drift cancels out of their ratios")]

# capacity search (capacity, tune)
RequestShape = Annotated[Optional[list[str]], _option(
    "--pg", panel=TESTS_PANEL, callback=pp_tg_pairs, metavar="PP,TG",
    help="prompt and generation length of the requests (default: 512,128)")]
MaxSchedDelay = Annotated[float, _option(
    "--max-sched-delay", panel=CAPACITY_PANEL, metavar="MS",
    help="bound on the median scheduling delay (arrival to first step; Sarathi-Serve's criterion)")]
ProbeArrival = Annotated[str, _option(
    "--arrival", panel=CAPACITY_PANEL, callback=choice("poisson", "gamma"), metavar="poisson|gamma", help="arrival process")]

# output
Output = Annotated[str, _option(
    "-o", "--output", panel=OUTPUT_PANEL, callback=choice(*OUTPUT_FORMATS), metavar="|".join(OUTPUT_FORMATS),
    help="format on stdout: md table, grid (a terminal table), csv, json, jsonl")]
Export = Annotated[Optional[str], _option(
    "--export", panel=OUTPUT_PANEL, metavar="FILE",
    help="also write every field and the run metadata here (.csv, .json, .jsonl, .md); "
    "a .json/.jsonl export gets its per-request trace beside it as <name>.requests.jsonl")]
ExportRequests = Annotated[Optional[str], _option(
    "--export-requests", panel=OUTPUT_PANEL, metavar="FILE.jsonl",
    help="write each request's arrival and token times here (for plot)")]
RelativeTo = Annotated[Optional[str], _option(
    "--relative-to", panel=OUTPUT_PANEL, metavar="STRATEGY",
    help="show each row's ratios to this strategy's row of the same test and concurrency")]
NoisyCV = Annotated[float, _option(
    "--noisy-cv", panel=OUTPUT_PANEL, parser=percent, metavar="PCT",
    help="mark rows whose CV across repetitions exceeds this percentage as noisy")]
ResultsDir = Annotated[str, _option("--results-dir", panel=OUTPUT_PANEL, help="where each run writes <timestamp>.csv")]
NoResultsFile = Annotated[bool, _flag("--no-results-file", OUTPUT_PANEL, help="do not write results/<timestamp>.csv")]
Verify = Annotated[bool, _flag(
    "--verify", OUTPUT_PANEL,
    help="after the benchmark, feed every strategy the first strategy's tokens and compare their logits "
    "(max |Δlogit|, top-1 agreement) within the backend's tolerance; exit 1 on a disagreement")]
NoProgress = Annotated[bool, _flag("--no-progress", OUTPUT_PANEL, help="no progress bar on stderr")]
NoVerdict = Annotated[bool, _flag(
    "--no-verdict", OUTPUT_PANEL,
    help="no verdict under the table (each strategy against --relative-to or sequential, in sentences)")]


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
    version: Annotated[bool, _flag("--version", is_eager=True, callback=_version, help="print the version and exit")] = False,
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
    tp: TensorParallel = B.tp,
    pp: PipelineStages = B.pp,
    calibration: Calibration = None,
    trace: Trace = None,
) -> None:
    """The model-and-backend flags of run, capacity and tune, declared once (see model_flags)."""


def model_flags(fn: Callable[..., int]) -> Callable[..., int]:
    """A command whose `**shared` takes _model_and_backend's flags: Typer reads one signature, those flags first."""
    shared = inspect.signature(_model_and_backend, eval_str=True).parameters.values()
    own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.kind is not p.VAR_KEYWORD]

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
    no_verdict: Annotated[bool, _flag("--no-verdict", help="no sentence per metric on stderr, only the exit's summary")] = False,
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


@command("capacity", help="search each strategy's capacity: the highest Poisson request rate within a P99 TBT SLO "
                         "and a median scheduling delay bound (Sarathi-Serve's method)")
@model_flags
def capacity_command(
    pg: RequestShape = None,
    len_spread: LenSpread = C.len_spread,
    workload: Workload = None,
    strategy: Strategy = None,
    chunk_size: ChunkSize = None,
    concurrency: Annotated[int, _option(
        "-c", "--concurrency", panel=TESTS_PANEL,
        help="cap on requests in flight; 0: none (a bounded KV cache, as on the sim, still caps them)")] = C.concurrency,
    seed: Seed = C.seed,
    no_warmup: NoWarmup = False,
    slo: Annotated[Optional[str], _option(
        "--slo", panel=CAPACITY_PANEL, callback=slo_spec, metavar="tbt=MS[,ttft=MS,...]",
        help="tbt: the P99 TBT a rate must keep to (required); any other objective adds goodput to the rows")] = None,
    max_sched_delay: MaxSchedDelay = C.max_sched_delay,
    requests: Annotated[Optional[int], _option(
        "--requests", panel=CAPACITY_PANEL,
        help=f"requests per probe (default: {DEFAULT_REQUESTS_SIM} on the sim, {DEFAULT_REQUESTS} on "
        "real backends); too few let an overloaded rate pass, since its queue has no time to grow")] = None,
    precision: Annotated[float, _option(
        "--precision", panel=CAPACITY_PANEL, parser=percent, metavar="PCT",
        help="bisect until the bracket is narrower than this share of the capacity")] = C.precision,
    start_rate: Annotated[float, _option(
        "--start-rate", panel=CAPACITY_PANEL, metavar="QPS", help="the first probe's rate; the search doubles or halves from it")]
    = C.start_rate,
    arrival: ProbeArrival = C.arrival,
    burstiness: Burstiness = C.burstiness,
    relative_to: Annotated[Optional[str], _option(
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
    chunk_size: Annotated[Optional[list[str]], _option(
        "--chunk-size", "--token-budget", panel=TESTS_PANEL, callback=budgets, metavar="N[,N]|LO:HI:xF",
        help="token budgets: a list, or a range such as 64:4096:x2 (default: 128:4096:x2)")] = None,
    concurrency: Annotated[int, _option(
        "-c", "--concurrency", panel=TESTS_PANEL, help="cap on requests in flight; 0: none")] = T.concurrency,
    seed: Seed = T.seed,
    no_warmup: NoWarmup = False,
    slo: Annotated[Optional[str], _option(
        "--slo", panel=CAPACITY_PANEL, metavar="KEY=MS[,MS...][,KEY=MS]",
        help="latency limits (ttft, tbt, tpot, e2e) at --percentile; one key may list values (tbt=50,100,200) "
        "for capacity against the SLO")] = None,
    percentile: Annotated[float, _option(
        "--percentile", panel=CAPACITY_PANEL, metavar="P", help="the percentile the SLO limits")] = T.percentile,
    max_sched_delay: MaxSchedDelay = T.max_sched_delay,
    requests: Annotated[Optional[int], _option(
        "--requests", panel=CAPACITY_PANEL,
        help=f"requests per probe (default: {DEFAULT_REQUESTS_SIM} on the sim, {DEFAULT_REQUESTS} on real backends)")] = None,
    repeats: Annotated[Optional[int], _option(
        "--repeats", panel=CAPACITY_PANEL,
        help="seeds per configuration, searched near the first one's capacity: the capacity's interval "
        "(default: 3 on the sim, 1 elsewhere)")] = None,
    precision: Annotated[float, _option(
        "--precision", panel=CAPACITY_PANEL, parser=percent, metavar="PCT",
        help="bisect until the bracket is narrower than this percentage of the capacity")] = T.precision,
    start_rate: Annotated[Optional[float], _option(
        "--start-rate", panel=CAPACITY_PANEL, metavar="QPS",
        help="the first probe's rate (default: on the sim, each strategy's throughput with every request in flight; "
        f"elsewhere {DEFAULT_START_RATE:g})")] = None,
    arrival: ProbeArrival = T.arrival,
    burstiness: Burstiness = T.burstiness,
    top_k: Annotated[int, _option(
        "--top-k", panel=CAPACITY_PANEL, help="real backend: measure the sim's best K and sequential")] = T.top_k,
    no_sim: Annotated[bool, _flag("--no-sim", CAPACITY_PANEL, help="real backend: measure every configuration, no sim")] = False,
    sim_only: Annotated[bool, _flag(
        "--sim-only", CAPACITY_PANEL, help="real backend: stop after the calibrated sim's prediction")] = False,
    time_budget: Annotated[Optional[float], _option(
        "--time-budget", panel=CAPACITY_PANEL, metavar="S",
        help="start no real-backend probe that would end after this many seconds")] = None,
    quick: Annotated[bool, _flag(
        "--quick", CAPACITY_PANEL, help=f"a short preset: {' '.join(f'{k}={v}' for k, v in QUICK.items())}")] = False,
    jobs: Annotated[Optional[int], _option("--jobs", panel=CAPACITY_PANEL, help="processes for the sim's grid (default: 2)")] = None,
    output: Annotated[str, _option(
        "-o", "--output", panel=OUTPUT_PANEL, callback=choice(*TUNE_OUTPUTS), metavar="|".join(TUNE_OUTPUTS),
        help="format on stdout: md tables, csv or json (one record per configuration)")] = T.output,
    export: Annotated[Optional[str], _option(
        "--export", panel=OUTPUT_PANEL, metavar="FILE", help="every configuration and probe: .json, or .csv (+ .probes.csv)")] = None,
    plot: Annotated[Optional[str], _option("--plot", panel=OUTPUT_PANEL, metavar="DIR", help="write the charts here")] = None,
    no_progress: NoProgress = False,
    **shared: Any,
) -> int:
    return tune.run_tune(TuneOptions.from_flags(**flags(locals())))


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
    backend: Annotated[str, _option(
        "--backend", panel=MODEL_PANEL, callback=choice("torch", "gguf"), metavar="torch|gguf", help="real backend to measure")] = "torch",
    device: Device = B.device,
    dtype: DType = B.dtype,
    threads: Threads = None,
    sim_model: Annotated[Optional[str], typer.Option(help="shapes for the sim (default: read from the real backend's model config)")] = None,
    sim_gpu: Annotated[Optional[str], typer.Option(help="nominal spec the fractions are relative to (default: cpu, or a spec file)")] = None,
    quick: Annotated[bool, _flag("--quick", help="a smaller sweep")] = False,
    repeats: Annotated[int, typer.Option(help="timed repeats per sweep point; the median counts")] = CalibrateOptions.repeats,
    output: Annotated[str, typer.Option("--export", "--output", metavar="FILE", help="calibration file to write (as run's --export, a file; -o is a format everywhere)")] = CalibrateOptions.output,
    errors: Annotated[Optional[str], typer.Option(help="also write the per-step measured/predicted times here (.csv)")] = None,
    check: Annotated[bool, _flag("--check", help="then run sequential and chunked on the real backend and on the "
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

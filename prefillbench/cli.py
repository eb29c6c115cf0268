"""prefillbench's command line (Typer), in llama-bench's conventions.

Short flags as llama-bench spells them (-p, -n, -c, -r, -s, -t, -ngl, -o), and list flags take
comma lists, repeated flags, or both (`-p 128,512 -p 1024`). Each option is declared once, as an
Annotated alias in its help panel's block below; a command lists the aliases it takes, and `run`
hands every option on to `cmd_run` under its parameter name. Adding a flag to `run` is therefore:
one alias here, one parameter in `run`, and its use where it matters.
"""
from __future__ import annotations

import datetime as dt
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, Literal, Optional

import typer

from strategies import STRATEGIES

from prefillbench import __version__
from prefillbench.commands import ab as abtest
from prefillbench.bench import capacity
from prefillbench.report import capacity as capacity_report
from prefillbench.report import compare
from prefillbench.bench import interleave
from prefillbench.report import plots
from prefillbench.report import tables as reports
from prefillbench.report import traces
from prefillbench.backends import BACKEND_CHOICES, backend_class, choose_backend, load_backend
from prefillbench.backends.base import Backend, BackendError
from prefillbench.backends.distributed import is_rank_zero, process_rank
from prefillbench.bench.cases import DEFAULT_OPEN_LOOP_REQUESTS, BenchConfig, CaseResult, run_case, verify_logits
from prefillbench.commands.calibrate import calibrate_command
from prefillbench.commands import tune as tune_command
from prefillbench.meta import run_metadata
from prefillbench.bench.metrics import SLO, strategy_label
from prefillbench.sim_options import Calibration, PipelineStages, SimGpu, SimModel, TensorParallel, Trace, sim_options
from prefillbench.bench.workloads import ARRIVALS, TestSpec, load_workload, make_tests, workload_test

MODEL_PANEL, TESTS_PANEL, OUTPUT_PANEL = "model and backend", "tests", "output"
LOAD_PANEL, CAPACITY_PANEL = "arrivals and SLOs (serving)", "capacity search"


class UsageError(Exception):
    """Bad input on the command line: one line to stderr, exit 2."""


# ---------------------------------------------------------------- value parsers
# List options arrive as one string per use of the flag; these callbacks turn them into values
# and raise typer.BadParameter, which names the flag in its one-line message.


def _split(texts: list[str] | None) -> list[str]:
    return [v.strip() for text in texts or [] for v in text.split(",") if v.strip()]


def _number_list(texts: list[str] | None, convert: type, what: str) -> list | None:
    """Comma lists and repeated flags, flattened: ["128,512", "1024"] -> [128, 512, 1024]; None when not given."""
    if not texts:
        return None
    try:
        values = [convert(v) for v in _split(texts)]
    except ValueError:
        values = []
    if not values:
        raise typer.BadParameter(f"expected a comma-separated list of {what}, got {','.join(texts)!r}")
    return values


def int_list(texts: list[str] | None) -> list[int] | None:
    return _number_list(texts, int, "integers")


def lengths(texts: list[str] | None) -> list[int] | None:
    """-p and -n: token counts, where 0 skips that kind of test (llama-bench's rule) and below 0 is a mistake."""
    values = int_list(texts)
    for v in values or []:
        if v < 0:
            raise typer.BadParameter(f"a length cannot be negative, got {v}")
    return values


def str_list(texts: list[str] | None) -> list[str] | None:
    if not texts:
        return None
    if not _split(texts):
        raise typer.BadParameter(f"expected a comma-separated list of names, got {','.join(texts)!r}")
    return _split(texts)


def pp_tg_pairs(texts: list[str] | None) -> list[tuple[int, int]]:
    pairs = []
    for text in texts or []:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            values = []
        if len(values) != 2 or min(values) < 1:
            raise typer.BadParameter(f"expected PP,TG with both above 0, got {text!r}")
        pairs.append((values[0], values[1]))
    return pairs


def float_list(texts: list[str] | None) -> list[float] | None:
    return _number_list(texts, float, "numbers")


def slo_spec(text: str | None) -> SLO | None:
    if text is None or isinstance(text, SLO):
        return text
    try:
        return SLO.parse(text)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def percent(text: str | float) -> float:
    try:
        value = float(str(text).strip().rstrip("%"))
    except ValueError:
        raise typer.BadParameter(f"expected a percentage such as 10 or 10%, got {text!r}") from None
    if value < 0 or value != value:
        raise typer.BadParameter(f"expected a percentage of at least 0, got {text!r}")
    return value


def metric_list(texts: list[str] | None) -> list[str]:
    names = _split(texts)
    for n in names:
        if n not in compare.METRICS:
            raise typer.BadParameter(f"unknown metric {n!r}; choose from {', '.join(compare.METRICS)}")
    return list(dict.fromkeys(names)) or list(compare.DEFAULT_METRICS)


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
BackendName = Annotated[Literal[BACKEND_CHOICES], _option(
    "--backend", panel=MODEL_PANEL, help="auto: torch with CUDA, else gguf")]
Device = Annotated[Literal["auto", "cuda", "cpu"], _option("--device", panel=MODEL_PANEL, help="torch device")]
DType = Annotated[Literal["float32", "bfloat16", "float16"], _option("--dtype", panel=MODEL_PANEL, help="torch dtype")]
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
FlashAttn = Annotated[Optional[Literal["on", "off", "auto"]], _option(
    "-fa", "--flash-attn", panel=MODEL_PANEL,
    help="gguf: llama.cpp flash attention, llama-bench's values (default: auto, llama.cpp's choice: on on a CPU)")]

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
    help=f"strategies (default: {','.join(STRATEGIES)})")]
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
ProbeArrival = Annotated[Literal["poisson", "gamma"], _option("--arrival", panel=CAPACITY_PANEL, help="arrival process")]

# output
Output = Annotated[Literal[reports.OUTPUT_FORMATS], _option(
    "-o", "--output", panel=OUTPUT_PANEL, help="format on stdout: md table, grid (a terminal table), csv, json, jsonl")]
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


def _version(value: bool) -> None:
    if value:
        print(f"prefillbench {__version__}")
        raise typer.Exit()


app = typer.Typer(
    name="prefillbench",
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
            except (UsageError, BackendError, ValueError) as e:
                return fail(e)
            except KeyboardInterrupt:
                print("prefillbench: interrupted", file=sys.stderr)
                return 130

        app.command(name, help=help)(guarded)
        return fn

    return register


def error_prefix() -> str:
    """`prefillbench: error`, naming the rank under torchrun past rank 0.

    Every rank reports its own failure: one that only rank 1 hit must not go unseen.
    """
    return "prefillbench: error" if is_rank_zero() else f"prefillbench: error (rank {process_rank()})"


def fail(error: Exception | str) -> int:
    print(f"{error_prefix()}: {' '.join(str(error).split())}", file=sys.stderr)
    return 2


# ---------------------------------------------------------------- commands


@command("run", help="run the benchmark and print a table")
def run(
    model: Model = None,
    backend: BackendName = "auto",
    device: Device = "auto",
    dtype: DType = "float32",
    threads: Threads = None,
    n_gpu_layers: GpuLayers = None,
    ubatch: UBatch = None,
    flash_attn: FlashAttn = None,
    no_cuda_graphs: NoCudaGraphs = False,
    no_tune_linear: NoTuneLinear = False,
    compile_decode: CompileDecode = False,
    sim_model: SimModel = None,
    sim_gpu: SimGpu = None,
    tp: TensorParallel = 1,
    pp: PipelineStages = 1,
    calibration: Calibration = None,
    trace: Trace = None,
    n_prompt: NPrompt = None,
    n_gen: NGen = None,
    pg: PromptGen = None,
    concurrency: Concurrency = None,
    strategy: Strategy = None,
    chunk_size: ChunkSize = None,
    repetitions: Repetitions = None,
    requests: Requests = None,
    seed: Seed = 42,
    no_warmup: NoWarmup = False,
    len_spread: LenSpread = 0.0,
    workload: Workload = None,
    arrival: Arrival = None,
    rate: Rate = None,
    burstiness: Burstiness = 1.0,
    slo: SLOOption = None,
    interleave: Interleave = False,
    output: Output = "md",
    export: Export = None,
    export_requests: ExportRequests = None,
    relative_to: RelativeTo = None,
    noisy_cv: NoisyCV = 10.0,
    results_dir: ResultsDir = "results",
    no_results_file: NoResultsFile = False,
    verify: Verify = False,
    no_progress: NoProgress = False,
) -> int:
    # Every option reaches cmd_run under its parameter name.
    return cmd_run(SimpleNamespace(**locals()))


@command("compare", help="compare two exported runs; exit 1 on a regression beyond --threshold")
def compare_command(
    base: Annotated[str, typer.Argument(metavar="BASE", help="the reference export (.csv, .json or .jsonl)", show_default=False)],
    current: Annotated[str, typer.Argument(metavar="CURRENT", help="the export to check against it", show_default=False)],
    metric: Annotated[Optional[list[str]], typer.Option(
        "--metric", callback=metric_list, metavar="NAME[,NAME]",
        help=f"metrics to compare and gate, repeatable: {', '.join(compare.METRICS)} (default: throughput)")] = None,
    threshold: Annotated[float, typer.Option(
        parser=percent, metavar="PCT", help="exit 1 when a row is worse by more than this percentage")] = compare.DEFAULT_THRESHOLD,
    relative_to: Annotated[Optional[str], typer.Option(
        metavar="STRATEGY", help="compare each row's ratio to this strategy's row of the same file (e.g. sequential)")] = None,
    noisy_cv: Annotated[float, typer.Option(
        parser=percent, metavar="PCT", help="mark rows whose CV across repetitions exceeds this")] = 100 * compare.DEFAULT_NOISY_CV,
    output: Annotated[Literal[reports.OUTPUT_FORMATS], typer.Option("-o", "--output", help="format on stdout")] = "md",
) -> int:
    return compare.cmd_compare(SimpleNamespace(**locals()))


@command("plot", help="write PNG charts from exported results and per-request traces")
def plot_command(
    files: Annotated[list[str], typer.Argument(
        metavar="FILE...", show_default=False,
        help="result exports (.csv, .json, .jsonl) and per-request traces (.requests.jsonl); X.requests.jsonl beside X.json[l] is read too")],
    out: Annotated[str, typer.Option(metavar="DIR", help="where the PNG files go")] = plots.DEFAULT_OUT,
) -> int:
    return plots.cmd_plot(SimpleNamespace(**locals()))


@command("capacity", help="search each strategy's capacity: the highest Poisson request rate within a P99 TBT SLO "
                         "and a median scheduling delay bound (Sarathi-Serve's method)")
def capacity_command(
    model: Model = None,
    backend: BackendName = "auto",
    device: Device = "auto",
    dtype: DType = "float32",
    threads: Threads = None,
    n_gpu_layers: GpuLayers = None,
    ubatch: UBatch = None,
    flash_attn: FlashAttn = None,
    no_cuda_graphs: NoCudaGraphs = False,
    no_tune_linear: NoTuneLinear = False,
    compile_decode: CompileDecode = False,
    sim_model: SimModel = None,
    sim_gpu: SimGpu = None,
    tp: TensorParallel = 1,
    pp: PipelineStages = 1,
    calibration: Calibration = None,
    trace: Trace = None,
    pg: RequestShape = None,
    len_spread: LenSpread = 0.0,
    workload: Workload = None,
    strategy: Strategy = None,
    chunk_size: ChunkSize = None,
    concurrency: Annotated[int, _option(
        "-c", "--concurrency", panel=TESTS_PANEL,
        help="cap on requests in flight; 0: none (a bounded KV cache, as on the sim, still caps them)")] = 0,
    seed: Seed = 42,
    no_warmup: NoWarmup = False,
    slo: Annotated[Optional[str], _option(
        "--slo", panel=CAPACITY_PANEL, callback=slo_spec, metavar="tbt=MS[,ttft=MS,...]",
        help="tbt: the P99 TBT a rate must keep to (required); any other objective adds goodput to the rows")] = None,
    max_sched_delay: MaxSchedDelay = capacity.DEFAULT_MAX_SCHED_DELAY_MS,
    requests: Annotated[Optional[int], _option(
        "--requests", panel=CAPACITY_PANEL,
        help=f"requests per probe (default: {capacity.DEFAULT_REQUESTS_SIM} on the sim, {capacity.DEFAULT_REQUESTS} on "
        "real backends); too few let an overloaded rate pass, since its queue has no time to grow")] = None,
    precision: Annotated[float, _option(
        "--precision", panel=CAPACITY_PANEL, parser=percent, metavar="PCT",
        help="bisect until the bracket is narrower than this share of the capacity")] = 100 * capacity.DEFAULT_PRECISION,
    start_rate: Annotated[float, _option(
        "--start-rate", panel=CAPACITY_PANEL, metavar="QPS", help="the first probe's rate; the search doubles or halves from it")]
    = capacity.DEFAULT_START_RATE,
    arrival: ProbeArrival = "poisson",
    burstiness: Burstiness = 1.0,
    relative_to: Annotated[Optional[str], _option(
        "--relative-to", panel=OUTPUT_PANEL, metavar="STRATEGY",
        help="show each capacity's ratio to this strategy's capacity")] = None,
    output: Output = "md",
    export: Export = None,
    no_progress: NoProgress = False,
) -> int:
    return cmd_capacity(SimpleNamespace(**locals()))


def _budgets(texts: list[str] | None) -> list[int] | None:
    if not texts:
        return None
    try:
        return tune_command.tune.parse_budgets(texts)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


@command("tune", help="find the strategy and token budget with the most capacity within an SLO: searched on the "
                     "calibrated sim, the best confirmed on the backend")
def tune_cli(
    model: Model = None,
    backend: BackendName = "auto",
    device: Device = "auto",
    dtype: DType = "float32",
    threads: Threads = None,
    n_gpu_layers: GpuLayers = None,
    ubatch: UBatch = None,
    flash_attn: FlashAttn = None,
    no_cuda_graphs: NoCudaGraphs = False,
    no_tune_linear: NoTuneLinear = False,
    compile_decode: CompileDecode = False,
    sim_model: SimModel = None,
    sim_gpu: SimGpu = None,
    tp: TensorParallel = 1,
    pp: PipelineStages = 1,
    calibration: Calibration = None,
    trace: Trace = None,
    pg: RequestShape = None,
    len_spread: LenSpread = 0.0,
    workload: Workload = None,
    strategy: Strategy = None,
    chunk_size: Annotated[Optional[list[str]], _option(
        "--chunk-size", "--token-budget", panel=TESTS_PANEL, callback=_budgets, metavar="N[,N]|LO:HI:xF",
        help="token budgets: a list, or a range such as 64:4096:x2 (default: 128:4096:x2)")] = None,
    concurrency: Annotated[int, _option(
        "-c", "--concurrency", panel=TESTS_PANEL, help="cap on requests in flight; 0: none")] = 0,
    seed: Seed = 42,
    no_warmup: NoWarmup = False,
    slo: Annotated[Optional[str], _option(
        "--slo", panel=CAPACITY_PANEL, metavar="KEY=MS[,MS...][,KEY=MS]",
        help="latency limits (ttft, tbt, tpot, e2e) at --percentile; one key may list values (tbt=50,100,200) "
        "for capacity against the SLO")] = None,
    percentile: Annotated[float, _option(
        "--percentile", panel=CAPACITY_PANEL, metavar="P", help="the percentile the SLO limits")] = 99.0,
    max_sched_delay: MaxSchedDelay = capacity.DEFAULT_MAX_SCHED_DELAY_MS,
    requests: Annotated[Optional[int], _option(
        "--requests", panel=CAPACITY_PANEL,
        help=f"requests per probe (default: {capacity.DEFAULT_REQUESTS_SIM} on the sim, {capacity.DEFAULT_REQUESTS} on real backends)")] = None,
    repeats: Annotated[Optional[int], _option(
        "--repeats", panel=CAPACITY_PANEL,
        help="seeds per configuration, searched near the first one's capacity: the capacity's interval (default: 3 on the sim, 1 elsewhere)")] = None,
    precision: Annotated[float, _option(
        "--precision", panel=CAPACITY_PANEL, parser=percent, metavar="PCT",
        help="bisect until the bracket is narrower than this percentage of the capacity")] = 100 * capacity.DEFAULT_PRECISION,
    start_rate: Annotated[float, _option(
        "--start-rate", panel=CAPACITY_PANEL, metavar="QPS", help="the first probe's rate")] = capacity.DEFAULT_START_RATE,
    arrival: ProbeArrival = "poisson",
    burstiness: Burstiness = 1.0,
    top_k: Annotated[int, _option("--top-k", panel=CAPACITY_PANEL, help="real backend: measure the sim's best K and sequential")] = 3,
    no_sim: Annotated[bool, _flag("--no-sim", CAPACITY_PANEL, help="real backend: measure every configuration, no sim")] = False,
    sim_only: Annotated[bool, _flag("--sim-only", CAPACITY_PANEL, help="real backend: stop after the calibrated sim's prediction")] = False,
    time_budget: Annotated[Optional[float], _option(
        "--time-budget", panel=CAPACITY_PANEL, metavar="S", help="start no real-backend probe that would end after this many seconds")] = None,
    quick: Annotated[bool, _flag("--quick", CAPACITY_PANEL, help=f"a short preset: {' '.join(f'{k}={v}' for k, v in tune_command.QUICK.items())}")] = False,
    jobs: Annotated[Optional[int], _option("--jobs", panel=CAPACITY_PANEL, help="processes for the sim's grid (default: 2)")] = None,
    output: Output = "md",
    export: Annotated[Optional[str], _option(
        "--export", panel=OUTPUT_PANEL, metavar="FILE", help="every configuration and probe: .json, or .csv (+ .probes.csv)")] = None,
    plot: Annotated[Optional[str], _option("--plot", panel=OUTPUT_PANEL, metavar="DIR", help="write the charts here")] = None,
    no_progress: NoProgress = False,
) -> int:
    args = SimpleNamespace(**locals())
    tests = tests_from_args(SimpleNamespace(n_prompt=None, n_gen=None, pg=pg or [(512, 128)], arrival="poisson",
                                            len_spread=len_spread, workload=workload))
    if len(tests) != 1:
        raise UsageError("tune searches one test: give one --pg or a --workload")
    options = tune_command.TuneOptions(
        load=_load_backend, backend_args=args, pg=pg[0] if pg else None, len_spread=len_spread,
        workload_test=tests[0] if workload else None, strategies=strategy, budgets=chunk_size,
        concurrency=concurrency, seed=seed, warmup=not no_warmup, slo=slo, percentile=percentile,
        max_sched_delay=max_sched_delay, requests=requests, precision=precision, start_rate=start_rate, arrival=arrival,
        burstiness=burstiness, repeats=repeats, top_k=top_k, no_sim=no_sim, sim_only=sim_only,
        calibration=calibration if backend != "sim" else None, time_budget=time_budget, quick=quick, jobs=jobs,
        output=output, export=export, plot=plot, progress=not no_progress)
    return tune_command.run_tune(options)


def _metrics_if_given(texts: list[str] | None) -> list[str] | None:
    return metric_list(texts) if texts else None


@command("ab", help="the working tree against a base commit, both measured here in one job; exit 1 on a regression")
def ab_command(
    base: Annotated[str, typer.Argument(
        metavar="BASE", show_default=False, help="the git ref to measure the working tree against (main, HEAD~1, a SHA)")],
    run_args: Annotated[Optional[list[str]], typer.Argument(
        metavar="[-- RUN_ARGS...]", show_default=False,
        help=f"the `prefillbench run` options both sides run (default: {' '.join(abtest.DEFAULT_PRESET)})")] = None,
    repo: Annotated[Path, typer.Option(metavar="DIR", help="the checkout whose working tree is the change")] = Path("."),
    metric: Annotated[Optional[list[str]], typer.Option(
        "--metric", callback=_metrics_if_given, metavar="NAME[,NAME]",
        help=f"metrics to compare, repeatable (default: {','.join(abtest.AB_METRICS)})")] = None,
    gate: Annotated[Optional[list[str]], typer.Option(
        "--gate", callback=_metrics_if_given, metavar="NAME[,NAME]",
        help=f"metrics whose regression fails the job (default: {','.join(abtest.DEFAULT_GATED)})")] = None,
    threshold: Annotated[float, typer.Option(
        parser=percent, metavar="PCT", help="a regression is worse than this, with an interval that excludes no change")] = abtest.DEFAULT_THRESHOLD,
    confidence: Annotated[float, typer.Option(
        parser=percent, metavar="PCT", help="confidence of the table's intervals as a whole")] = 100 * abtest.stats.DEFAULT_CONFIDENCE,
    min_rounds: Annotated[int, typer.Option(help="rounds (one run of each side) always run")] = abtest.DEFAULT_MIN_ROUNDS,
    max_rounds: Annotated[int, typer.Option(help="rounds at most, while a gated interval straddles the threshold")] = abtest.DEFAULT_MAX_ROUNDS,
    max_seconds: Annotated[float, typer.Option(help="start no round past --min-rounds that would end after this")] = abtest.DEFAULT_MAX_SECONDS,
    out: Annotated[Optional[Path], typer.Option(metavar="DIR", help="keep every round's exports here")] = None,
    summary: Annotated[Optional[Path], typer.Option(metavar="FILE.md", help="write a markdown summary for a CI job page or PR comment")] = None,
) -> int:
    metrics = metric or list(abtest.AB_METRICS)
    options = abtest.ABOptions(
        base_ref=base, preset=list(run_args or abtest.DEFAULT_PRESET), repo=repo, metrics=metrics,
        gated=gate or [m for m in abtest.DEFAULT_GATED if m in metrics], threshold=threshold, confidence=confidence / 100,
        min_rounds=min_rounds, max_rounds=max_rounds, max_seconds=max_seconds, out=out, summary=summary,
    )
    try:
        return abtest.run_ab(options)
    except abtest.SideFailed as e:
        return fail(e)


command("calibrate", help="fit the sim's attainable fractions and step overhead to a real backend")(calibrate_command)


# ---------------------------------------------------------------- run


def config_from_args(args: Any) -> BenchConfig:
    strategies = args.strategy or list(STRATEGIES)
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise UsageError(f"unknown strategy {unknown[0]!r}; choose from {', '.join(STRATEGIES)}")
    tests = tests_from_args(args)
    arrival = args.arrival or ("trace" if tests and tests[0].workload and tests[0].workload.arrivals else "closed")
    if arrival not in ARRIVALS + ("trace",):
        raise UsageError(f"--arrival {arrival}: choose from {', '.join(ARRIVALS)}")
    open_loop = arrival != "closed"
    config = BenchConfig(
        tests=tests,
        strategies=list(dict.fromkeys(strategies)),
        concurrency=args.concurrency or ([0] if open_loop else [1, 2, 4]),
        chunk_sizes=args.chunk_size or [256],
        repetitions=args.repetitions or (1 if open_loop else 3),
        requests=args.requests,
        seed=args.seed,
        warmup=not args.no_warmup,
        arrival=arrival,
        rates=args.rate or [],
        burstiness=args.burstiness,
        slo=args.slo,
    )
    try:
        config.validate()
    except ValueError as e:
        raise UsageError(str(e)) from None
    return config


def tests_from_args(args: Any) -> list[TestSpec]:
    """-p/-n/--pg with --len-spread, or the one test a --workload file makes.

    In an open loop, --pg alone means just that test: pp-only and tg-only requests are not what a server sees.
    """
    try:
        if args.workload:
            if args.n_prompt or args.n_gen or args.pg or args.len_spread:
                raise UsageError("--workload gives the lengths: drop -p, -n, --pg and --len-spread")
            return [workload_test(load_workload(args.workload))]
        defaults = not (args.pg and args.arrival not in (None, "closed"))
        return make_tests(args.n_prompt or ([512] if defaults else []), args.n_gen or ([128] if defaults else []),
                          args.pg or [], args.len_spread)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
        TimeElapsedColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), disable=not enabled, transient=True,
    )


def cmd_run(args: Any) -> int:
    config = config_from_args(args)
    if args.export:
        try:
            reports.format_for_path(args.export)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if args.relative_to and args.relative_to not in config.strategies:
        raise UsageError(f"--relative-to {args.relative_to}: not among the strategies run ({', '.join(config.strategies)})")
    trace_path = args.export_requests or (traces.trace_path_for(args.export) if args.export else None)
    if args.export_requests and not args.export_requests.endswith((".jsonl", ".ndjson")):
        raise UsageError(f"--export-requests writes JSON lines: use a .jsonl name, not {args.export_requests}")
    # Under torchrun every rank runs the same cases; rank 0 alone prints, writes and shows progress.
    rank_zero = is_rank_zero()
    results_path = None if args.no_results_file else Path(args.results_dir) / f"{dt.datetime.now():%Y%m%d-%H%M%S}.csv"
    if not rank_zero:
        args.export = trace_path = results_path = None
    for path in (args.export, trace_path, results_path):
        if path:
            reports.check_writable(path)
    check_sequence_limit(choose_backend(args.backend, args.model, args.tp), config)
    backend = _load_backend(args)
    if args.verify and backend.logit_tolerance() is None:
        raise UsageError(f"--verify compares logits, and the {backend.name} backend computes none")
    longest = max(t.max_seq_len for t in config.tests)
    if longest > backend.context_length:
        raise UsageError(f"a test needs {longest} positions but the model's context is {backend.context_length}")

    results: list[CaseResult] = []
    interrupted = False
    failure: BackendError | None = None
    progress = _progress(not args.no_progress and rank_zero)
    with progress:
        task = progress.add_task("", total=config.tokens_to_emit())
        try:
            if args.interleave:
                on_group = lambda label: progress.update(task, description=label)  # noqa: E731
                for result in interleave.run_interleaved(backend, config, lambda n: progress.advance(task, n), on_group):
                    results.append(result)
            for case in ([] if args.interleave else config.cases()):
                label = f"{case.test.name} {case.strategy} c={case.concurrency}"
                if case.rate is not None:
                    label += f" {case.rate:g} req/s"
                progress.update(task, description=label)
                results.append(run_case(backend, case, config, on_token=lambda n: progress.advance(task, n)))
        except KeyboardInterrupt:
            interrupted = True
        except BackendError as e:
            # A step that fails (llama.cpp out of KV space, ...) ends the run, not the rows before it.
            failure = e
    rows = [r.row for r in results]
    write_failure = None
    meta = run_metadata(backend.metadata())
    meta.update(model_path=args.model or "default", backend_name=backend.name, device=backend.device,
                **workload_settings(args))
    if rows and rank_zero:
        if args.relative_to:
            sys.stdout.write(compare.render_relative(args.output, rows, meta, args.relative_to, args.noisy_cv / 100))
        else:
            sys.stdout.write(reports.render(args.output, rows, meta, args.noisy_cv / 100))
        sys.stdout.flush()
        write_failure = write_outputs(args.export, trace_path, results_path, results, meta)
    if write_failure is not None:
        print(f"prefillbench: error: {write_failure} (the {len(rows)} measured row(s) are on stdout)", file=sys.stderr)
    if interrupted:
        print(f"prefillbench: interrupted; kept {len(rows)} measured row(s)", file=sys.stderr)
        return 130
    if failure is not None:
        print(f"{error_prefix()}: {failure} (kept {len(rows)} measured row(s))", file=sys.stderr)
        return 2
    if write_failure is not None:
        return 2
    if args.verify:
        return run_verify(backend, config, not args.no_progress and rank_zero)
    return 0


def run_verify(backend: Any, config: BenchConfig, show_progress: bool) -> int:
    """The teacher-forced logit comparison, reported on stderr: 0 if every strategy agrees, else 1.

    Under torchrun every rank computes it (the steps need all ranks); rank 0 alone reports it.
    """
    progress = _progress(show_progress)
    with progress:
        task = progress.add_task("verify")
        try:
            agreements = verify_logits(backend, config, on_case=lambda label: progress.update(task, description=label))
        except BackendError as e:
            print(f"{error_prefix()}: verify: {e}", file=sys.stderr)
            return 2
    failed = [a for a in agreements if not a.passed]
    if is_rank_zero():
        sys.stderr.write(reports.render_verify(agreements))
        if failed:
            print(f"verify: {len(failed)} of {len(agreements)} comparisons disagree beyond tolerance", file=sys.stderr)
        else:
            print(f"verify: all {len(agreements)} comparisons agree within tolerance", file=sys.stderr)
    return 1 if failed else 0


def check_sequence_limit(backend_name: str, config: BenchConfig) -> None:
    """Refuse a -c the backend cannot hold, before loading a model to find out."""
    limit = backend_class(backend_name).sequence_limit
    most = max(config.concurrency)
    if limit is not None and most > limit:
        raise UsageError(f"-c {most}: the {backend_name} backend runs at most {limit} sequences at once")


def cmd_capacity(args: Any) -> int:
    if args.slo is None or args.slo.tbt_ms is None:
        raise UsageError("capacity needs --slo tbt=MS: the highest rate whose P99 time between tokens stays within it")
    tests = tests_from_args(SimpleNamespace(n_prompt=None, n_gen=None, pg=args.pg or [(512, 128)], arrival=args.arrival,
                                            len_spread=args.len_spread, workload=args.workload))
    if len(tests) != 1:
        raise UsageError("capacity searches one test: give one --pg or a --workload")
    strategies = list(dict.fromkeys(args.strategy or list(STRATEGIES)))
    if args.relative_to and args.relative_to not in strategies:
        raise UsageError(f"--relative-to {args.relative_to}: not among the strategies searched ({', '.join(strategies)})")
    check_precision(args.precision)
    if args.export:
        reports.format_for_path(args.export)
    rank_zero = is_rank_zero()  # under torchrun rank 0 alone prints, writes and shows progress, as in run
    if not rank_zero:
        args.export = None
    if args.export:
        reports.check_writable(args.export)
    loaded = _load_backend(args)
    config = capacity.CapacityConfig(
        tests[0], strategies, args.chunk_size or [256],
        capacity.Criteria(args.slo.tbt_ms, args.max_sched_delay),
        requests=args.requests or (capacity.DEFAULT_REQUESTS_SIM if loaded.name == "sim" else capacity.DEFAULT_REQUESTS),
        concurrency=args.concurrency, arrival=args.arrival, burstiness=args.burstiness, seed=args.seed,
        start_rate=args.start_rate, precision=args.precision / 100, warmup=not args.no_warmup, slo=args.slo,
    )
    config.validate()
    if tests[0].max_seq_len > loaded.context_length:
        raise UsageError(f"a request needs {tests[0].max_seq_len} positions but the model's context is {loaded.context_length}")

    results: list[capacity.CapacityResult] = []
    interrupted, failure = False, None
    progress = _progress(not args.no_progress and rank_zero)
    with progress:
        task = progress.add_task("", total=config.requests)

        def started(case, n: int, rate: float) -> None:
            progress.reset(task, total=config.tokens_per_probe(), description=f"{strategy_label(case.strategy, case.chunk_size)} probe {n}: {rate:.3g} req/s")

        def done(case, probe: capacity.Probe) -> None:
            if not rank_zero:
                return
            r = probe.row
            progress.console.print(
                f"capacity: {strategy_label(case.strategy, case.chunk_size)} at {probe.rate:.3g} req/s: P99 TBT {r.tbt_p99_ms:.1f} ms, median "
                f"scheduling delay {r.sched_delay_p50_ms:.0f} ms: {'within' if probe.passed else 'over'}", highlight=False, soft_wrap=True)

        finished: list[capacity.Probe] = []  # the current case's probes, kept if the search stops midway

        def done_and_kept(case, probe: capacity.Probe) -> None:
            finished.append(probe)
            done(case, probe)

        case = None
        try:
            for case in config.cases():
                finished.clear()
                results.append(capacity.find_capacity(loaded, case, config, started, done_and_kept,
                                                      lambda n: progress.advance(task, n)))
                case = None
        except KeyboardInterrupt:
            interrupted = True
        except BackendError as e:
            failure = e
        if case is not None and finished:
            results.append(capacity.CapacityResult(case, capacity.SearchResult.partial(finished)))
    rows = [r.row for r in results]
    meta = run_metadata(loaded.metadata())
    meta.update(model_path=args.model or "default", backend_name=loaded.name, device=loaded.device,
                **workload_settings(args), **config.settings())
    if rows and rank_zero:
        text = capacity_report.render_md(results, args.relative_to) if args.output == "md" else reports.render(args.output, rows, meta)
        sys.stdout.write(text)
        best = capacity_report.best_line(results, config.criteria.describe(), config.precision, args.relative_to or "sequential")
        # After the table on stdout; on stderr when stdout carries csv or json, which must stay parseable.
        print(best, file=sys.stdout if args.output == "md" else sys.stderr)
        sys.stdout.flush()
        if args.export:
            reports.export(args.export, rows, meta)
    if interrupted:
        print(f"prefillbench: interrupted; kept {len(rows)} capacity row(s)", file=sys.stderr)
        return 130
    if failure is not None:
        print(f"{error_prefix()}: {failure} (kept {len(rows)} capacity row(s))", file=sys.stderr)
        return 2
    return 0


def check_precision(pct: float) -> None:
    """--precision is a percentage of the capacity: 5 means bisect to within 5%."""
    if not 0 < pct < 100:
        raise UsageError(f"--precision is a percentage of the capacity between 0 and 100 (5 means 5%), got {pct:g}")


def _load_backend(args: Any) -> Backend:
    options = {k: v for k, v in (("n_gpu_layers", args.n_gpu_layers), ("n_ubatch", args.ubatch),
                                 ("flash_attn", args.flash_attn)) if v is not None}
    if args.no_cuda_graphs:
        options["cuda_graphs"] = False
    if args.no_tune_linear:
        options["tune_linear"] = False
    if args.compile_decode:
        options["compile_decode"] = True
    options.update(tp=args.tp, pp=args.pp)
    options.update(sim_options(args))
    backend = load_backend(args.backend, args.model, device=args.device, dtype=args.dtype, threads=args.threads, **options)
    if is_rank_zero():
        print(f"prefillbench: {backend.model_name} on {backend.label}, weights: {backend.weights}", file=sys.stderr)
    return backend


def workload_settings(args: Any) -> dict[str, Any]:
    """What made the requests, for the export's metadata (arrival, rate and SLO are columns of every row)."""
    return {"seed": args.seed, "len_spread": args.len_spread, "workload": args.workload or ""}


def write_outputs(export: str | None, trace_path: str | Path | None, results_path: Path | None,
                  results: list[CaseResult], meta: dict[str, Any]) -> str | None:
    """Write the run's files; the reason, in one line, if one could not be written (the rows are on stdout)."""
    rows = [r.row for r in results]
    try:
        if export:
            reports.export(export, rows, meta)
        if trace_path:
            traces.export_traces(trace_path, results)
        if results_path:
            reports.export(results_path, rows, meta)
            print(f"prefillbench: wrote {results_path}", file=sys.stderr)
    except OSError as e:
        return f"cannot write {e.filename or 'a results file'}: {e.strerror or e}"
    return None


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

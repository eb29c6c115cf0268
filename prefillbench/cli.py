"""prefillbench's command line, in llama-bench's conventions."""
from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from strategies import STRATEGIES

from . import compare, interleave, plots, reports, traces
from .backends import BACKEND_CHOICES, load_backend
from .backends.base import BackendError
from .bench import BenchConfig, CaseResult, run_case, verify
from .meta import run_metadata
from .sim.cli import add_calibrate_parser, add_sim_arguments, cmd_calibrate, sim_options
from .workloads import make_tests


class UsageError(Exception):
    """Bad input on the command line: one line to stderr, exit 2."""


def int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}") from None


def pp_tg_pair(text: str) -> tuple[int, int]:
    values = int_list(text)
    if len(values) != 2 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected PP,TG with both above 0, got {text!r}")
    return values[0], values[1]


def str_list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _flatten(lists):
    return [v for values in lists for v in values]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prefillbench", description="Measure how LLM engines should schedule prefill against decode.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the benchmark and print a table")
    model = run.add_argument_group("model and backend")
    model.add_argument("-m", "--model", help="checkpoint folder, hub id or .gguf file (default: the shipped SmolLM2-135M-Instruct Q4_1)")
    model.add_argument("--backend", choices=BACKEND_CHOICES, default="auto", help="auto: torch with CUDA, else gguf (default: auto)")
    model.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"), help="torch device (default: auto)")
    model.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="torch dtype (default: float32)")
    model.add_argument("-t", "--threads", type=int, help="CPU threads (default: the library's choice)")
    model.add_argument("-ngl", "--n-gpu-layers", type=int, default=None, help="gguf: layers to offload to the GPU")
    model.add_argument("--ubatch", type=int, default=None, help="gguf: llama.cpp n_ubatch")
    add_sim_arguments(run.add_argument_group("sim backend (--backend sim)"))
    tests = run.add_argument_group("tests")
    tests.add_argument("-p", "--n-prompt", type=int_list, action="append", help="prompt lengths for pp tests (default: 512)")
    tests.add_argument("-n", "--n-gen", type=int_list, action="append", help="generation lengths for tg tests (default: 128)")
    tests.add_argument("--pg", type=pp_tg_pair, action="append", default=[], metavar="PP,TG", help="combined prompt+generation test (repeatable)")
    tests.add_argument("-c", "--concurrency", type=int_list, action="append", help="requests in flight (default: 1,2,4)")
    tests.add_argument("-s", "--strategy", type=str_list, action="append", help=f"strategies (default: {','.join(STRATEGIES)})")
    tests.add_argument("--chunk-size", type=int_list, action="append", help="chunked prefill chunk sizes (default: 256)")
    tests.add_argument("-r", "--repetitions", type=int, default=3, help="timed repetitions after a warm-up (default: 3)")
    tests.add_argument("--requests", type=int, default=None, help="requests per test, closed loop (default: the concurrency)")
    tests.add_argument("--seed", type=int, default=42, help="seed of the random prompts (default: 42)")
    tests.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the untimed warm-up run")
    tests.add_argument("--interleave", action="store_true",
                       help="measure the strategies of each test and concurrency in turns (ABBA), so drift cancels out of their ratios")
    out = run.add_argument_group("output")
    out.add_argument("-o", "--output", choices=reports.FORMATS, default="md", help="format on stdout (default: md)")
    out.add_argument("--export", help="also write every field and the run metadata here (.csv, .json, .jsonl, .md); "
                     "a .json/.jsonl export gets its per-request trace beside it as <name>.requests.jsonl")
    out.add_argument("--export-requests", metavar="FILE.jsonl", help="write each request's arrival and token times here (for plot)")
    out.add_argument("--relative-to", metavar="STRATEGY", help="show each row's ratios to this strategy's row of the same test and concurrency")
    out.add_argument("--noisy-cv", type=compare.percent, default=10.0, metavar="PCT",
                     help="mark rows whose CV across repetitions exceeds this percentage as noisy (default: 10)")
    out.add_argument("--results-dir", default="results", help="where each run writes <timestamp>.csv (default: results)")
    out.add_argument("--no-results-file", dest="results_file", action="store_false", help="do not write results/<timestamp>.csv")
    out.add_argument("--verify", action="store_true", help="check that all strategies produce the same greedy tokens")
    out.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    add_calibrate_parser(sub)
    compare.add_arguments(sub.add_parser("compare", help="compare two exported runs; exit 1 on a regression beyond --threshold"))
    plots.add_arguments(sub.add_parser("plot", help="write PNG charts from exported results and per-request traces"))
    return parser


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    n_prompt = _flatten(args.n_prompt) if args.n_prompt else [512]
    n_gen = _flatten(args.n_gen) if args.n_gen else [128]
    strategies = _flatten(args.strategy) if args.strategy else list(STRATEGIES)
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise UsageError(f"unknown strategy {unknown[0]!r}; choose from {', '.join(STRATEGIES)}")
    config = BenchConfig(
        tests=make_tests(n_prompt, n_gen, args.pg),
        strategies=list(dict.fromkeys(strategies)),
        concurrency=_flatten(args.concurrency) if args.concurrency else [1, 2, 4],
        chunk_sizes=_flatten(args.chunk_size) if args.chunk_size else [256],
        repetitions=args.repetitions,
        requests=args.requests,
        seed=args.seed,
        warmup=args.warmup,
    )
    try:
        config.validate()
    except ValueError as e:
        raise UsageError(str(e)) from None
    return config


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
        TimeElapsedColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), disable=not enabled, transient=True,
    )


def cmd_run(args: argparse.Namespace) -> int:
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
    options = {k: v for k, v in (("n_gpu_layers", args.n_gpu_layers), ("n_ubatch", args.ubatch)) if v is not None}
    options.update(sim_options(args))
    backend = load_backend(args.backend, args.model, device=args.device, dtype=args.dtype, threads=args.threads, **options)
    print(f"prefillbench: {backend.model_name} on {backend.label}, weights: {backend.weights}", file=sys.stderr)
    longest = max(t.max_seq_len for t in config.tests)
    if longest > backend.context_length:
        raise UsageError(f"a test needs {longest} positions but the model's context is {backend.context_length}")

    results: list[CaseResult] = []
    interrupted = False
    failure: BackendError | None = None
    progress = _progress(args.progress)
    with progress:
        task = progress.add_task("", total=config.tokens_to_emit())
        try:
            if args.interleave:
                on_group = lambda label: progress.update(task, description=label)  # noqa: E731
                for result in interleave.run_interleaved(backend, config, lambda n: progress.advance(task, n), on_group):
                    results.append(result)
            for case in ([] if args.interleave else config.cases()):
                label = f"{case.test.name} {case.strategy} c={case.concurrency}"
                progress.update(task, description=label)
                results.append(run_case(backend, case, config, on_token=lambda n: progress.advance(task, n)))
        except KeyboardInterrupt:
            interrupted = True
        except BackendError as e:
            # A step that fails (llama.cpp out of KV space, ...) ends the run, not the rows before it.
            failure = e
    rows = [r.row for r in results]
    meta = run_metadata(backend.metadata())
    meta.update(model_path=args.model or "default", backend_name=backend.name, device=backend.device)
    if rows:
        if args.relative_to:
            sys.stdout.write(compare.render_relative(args.output, rows, meta, args.relative_to, args.noisy_cv / 100))
        else:
            sys.stdout.write(reports.render(args.output, rows, meta, args.noisy_cv / 100))
        sys.stdout.flush()
        if args.export:
            reports.export(args.export, rows, meta)
        if trace_path:
            traces.export_traces(trace_path, results)
        if args.results_file:
            stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            path = Path(args.results_dir) / f"{stamp}.csv"
            reports.export(path, rows, meta)
            print(f"prefillbench: wrote {path}", file=sys.stderr)
    if interrupted:
        print(f"prefillbench: interrupted; kept {len(rows)} measured row(s)", file=sys.stderr)
        return 130
    if failure is not None:
        print(f"prefillbench: error: {failure} (kept {len(rows)} measured row(s))", file=sys.stderr)
        return 2
    if args.verify:
        problems = verify(results)
        for line in problems:
            print(f"verify: {line}", file=sys.stderr)
        if problems:
            return 1
        n = sum(len(r.runs[0].requests) for r in results)
        print(f"verify: all strategies produced the same greedy tokens ({n} requests)", file=sys.stderr)
    return 0


COMMANDS = {"run": cmd_run, "calibrate": cmd_calibrate, "compare": compare.cmd_compare, "plot": plots.cmd_plot}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (UsageError, BackendError, ValueError) as e:
        print(f"prefillbench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("prefillbench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The torch backend on one CUDA GPU, against the targets of issue 27, as one table, made for one chance.

Builds a Llama-3-8B-shaped bfloat16 model with random weights from its config (nothing to download), prepares
one KV cache of --long-batch x --cache-len positions (64 x 8,192) that every section then runs in (the compiled
flex route warms there, and the compile counts are taken before any step is timed), and runs the sections
through the torch backend's public surface, the profiler first:
- the attention kernels each kind of step ran (kernel names from torch.profiler), and whether any attention
  went through the math SDPA kernel or an attention-shaped bmm; a CUDA-graph replay whose profile holds no
  kernel is "blind", not passed;
- pp512 against the roofline of a bf16 GEMM peak measured in the same run;
- decode-only steps at 1, 16 and 64 sequences against the weight + KV read limit;
- 64 decodes at context 512 against the same at 4,096, in the cache of 8,192 positions a slot;
- the piggyback ratio: ((chunk + 8 decodes) - chunk) / (8 decodes alone);
- chunked against sequential on 64 x pp1024+tg128 at c=16: throughput and TBT p99;
- the logit-parity tests on the device, in a pytest process started first (the compiled flex route's tests
  first), beside the build, the cache and the profiler;
- the compiles: graphs before the first timed step, and inside steps after the warm-up (target 0).
Each timed contender is called once untimed (its compiles and first allocations), then timed once to size its
repetitions to the section's share of --max-seconds. On a GPU it fits --max-seconds (480 by default).

What it leaves in $OUT (when set), rewritten after every section: gpu_check.md (the table so far, versions
and compile counts in its header), results.json, check.log (this run's progress), recompiles.log (dynamo's
recompile reasons, TORCH_LOGS=recompiles), parity.log and parity.xml (pytest's output and JUnit report). A
section that raises is one failed row and the next one runs; after a CUDA error the context is probed, and
where it is lost the remaining sections say so. A watchdog writes the table so far at --max-seconds and stops
the run (exit 3). Exit 0 if every target holds, 1 if one does not, 2 on bad input, 3 when the watchdog stopped it.

    python -m benchmarks.gpu.check                            # on the GPU machine (or benchmarks/gpu/check.sh)
    python -m benchmarks.gpu.check --max-seconds 240          # one chance in 5 minutes of device time
    python -m benchmarks.gpu.check --device cpu --config tiny  # the same check on a tiny model, in seconds
"""
from __future__ import annotations

import _thread
import argparse
import dataclasses
import json
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from prefillbench.backends.torch import flex
from prefillbench.backends.torch.backend import DTYPES, TorchBackend

from benchmarks.gpu import sections
from benchmarks.gpu.sections import Compiles, Setup, Sizes
from benchmarks.gpu.table import Row, rows_for
from benchmarks.lib import cli
from benchmarks.lib.limits import hold_freed_memory
from benchmarks.lib.models import CONFIGS, StepCosts, build_from_config
from benchmarks.lib.timing import Clock

#: The sizes issue 27 names, for an 8B model on one GPU.
GPU_SIZES = Sizes(pp=512, decodes=(1, 16, 64), context=1024, chunk=512, k=8, long_batch=64, short_context=512,
                  long_context=4096, cache_len=8192, requests=64, prompt=1024, gen=128, len_spread=0.5, concurrency=16,
                  chunk_size=256, gemm=8192, copy_mb=1024, reps=20)
#: The same check at a size a CPU runs in seconds.
TINY_SIZES = Sizes(pp=64, decodes=(1, 2, 4), context=64, chunk=32, k=2, long_batch=4, short_context=32, long_context=128,
                   cache_len=256, requests=6, prompt=48, gen=8, len_spread=0.5, concurrency=3, chunk_size=16, gemm=256,
                   copy_mb=16, reps=3)
#: The parity tests, the ones that matter most first: the compiled flex route (block lists as the kernels read
#: them, no compile inside steps), the routes, then the backend's grid and the linear kernels.
PARITY_TESTS = ("tests/test_flex_compiled.py", "tests/test_torch_routes.py", "tests/test_torch_backend.py",
                "tests/test_torch_linear.py")

BUILD, CACHE, PARITY = "model build", "cache and warm-up", "parity tests (beside the build)"
PROFILER, LIMITS, LIMITS_AGAIN = "attention kernels (profiler)", "GEMM peak and copy bandwidth", "limits again"
PROMPT, DECODES, SCALING, WORKLOAD = "prompt step", "decode steps and piggyback", "context scaling", "workload: sequential and chunked"
#: Each section's share of --max-seconds, in the order they run; the parity tests run beside the build, the
#: cache and the profiler (which times nothing), and are waited for before the first timed section.
SHARES = {PARITY: 0.35, BUILD: 0.08, CACHE: 0.12, PROFILER: 0.05, LIMITS: 0.03, PROMPT: 0.04, DECODES: 0.10,
          SCALING: 0.06, WORKLOAD: 0.20, LIMITS_AGAIN: 0.03}
#: The sections after the parity wait, in order (the build, the cache and the profiler come before it).
TIMED = (LIMITS, PROMPT, DECODES, SCALING, WORKLOAD, LIMITS_AGAIN)
#: Exit status when the watchdog stopped the run.
WATCHDOG_EXIT = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--config", default="llama-8b", choices=sorted(CONFIGS),
                        help="random-weight model shapes (tiny: a CPU-sized check with its own sizes)")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="the whole check's budget, the watchdog's deadline (default: 480; tiny 120)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--no-tune-linear", action="store_true")
    parser.add_argument("--parity-tests", default=",".join(PARITY_TESTS), help="test files, a comma list ('' skips them)")
    parser.add_argument("--parity-k", default=None, metavar="EXPR", help="pytest -k selection of the parity tests")
    sizes = parser.add_argument_group("sizes (default: issue 27's for an 8B model; --config tiny: a tiny set)")
    for field in dataclasses.fields(Sizes):
        kind = "N[,N...]" if field.type == "tuple[int, ...]" else "N"
        sizes.add_argument(f"--{field.name.replace('_', '-')}", default=None, metavar=kind)


def parse_sizes(args: argparse.Namespace) -> Sizes:
    """The preset's sizes with the flags given on top; exits 2 on a bad one."""
    preset = TINY_SIZES if args.config == "tiny" else GPU_SIZES
    values = {}
    for field in dataclasses.fields(Sizes):
        text = getattr(args, field.name)
        if text is None:
            values[field.name] = getattr(preset, field.name)
            continue
        flag = f"--{field.name.replace('_', '-')}"
        kind = {"tuple[int, ...]": "a comma list of integers", "int": "an integer", "float": "a number"}[field.type]
        try:
            if field.type == "tuple[int, ...]":
                value = tuple(int(v) for v in text.split(","))
            else:
                value = float(text) if field.type == "float" else int(text)
        except ValueError:
            usage(f"{flag} takes {kind}, not {text!r}")
        if min(value if isinstance(value, tuple) else (value,)) < (0 if field.type == "float" else 1):
            usage(f"{flag} must be positive, got {text}")
        values[field.name] = value
    s = Sizes(**values)
    positions = CONFIGS[args.config]["max_position_embeddings"]
    if s.len_spread >= 1:
        usage(f"--len-spread is a fraction below 1, got {s.len_spread}")
    if not s.short_context < s.long_context < s.cache_len:
        usage(f"need --short-context < --long-context < --cache-len, got {s.short_context}, {s.long_context}, {s.cache_len}")
    needed = max(s.cache_len, s.context + s.chunk + 8, s.prompt * (1 + s.len_spread) + s.gen * (1 + s.len_spread) + 2)
    if needed > positions:
        usage(f"these sizes need {needed:.0f} positions a sequence; {args.config} has {positions}")
    if needed > s.cache_len:
        usage(f"every section runs in one cache of --cache-len positions a slot; these sizes need {needed:.0f}")
    return s


def usage(message: str) -> None:
    print(f"gpu check: {message}", file=sys.stderr)
    sys.exit(2)


@dataclass
class Budget:
    """--max-seconds shared out by SHARES; a section starts only while time is left."""

    total: float
    start: float = dataclasses.field(default_factory=time.perf_counter)

    def share(self, section: str) -> float:
        return SHARES[section] * self.total

    def left(self) -> float:
        return self.total - (time.perf_counter() - self.start)


def versions(device: str) -> str:
    """torch, Triton and CUDA versions, and the device's name."""
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001: absent or broken, it is reported, not fatal
        triton_version = "none"
    parts = [f"torch {torch.__version__}", f"Triton {triton_version}", f"CUDA {torch.version.cuda or 'none'}"]
    if device == "cuda":
        parts.append(torch.cuda.get_device_name())
    return ", ".join(parts)


class Output:
    """What the run leaves in $OUT (nothing when it is unset): each file rewritten whole, never half written."""

    FILES = ("gpu_check.md", "results.json", "check.log", "recompiles.log", "parity.log", "parity.xml")

    def __init__(self, folder: str | None) -> None:
        self.folder = Path(folder) if folder else None
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path | None:
        return None if self.folder is None else self.folder / name

    def write(self, name: str, text: str) -> None:
        if self.folder is None:
            return
        tmp = self.folder / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(self.folder / name)


class Log:
    """Progress lines to stderr and to $OUT/check.log."""

    def __init__(self, out: Output) -> None:
        path = out.path("check.log")
        self.file = open(path, "w", buffering=1) if path else None  # noqa: SIM115: open for the run

    def __call__(self, line: str) -> None:
        print(f"gpu check: {line}", file=sys.stderr, flush=True)
        if self.file is not None and not self.file.closed:
            self.file.write(f"{time.strftime('%H:%M:%S')} {line}\n")

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def record_recompiles(out: Output) -> tuple[Callable[[], int], Callable[[], None]]:
    """Dynamo's recompile reasons (TORCH_LOGS=recompiles) into $OUT/recompiles.log; -> (a count of them so far,
    the function that stops the recording)."""
    count = [0]

    class Counted(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if "recompiles" not in record.name:
                return False
            count[0] += 1
            return True

    path = out.path("recompiles.log")
    handler: logging.Handler = logging.FileHandler(path, mode="w") if path else logging.NullHandler()
    try:
        torch._logging.set_logs(recompiles=True)
    except Exception:  # noqa: BLE001: the log is an aid; the compile counts stand without it
        handler.close()
        return lambda: count[0], lambda: None
    handler.addFilter(Counted())
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    logging.getLogger("torch").addHandler(handler)

    def stop() -> None:
        logging.getLogger("torch").removeHandler(handler)
        handler.close()
        torch._logging.set_logs()

    return lambda: count[0], stop


def device_alive(device: str) -> str | None:
    """None while the device still runs work; else the error that says it does not (a sticky CUDA error)."""
    if device != "cuda":
        return None
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).item()
        torch.cuda.empty_cache()
        return None
    except Exception as e:  # noqa: BLE001: any failure here means the context is gone
        return one_line(e)


def one_line(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first[:200]}"


class Run:
    """The sections' results as they come, and the table written from them after each one."""

    def __init__(self, args: argparse.Namespace, sizes: Sizes, budget: Budget, out: Output, log: Log, header: list[str]) -> None:
        self.args, self.sizes, self.budget, self.out, self.log = args, sizes, budget, out, log
        self.header = header
        self.results: dict[str, object] = {}
        self.setup: Setup | None = None
        self.lost: str | None = None  # why the device can run nothing more
        self.current: str | None = None
        self.stopped: str | None = None  # the watchdog's note
        self.lock = threading.Lock()

    def guarded(self, name: str, fn: Callable[[], object]) -> None:
        """Run one section into results[name]: its value, or the one-line reason it has none (out of time, an
        error, a lost device); the outputs are rewritten after it."""
        if self.stopped is not None:
            self.results[name] = "not run: stopped by the watchdog"
        elif self.lost is not None:
            self.results[name] = f"not run: the device was lost ({self.lost})"
        elif self.budget.left() <= 0:
            self.results[name] = "not run: out of time"
        else:
            t0 = time.perf_counter()
            self.current = name
            self.log(f"{name}...")
            try:
                self.results[name] = fn()
            except Exception as e:  # noqa: BLE001: a section that fails is a failed row; the next one runs
                if os.environ.get("PREFILLBENCH_CHECK_TRACEBACK"):
                    traceback.print_exc()
                self.results[name] = f"error: {one_line(e)}"
                self.lost = device_alive(self.args.device)
                if self.lost is not None:
                    self.log(f"the device is lost after {name}: {self.lost}")
            self.current = None
            self.log(f"{name} done in {time.perf_counter() - t0:.1f} s")
        self.write()

    def rows(self) -> list[Row]:
        costs = None
        if self.setup is not None:
            try:
                costs = StepCosts.of(self.setup.backend)
            except Exception:  # noqa: BLE001: a lost device must not stop the table
                costs = None
        return rows_for(dict(self.results), self.sizes, costs, self.args.device)

    def write(self, final: bool = False) -> list[Row]:
        """The table and results so far into $OUT (the watchdog calls it too: one writer at a time)."""
        with self.lock:
            rows = self.rows()
            header = list(self.header)
            if self.stopped:
                header.append(self.stopped)
            elif not final:
                pending = [s for s in SHARES if s not in self.results]
                header.append(f"in progress: {len(self.results)} of {len(SHARES)} sections done"
                              + (f"; not yet: {', '.join(pending)}" if pending else ""))
            self.out.write("gpu_check.md", markdown(header, rows) + "\n")
            results = dict(self.results)
            self.out.write("results.json", json.dumps({"header": header, "rows": [dataclasses.asdict(r) for r in rows],
                                                       "sections": {k: describe(v) for k, v in results.items()}},
                                                      indent=1, default=str) + "\n")
            return rows


def describe(value: object) -> object:
    """A section's result for results.json: dataclasses as dicts, strings as they are, anything else by its repr."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            return dataclasses.asdict(value)
        except Exception:  # noqa: BLE001
            return repr(value)
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def _hard_exit(code: int) -> None:
    """The watchdog's last resort (tests replace it): end the process now, whatever the main thread is in."""
    os._exit(code)


class Watchdog:
    """At the deadline: the table so far into $OUT, the parity process stopped, the main thread interrupted (it
    writes the final table and exits 3; sections not started by then are skipped); if it is stuck in a call that
    does not return (a hung kernel) or swallowed the interrupt, the process ends `grace` seconds later all the same."""

    def __init__(self, run: Run, seconds: float, parity: "sections.ParityRun | None", grace: float = 15.0,
                 hard_exit: Callable[[int], None] | None = None) -> None:
        self.run, self.parity, self.grace = run, parity, grace
        self.hard_exit = hard_exit or _hard_exit
        self.lock = threading.Lock()
        self.fired = threading.Event()
        self.sent = threading.Event()  # the interrupt is sent
        self.done = threading.Event()  # the sections are over
        self.finished = threading.Event()  # main() is past the interrupt
        self.thread = threading.Thread(target=self._watch, args=(seconds,), daemon=True)
        self.thread.start()

    def _watch(self, seconds: float) -> None:
        if self.done.wait(max(seconds, 0.0)):
            return
        with self.lock:  # fire only if the sections are not over (cancel() takes the same lock)
            if self.done.is_set():
                return
            self.fired.set()
        where = self.run.current or "between sections"
        self.run.stopped = f"stopped by the watchdog at {self.run.budget.total:.0f} s, in: {where}"
        self.run.log(self.run.stopped)
        if self.parity is not None:
            self.parity.stop()
        self.run.write()
        _thread.interrupt_main()
        self.sent.set()
        if not self.finished.wait(self.grace):
            self.run.log(f"the main thread did not stop within {self.grace:.0f} s: exiting")
            self.hard_exit(WATCHDOG_EXIT)

    def cancel(self) -> bool:
        """The sections are over; -> whether the watchdog fired first (its interrupt is then on its way)."""
        with self.lock:
            self.done.set()
            return self.fired.is_set()

    def absorb(self) -> None:
        """Wait, inside the caller's `except KeyboardInterrupt`, for an interrupt that is on its way."""
        self.sent.wait(self.grace)
        deadline = time.perf_counter() + 5.0
        while time.perf_counter() < deadline:
            time.sleep(0.01)

    def finish(self) -> None:
        self.finished.set()


def plan(args: argparse.Namespace, sizes: Sizes, dtype: str, budget: Budget, parity: list[str]) -> str:
    spec = CONFIGS[args.config]
    lines = [f"# gpu check: {args.config} ({spec['num_hidden_layers']} layers, hidden {spec['hidden_size']}, "
             f"{spec['num_attention_heads']}/{spec['num_key_value_heads']} heads, vocab {spec['vocab_size']}), random weights, "
             f"{dtype} on {args.device}; {versions(args.device)}; budget {budget.total:.0f} s, of which the sections "
             f"take at most {(sum(SHARES.values()) - SHARES[PARITY]) * budget.total:.0f} s (the parity tests run beside)"]
    what = {
        PARITY: f"{', '.join(parity) or 'none'}{f' -k {args.parity_k!r}' if args.parity_k else ''} "
                f"with PREFILLBENCH_TEST_DEVICE={args.device}, beside the build, the cache and the profiler",
        BUILD: "from the config, on the device",
        CACHE: f"{cache_slots(sizes)} x {sizes.cache_len} positions, every section's; the route's warm-up and compile counts",
        PROFILER: "each kind of step, once (after an unprofiled call)",
        LIMITS: f"{sizes.gemm}^2 matmuls, a {sizes.copy_mb} MB copy",
        PROMPT: f"pp{sizes.pp}",
        DECODES: f"decode x{','.join(map(str, sizes.decodes))} at {sizes.context}; chunk {sizes.chunk} + {sizes.k} decodes",
        SCALING: f"decode x{sizes.long_batch} at {sizes.short_context} and {sizes.long_context}, cache {sizes.cache_len}",
        WORKLOAD: f"{sizes.requests} x pp{sizes.prompt}+tg{sizes.gen} (lengths ±{sizes.len_spread:.0%}), "
                  f"c={sizes.concurrency}, chunk {sizes.chunk_size}",
        LIMITS_AGAIN: "the higher of the two counts",
    }
    for section, share in SHARES.items():
        lines.append(f"#   {section:34} at most {share * budget.total:5.0f} s: {what[section]}")
    return "\n".join(lines)


def cache_slots(s: Sizes) -> int:
    return max(s.long_batch, max(s.decodes), s.k + 1, s.concurrency)


def cache_steps(s: Sizes) -> int:
    """The most tokens a step of any section brings (the workload's sequential steps: one prompt)."""
    return max(s.pp, s.chunk + s.k, s.long_batch, int(s.prompt * (1 + s.len_spread)) + 1, s.chunk_size + s.concurrency)


def prepare_cache(setup: Setup) -> Compiles:
    """The one cache every section runs in, the route warmed there: the compiles before the first timed step."""
    s, backend = setup.sizes, setup.backend
    t0, before = time.perf_counter(), flex.graphs_compiled()
    backend.prepare(cache_slots(s), s.cache_len, cache_steps(s))
    return Compiles(before_timing=flex.graphs_compiled() - before, seconds=time.perf_counter() - t0,
                    note=backend.metadata().get("flex_compiles", "the route does not compile"))


def markdown(header: list[str], rows: list[Row]) -> str:
    lines = [*header, "", "| check | measured | math/bmm attention | against | ratio | target | pass |",
             "| --- | --- | --- | --- | ---: | --- | --- |"]
    lines += [f"| {r.check} | {r.measured} | {r.math} | {r.against} | {r.ratio} | {r.target} | {r.verdict} |" for r in rows]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    sizes = parse_sizes(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        usage(f"this torch ({torch.__version__}, CUDA {torch.version.cuda or 'none'}) sees no CUDA device; "
              f"--device cpu --config tiny runs the check on the CPU")
    if args.threads is not None:
        if args.threads < 1:
            usage(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    budget = Budget(args.max_seconds or (120.0 if args.config == "tiny" else 480.0))
    parity_files = [f for f in args.parity_tests.split(",") if f]
    out = Output(os.environ.get("OUT"))
    log = Log(out)
    planned = plan(args, sizes, dtype, budget, parity_files)
    print(planned, flush=True)
    if args.device == "cpu":
        hold_freed_memory()
    recompiles, stop_recording = record_recompiles(out)
    run = Run(args, sizes, budget, out, log, [planned.splitlines()[0].removeprefix("# ")])
    parity = sections.ParityRun(args.device, parity_files, args.parity_k, out) if parity_files else None
    if parity is None:
        run.results[PARITY] = "not run (--parity-tests '')"
    watchdog = Watchdog(run, budget.total, parity)
    try:
        try:
            _sections(run, parity, dtype, recompiles)
        finally:
            fired = watchdog.cancel()
        if fired:  # it fired as the sections ended: its interrupt is on its way
            watchdog.absorb()
    except KeyboardInterrupt:
        if not watchdog.fired.is_set():
            raise
    watchdog.finish()
    stop_recording()
    if parity is not None and parity.process.poll() is None:
        parity.stop()
    rows = run.write(final=True)
    log.close()
    print()
    print(markdown([], rows).lstrip("\n"))
    elapsed = time.perf_counter() - budget.start
    print(f"\n{sum(r.passed is True for r in rows)} of {sum(r.passed is not None for r in rows)} targets met, "
          f"in {elapsed:.0f} s of a {budget.total:.0f} s budget" + (f"; {run.stopped}" if run.stopped else ""))
    if run.stopped:
        return WATCHDOG_EXIT
    return 0 if all(r.passed is not False for r in rows) else 1


def _sections(run: Run, parity: "sections.ParityRun | None", dtype: str, recompiles: Callable[[], int]) -> None:
    args, sizes, budget = run.args, run.sizes, run.budget

    def build() -> Setup:
        model = build_from_config(args.config, DTYPES[dtype], args.device)
        options = dict(tune_linear=not args.no_tune_linear, cuda_graphs=not args.no_cuda_graphs)
        backend = TorchBackend(model, f"{args.config} (random weights)", args.device, **options)
        return Setup(backend, sizes, Clock(backend.torch_device), np.random.default_rng(0))

    run.guarded(BUILD, build)
    setup = run.results[BUILD]
    if not isinstance(setup, Setup):
        return
    run.setup = setup
    run.guarded(CACHE, lambda: prepare_cache(setup))
    run.guarded(PROFILER, lambda: sections.attention_kernels(setup, budget.share(PROFILER)))
    if parity is not None:
        run.log("waiting for the parity tests...")
        run.results[PARITY] = parity.wait(budget.share(PARITY) - (time.perf_counter() - parity.start))
        run.write()
    graphs_before = flex.graphs_compiled()
    late_before = setup.backend.late_compiles()
    timed = {LIMITS: sections.limits, PROMPT: sections.prefill, DECODES: sections.decode_steps,
             SCALING: sections.context_scaling, WORKLOAD: sections.workload, LIMITS_AGAIN: sections.limits}
    for name in TIMED:
        run.guarded(name, lambda fn=timed[name], name=name: fn(setup, budget.share(name)))
    compiles = run.results.get(CACHE)
    if isinstance(compiles, Compiles):
        compiles.during_timing = flex.graphs_compiled() - graphs_before
        compiles.inside_steps = setup.backend.late_compiles() - late_before
        compiles.recompiles_logged = recompiles()
    # After the sections: what the backend decided at prepare() (attention route, graphs, kernels) is in it.
    try:
        run.header.append("backend: " + "; ".join(f"{k} {v}" for k, v in setup.backend.metadata().items()))
        print(run.header[-1], flush=True)
    except Exception as e:  # noqa: BLE001: a lost device must not stop the table
        run.header.append(f"backend: metadata unavailable ({one_line(e)})")


if __name__ == "__main__":
    cli.run(__name__)

"""The GPU check's measurements, one function a section, each through the torch backend's public surface only
(prepare and execute of prefillbench.step steps, the engine, the strategies, metadata). check.py turns what
they return into the table."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from prefillbench import engine
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.bench.metrics import ResultRow, summarize
from prefillbench.bench.workloads import TestSpec, make_requests
from prefillbench.step import DecodeToken, PrefillChunk, Step
from strategies import make_strategy

from benchmarks.lib.limits import copy_bandwidth, gemm_peak
from benchmarks.lib.profiling import AttentionProfile, attention_profile
from benchmarks.lib.timing import Clock, Timing

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Sizes:
    """Every size the check runs at; check.py keeps one set for an 8B model on a GPU and one for a tiny model."""

    pp: int  # the prompt step timed against the GEMM peak
    decodes: tuple[int, ...]  # decode-only batch sizes timed against the weight + KV read limit
    context: int  # positions those decodes attend to; the piggyback chunk's offset
    chunk: int  # the piggyback chunk's tokens
    k: int  # decodes piggybacked on it
    long_batch: int  # decodes of the context-scaling pair
    short_context: int
    long_context: int
    cache_len: int  # positions per slot of the cache the pair runs in
    requests: int  # the strategies' workload: requests of prompt+gen tokens, concurrency in flight
    prompt: int
    gen: int
    len_spread: float
    concurrency: int
    chunk_size: int
    gemm: int  # the side of the square matmul that measures the GEMM peak
    copy_mb: int  # the tensor copied to measure the bandwidth
    reps: int  # the most reps a timing takes (fewer where its budget is short)


@dataclass
class Setup:
    """The backend under test and what every section needs to build and time its steps."""

    backend: TorchBackend
    sizes: Sizes
    clock: Clock
    rng: np.random.Generator

    @property
    def device(self) -> torch.device:
        return self.backend.torch_device

    def tokens(self, n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in self.rng.integers(0, self.backend.vocab_size, n))

    def run(self, step: Step) -> Callable[[], object]:
        return lambda: self.backend.execute(step)


def time_sized(contenders: dict[object, Callable[[], object]], seconds: float, clock: Clock, max_reps: int,
               min_reps: int = 3) -> dict[object, Timing]:
    """Contenders alternated rep by rep (so drift hits them alike), as many reps as fit in `seconds` (between
    min_reps and max_reps), sized from a round timed after one untimed call of each: a first call pays for
    compiles, captures and first allocations, and reps sized from it would be too few."""
    for fn in contenders.values():
        fn()  # untimed: whatever a first call costs
    t0 = time.perf_counter()
    for fn in contenders.values():
        clock(fn)  # the sizing round, timed but not kept
    per_rep = max(time.perf_counter() - t0, 1e-6)
    reps = max(min_reps, min(max_reps, int((seconds - per_rep) / per_rep)))
    out = {name: Timing([]) for name in contenders}
    for _ in range(reps):
        for name, fn in contenders.items():
            out[name].seconds.append(clock(fn))
    return out


def decodes(n: int, context: int, first: int = 0) -> tuple[DecodeToken, ...]:
    """n decodes of sequences first.. at `context` positions (what the cache holds there does not change the cost)."""
    return tuple(DecodeToken(first + i, 1, context) for i in range(n))


@dataclass
class Limits:
    peak: float  # FLOP/s
    bandwidth: float  # bytes/s moved by a copy (read + write)

    def best(self, other: "Limits | None") -> "Limits":
        """The higher of two measurements of each: a limit measured low is the machine's noise, and a ratio
        against it would flatter the step."""
        if other is None:
            return self
        return Limits(max(self.peak, other.peak), max(self.bandwidth, other.bandwidth))


def limits(setup: Setup, seconds: float) -> Limits:
    dtype, reps = setup.backend.dtype, max(3, min(setup.sizes.reps, 10))
    return Limits(gemm_peak(dtype, setup.device, setup.clock, reps, sizes=(setup.sizes.gemm,)),
                  copy_bandwidth(setup.device, setup.clock, reps, nbytes=setup.sizes.copy_mb << 20))


@dataclass
class Workload:
    runs: dict[str, ResultRow]  # by strategy label
    label: str


def fitting_requests(warm: engine.RunRecord, s: Sizes, seconds: float) -> int:
    """How many of the workload's requests both strategies' runs fit in `seconds`, judged by a sequential warm-up
    run's steps: a prompt step per request and a decode step per `concurrency` generated tokens, each run."""
    def median(steps: list[engine.StepRecord]) -> float:
        return float(np.median([x.seconds for x in steps])) if steps else 0.0

    prompt = median([x for x in warm.steps if x.prefill_chunks])
    decode = median([x for x in warm.steps if not x.prefill_chunks])
    per_request = prompt + s.gen / s.concurrency * decode
    if per_request <= 0:
        return s.requests
    return max(min(s.requests, 2 * s.concurrency), min(s.requests, int(seconds / (2 * per_request))))


def workload(setup: Setup, seconds: float) -> Workload:
    """Sequential and chunked over the same closed-loop requests, each after a short warm-up run, as `prefillbench run`
    times them; fewer requests (never under twice the concurrency) where the full count would overrun `seconds`."""
    s, backend = setup.sizes, setup.backend
    test = TestSpec(s.prompt, s.gen, spread=s.len_spread)
    warm = make_requests(TestSpec(s.prompt, 2, spread=s.len_spread), s.concurrency, backend.vocab_size, seed=1)
    t0 = time.perf_counter()
    warm_run = engine.run(backend, make_strategy("sequential"), warm, s.concurrency)
    count = fitting_requests(warm_run, s, seconds - 2 * (time.perf_counter() - t0))
    requests = make_requests(test, count, backend.vocab_size, seed=0)
    rows = {}
    for name in ("sequential", "chunked"):
        strategy = make_strategy(name, s.chunk_size)
        if name != "sequential":
            engine.run(backend, strategy, warm, s.concurrency)
        record = engine.run(backend, strategy, requests, s.concurrency)
        rows[name] = summarize(test, [record], model=backend.model_name, backend="torch", strategy=name,
                               concurrency=s.concurrency, chunk_size=s.chunk_size if strategy.uses_chunk_size else None)
    spread = f" (lengths ±{s.len_spread:.0%})" if s.len_spread else ""
    cut = f" (of {s.requests}: the budget)" if count < s.requests else ""
    return Workload(rows, f"{count}{cut} x pp{s.prompt}+tg{s.gen}{spread}, c={s.concurrency}, chunk {s.chunk_size}")


def prefill(setup: Setup, seconds: float) -> Timing:
    s = setup.sizes
    setup.backend.prepare(1, s.pp + 8, s.pp)
    step = Step(prefills=(PrefillChunk(0, setup.tokens(s.pp), 0, is_last=True),))
    return time_sized({"pp": setup.run(step)}, seconds, setup.clock, s.reps)["pp"]


@dataclass
class DecodeTimes:
    by_batch: dict[int, Timing]
    chunk: Timing  # the piggyback chunk alone
    mixed: Timing  # the chunk with k decodes
    alone: Timing  # the k decodes alone


def decode_steps(setup: Setup, seconds: float) -> DecodeTimes:
    """Decode-only steps at each batch size, then the piggyback triple, in one cache sized for them."""
    s, backend = setup.sizes, setup.backend
    slots = max(max(s.decodes), s.k + 1)
    backend.prepare(slots, s.context + s.chunk + 8, max(s.chunk + s.k, slots))
    batches = time_sized({n: setup.run(Step(decodes=decodes(n, s.context))) for n in s.decodes}, seconds / 2,
                          setup.clock, s.reps)
    chunk = PrefillChunk(0, setup.tokens(s.chunk), s.context, is_last=False)  # mid-prompt: no token, no LM head
    riders = decodes(s.k, s.context, first=1)
    triple = {"chunk": Step(prefills=(chunk,)), "mixed": Step(prefills=(chunk,), decodes=riders), "alone": Step(decodes=riders)}
    # The ratio is a difference of two close step times: it gets reps of its own, as many as fit.
    times = time_sized({n: setup.run(step) for n, step in triple.items()}, seconds / 2, setup.clock, 3 * s.reps)
    return DecodeTimes(batches, times["chunk"], times["mixed"], times["alone"])


def context_scaling(setup: Setup, seconds: float) -> tuple[Timing, Timing]:
    """(decodes at short_context, the same decodes at long_context), both in one cache of cache_len positions a slot."""
    s = setup.sizes
    setup.backend.prepare(s.long_batch, s.cache_len, s.long_batch)
    times = time_sized({c: setup.run(Step(decodes=decodes(s.long_batch, c))) for c in (s.short_context, s.long_context)},
                        seconds, setup.clock, s.reps)
    return times[s.short_context], times[s.long_context]


def graphs_on(backend: TorchBackend) -> bool:
    return str(backend.metadata().get("cuda_graphs", "off")).startswith("on")


def eager(backend: TorchBackend, fn: Callable[[], object]) -> Callable[[], object]:
    """`fn` with the backend's captured decode graphs set aside, so a decode-only step runs its ops one by one
    (a graph replay shows the profiler its kernels but not its ops)."""

    def call():
        graphs, backend.decode_graphs = backend.decode_graphs, None
        try:
            return fn()
        finally:
            backend.decode_graphs = graphs

    return call


def attention_kernels(setup: Setup, seconds: float) -> dict[str, AttentionProfile]:
    """Each kind of step the strategies send, profiled once."""
    s, backend = setup.sizes, setup.backend
    n = max(s.decodes)
    # The cache the decode steps ran in fits these steps too: no new cache, no new capture.
    backend.prepare(max(n, s.k + 1), max(s.context + s.chunk, s.pp) + 8, max(s.chunk + s.k, n, s.pp))
    chunk = PrefillChunk(0, setup.tokens(s.chunk), s.context, is_last=False)
    kinds = {
        f"prompt pp{s.pp}": setup.run(Step(prefills=(PrefillChunk(0, setup.tokens(s.pp), 0, is_last=True),))),
        f"chunk {s.chunk} at {s.context}": setup.run(Step(prefills=(chunk,))),
        f"chunk + {s.k} decodes": setup.run(Step(prefills=(chunk,), decodes=decodes(s.k, s.context, first=1))),
    }
    decode = setup.run(Step(decodes=decodes(n, s.context)))
    if graphs_on(backend) and hasattr(backend, "decode_graphs"):
        kinds[f"decode x{n}, eager"] = eager(backend, decode)
        kinds[f"decode x{n}, CUDA graph"] = decode
    else:
        kinds[f"decode x{n}"] = decode
    return {kind: attention_profile(fn, setup.device, backend.head_dim) for kind, fn in kinds.items()}


@dataclass
class Compiles:
    """dynamo's graphs: compiled while the cache was prepared and the route warmed (before anything is timed),
    compiled during the timed sections, and compiled by the route inside steps after its warm-up (target 0)."""

    before_timing: int
    seconds: float
    note: str  # the backend's own count (metadata "flex_compiles")
    during_timing: int | None = None
    inside_steps: int | None = None
    recompiles_logged: int | None = None


@dataclass
class Parity:
    passed: int
    failed: int
    summary: str  # pytest's last line, or why there is none
    seconds: float

    @property
    def ok(self) -> bool:
        return self.passed > 0 and self.failed == 0


class ParityRun:
    """The torch backend's logit-parity tests on `device`, in a pytest process of their own, started at once so
    that they run beside the model's build, the cache and the profiler (nothing timed); waited for before
    the first timed section. Its output goes to $OUT/parity.log as it comes and its JUnit report to
    $OUT/parity.xml, so a run stopped by its budget (SIGINT: pytest still reports) keeps what it did."""

    def __init__(self, device: str, files: list[str], select: str | None, out=None) -> None:
        env = dict(os.environ, PREFILLBENCH_TEST_DEVICE=device, TORCH_LOGS="recompiles")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        log = out.path("parity.log") if out is not None else None
        self.log_path = Path(log) if log else Path(tempfile.mkstemp(prefix="parity", suffix=".log")[1])
        junit = out.path("parity.xml") if out is not None else None
        # addopts emptied: one -q, whatever the project's pytest options, so the summary line comes out.
        command = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-rfE", "-p", "no:cacheprovider", *files]
        command += ["-k", select] if select else []
        command += [f"--junitxml={junit}"] if junit else []
        self.start = time.perf_counter()
        self.stopped_after: float | None = None
        with open(self.log_path, "w") as log_file:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True)

    def stop(self, grace: float = 15.0) -> None:
        """SIGINT (pytest writes its summary and JUnit report), then a kill if it does not end in `grace` s."""
        if self.process.poll() is not None:
            return
        self.stopped_after = time.perf_counter() - self.start
        try:
            self.process.send_signal(signal.SIGINT)
            self.process.wait(timeout=grace)
        except (subprocess.TimeoutExpired, OSError):
            self.process.kill()
            self.process.wait()

    def wait(self, timeout: float) -> Parity:
        try:
            self.process.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            self.stop()
        return self.result()

    def result(self) -> Parity:
        seconds = time.perf_counter() - self.start
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        lines = [line.strip("= ") for line in text.strip().splitlines() if line.strip()]
        summary = next((line for line in reversed(lines) if re.search(r"\d+ (passed|failed|errors?|skipped|deselected)|no tests ran", line)),
                       lines[-1] if lines else f"no output (exit {self.process.returncode})")
        counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|error|errors)", summary)}
        failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
        if self.stopped_after is not None:
            summary = f"stopped after {self.stopped_after:.0f} s (its budget): {summary}"
            failed = max(failed, 1)  # not all ran: no pass
        elif self.process.returncode not in (0, 1) and not failed:
            failed = 1  # pytest could not run the tests at all (exit 2-5): that is no pass
        return Parity(counts.get("passed", 0), failed, summary, seconds)

"""The torch backend on one CUDA GPU, against the targets of issue 27, as one table.

Builds a Llama-3-8B-shaped bfloat16 model with random weights from its config (nothing to download), runs it
through the torch backend's public surface (prepare/execute of steps, the engine, the strategies) and prints one
table, each row with its target and pass/fail:
- the attention kernels each kind of step ran (kernel names from torch.profiler), and whether any attention
  went through the math SDPA kernel or an attention-shaped bmm;
- pp512 against the roofline of a bf16 GEMM peak measured in the same run;
- decode-only steps at 1, 16 and 64 sequences against the weight + KV read limit (bytes a step reads over
  the copy bandwidth measured in the same run);
- 64 decodes at context 512 against the same at 4,096, in a cache of 8,192 positions a slot;
- the piggyback ratio: ((chunk + 8 decodes) - chunk) / (8 decodes alone);
- chunked against sequential on 64 x pp1024+tg128 at c=16: throughput and TBT p99;
- the logit-parity tests on the device (PREFILLBENCH_TEST_DEVICE=cuda pytest tests/test_torch_backend.py tests/test_torch_routes.py ...).
On a GPU it fits --max-seconds (480 by default): each section has its share, the timed ones take as many reps
as fit. The table is also written as markdown to $OUT/gpu_check.md when OUT is set. Exit 0 if every target
holds, 1 if one does not, 2 on bad input.

    python -m benchmarks.gpu.check                            # on the GPU machine (or benchmarks/gpu/check.sh)
    python -m benchmarks.gpu.check --device cpu --config tiny  # the same check on a tiny model, in seconds
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from prefillbench.backends.torch.backend import DTYPES, TorchBackend

from benchmarks.gpu import sections
from benchmarks.gpu.sections import Setup, Sizes
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
PARITY_TESTS = ("tests/test_torch_backend.py", "tests/test_torch_routes.py", "tests/test_torch_linear.py")

#: Each section's share of --max-seconds, in the order they run; a tenth is left over for what overruns.
#: The parity tests run beside the model's build, before anything is timed; the workload comes first among the
#: timed sections because its cache is the smallest (a cache only grows).
SHARES = {"parity tests (beside the build)": 0.25, "model build": 0.10, "GEMM peak and copy bandwidth": 0.03,
          "workload: sequential and chunked": 0.22, "prompt step": 0.04, "decode steps and piggyback": 0.10,
          "context scaling": 0.06, "attention kernels (profiler)": 0.05, "limits again": 0.03}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--config", default="llama-8b", choices=sorted(CONFIGS),
                        help="random-weight model shapes (tiny: a CPU-sized check with its own sizes)")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument("--max-seconds", type=float, default=None, help="the whole check's budget (default: 480; tiny 120)")
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


def plan(args: argparse.Namespace, sizes: Sizes, dtype: str, budget: Budget, parity: list[str]) -> str:
    spec = CONFIGS[args.config]
    lines = [f"# gpu check: {args.config} ({spec['num_hidden_layers']} layers, hidden {spec['hidden_size']}, "
             f"{spec['num_attention_heads']}/{spec['num_key_value_heads']} heads, vocab {spec['vocab_size']}), random weights, "
             f"{dtype} on {args.device}; torch {torch.__version__}; budget {budget.total:.0f} s, of which the sections "
             f"take at most {sum(SHARES.values()) * budget.total:.0f} s"]
    what = {
        "parity tests (beside the build)": f"{', '.join(parity) or 'none'}{f' -k {args.parity_k!r}' if args.parity_k else ''} "
                                           f"with PREFILLBENCH_TEST_DEVICE={args.device}",
        "model build": "from the config, on the device",
        "GEMM peak and copy bandwidth": f"{sizes.gemm}^2 matmuls, a {sizes.copy_mb} MB copy",
        "workload: sequential and chunked": f"{sizes.requests} x pp{sizes.prompt}+tg{sizes.gen} (lengths ±{sizes.len_spread:.0%}), "
                                            f"c={sizes.concurrency}, chunk {sizes.chunk_size}",
        "prompt step": f"pp{sizes.pp}",
        "decode steps and piggyback": f"decode x{','.join(map(str, sizes.decodes))} at {sizes.context}; "
                                      f"chunk {sizes.chunk} + {sizes.k} decodes",
        "context scaling": f"decode x{sizes.long_batch} at {sizes.short_context} and {sizes.long_context}, cache {sizes.cache_len}",
        "attention kernels (profiler)": "each kind of step, once",
        "limits again": "the higher of the two counts",
    }
    for section, share in SHARES.items():
        lines.append(f"#   {section:34} at most {share * budget.total:5.0f} s: {what[section]}")
    return "\n".join(lines)


def guarded(results: dict[str, object], name: str, budget: Budget, fn: Callable[[], object]) -> None:
    """Run one section into results[name]: its value, or the one-line reason it has none (out of time, an error)."""
    if budget.left() <= 0:
        results[name] = "not run: out of time"
        return
    t0 = time.perf_counter()
    print(f"gpu check: {name}...", file=sys.stderr, flush=True)
    try:
        results[name] = fn()
    except Exception as e:  # noqa: BLE001: a section that fails is a failed row; the table still prints
        if os.environ.get("PREFILLBENCH_CHECK_TRACEBACK"):
            traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        results[name] = f"error: {type(e).__name__}: {first[:200]}"
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(f"gpu check: {name} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


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
    planned = plan(args, sizes, dtype, budget, parity_files)
    print(planned, flush=True)
    if args.device == "cpu":
        hold_freed_memory()
    results: dict[str, object] = {}
    parity = sections.ParityRun(args.device, parity_files, args.parity_k) if parity_files else None

    def build() -> Setup:
        model = build_from_config(args.config, DTYPES[dtype], args.device)
        options = dict(tune_linear=not args.no_tune_linear, cuda_graphs=not args.no_cuda_graphs)
        backend = TorchBackend(model, f"{args.config} (random weights)", args.device, **options)
        return Setup(backend, sizes, Clock(backend.torch_device), np.random.default_rng(0))

    guarded(results, "model build", budget, build)
    if parity is not None:
        results["parity tests (beside the build)"] = parity.wait(budget.share("parity tests (beside the build)")
                                                                 - (time.perf_counter() - parity.start))
    setup = results["model build"]
    header = [planned.splitlines()[0].removeprefix("# ")]
    if isinstance(setup, Setup):
        timed = {"GEMM peak and copy bandwidth": sections.limits, "workload: sequential and chunked": sections.workload,
                 "prompt step": sections.prefill, "decode steps and piggyback": sections.decode_steps,
                 "context scaling": sections.context_scaling, "attention kernels (profiler)": sections.attention_kernels,
                 "limits again": sections.limits}
        for name, fn in timed.items():
            guarded(results, name, budget, lambda fn=fn, name=name: fn(setup, budget.share(name)))
        costs = StepCosts.of(setup.backend)
        # After the sections: what the backend decided at prepare() (attention route, graphs, kernels) is in it.
        header.append("backend: " + "; ".join(f"{k} {v}" for k, v in setup.backend.metadata().items()))
        print(header[-1], flush=True)
    else:
        costs = None
    rows = rows_for(results, sizes, costs, args.device)
    print()
    print(markdown([], rows).lstrip("\n"))
    elapsed = time.perf_counter() - budget.start
    print(f"\n{sum(r.passed is True for r in rows)} of {sum(r.passed is not None for r in rows)} targets met, "
          f"in {elapsed:.0f} s of a {budget.total:.0f} s budget")
    if out := os.environ.get("OUT"):
        Path(out, "gpu_check.md").write_text(markdown(header, rows) + "\n")
    return 0 if all(r.passed is not False for r in rows) else 1


if __name__ == "__main__":
    cli.run(__name__)

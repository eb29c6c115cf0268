"""An attention kernel as it is now against the same kernel at an earlier git revision, alternated in one process.

Both sources are built as the backend builds them (c_kernels: same flags, headers beside the
source from the same revision) and called through ctypes on the same inputs: 30 layers of
SmolLM2-135M's heads (9 query, 3 K/V, 64 wide), 2 threads. Each rep runs every revision once,
so the machine's drift hits them alike; the table gives medians and the paired median ratio.
Outputs are compared (they should be equal or within rounding).

    python -m benchmarks.cpu.kernel_revisions decode_attention 85209ef [--dtype bfloat16]
    python -m benchmarks.cpu.kernel_revisions prefill_attention 85209ef

Revisions from before the backends moved into prefillbench/backends/torch/cpu/ are found at their old
place, prefillbench/backends/.
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from prefillbench.backends.torch.cpu import build as c_kernels
from prefillbench.backends.torch.cpu import decode_attention as cpu_decode_attention
from prefillbench.backends.torch.cpu import huge_pages

from benchmarks.lib import cli
from benchmarks.lib.models import DIM, HEADS, KV_HEADS, LAYERS
from benchmarks.lib.timing import Clock, time_interleaved

#: Where the kernels' sources are now, and where they were before the move (the folders relative to the repository).
KERNELS = Path(cpu_decode_attention.__file__).resolve().parent
ROOT = KERNELS.parents[3]
FOLDERS = ("prefillbench/backends/torch/cpu", "prefillbench/backends")


def build_at(revision: str, name: str, folder: Path) -> ctypes.CDLL:
    """The kernel `name`.c with the headers beside it, as they were at `revision`, built into a library."""
    for place in FOLDERS:
        listing = subprocess.run(["git", "ls-tree", "--name-only", revision, f"{place}/"], check=True,
                                 capture_output=True, text=True, cwd=ROOT).stdout.split()
        if f"{place}/{name}.c" in listing:
            break
    else:
        sys.exit(f"{name}.c is in none of {', '.join(FOLDERS)} at {revision}")
    for path in [p for p in listing if p.endswith(".h")] + [f"{place}/{name}.c"]:
        text = subprocess.run(["git", "show", f"{revision}:{path}"], check=True, capture_output=True, cwd=ROOT).stdout
        (folder / Path(path).name).write_bytes(text)
    return c_kernels._build(folder / f"{name}.c")


def decode_cases(libraries: dict[str, ctypes.CDLL], dtype: torch.dtype):
    """(label, bytes read per run, {revision: run}) per case; every revision's run reads the same inputs."""
    for library in libraries.values():
        fn = library.decode_attention
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5 + [ctypes.c_float, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    for n, length in ((1, 1024), (4, 1024), (16, 1024), (4, 128)):
        # the backend's cache lives in 2 MB pages: so do these
        keys = [huge_pages.empty([(n + 1, KV_HEADS, length + 64, DIM)], dtype)[0].normal_() for _ in range(LAYERS)]
        values = [huge_pages.empty([(n + 1, KV_HEADS, length + 64, DIM)], dtype)[0].normal_() for _ in range(LAYERS)]
        q, positions, slots = torch.randn(n, HEADS, DIM), torch.full((n,), length - 1), torch.arange(n)
        out = torch.empty_like(q)

        def run(fn, out=out, keys=keys, values=values, q=q, positions=positions, slots=slots, n=n, length=length):
            for k, v in zip(keys, values):
                fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), slots.data_ptr(), positions.data_ptr(), n, HEADS, KV_HEADS,
                   length + 64, DIM, DIM**-0.5, cpu_decode_attention.PARTS, out.data_ptr(), int(dtype == torch.bfloat16))
            return out.clone()

        runs = {name: functools.partial(run, lib.decode_attention) for name, lib in libraries.items()}
        yield f"{n} decodes at {length}", LAYERS * 2 * n * KV_HEADS * length * DIM * keys[0].element_size(), runs


def prefill_cases(libraries: dict[str, ctypes.CDLL], dtype: torch.dtype):
    """(label, FLOPs per run, {revision: run}) per case; every revision's run reads the same inputs."""
    p, i = ctypes.c_void_p, ctypes.c_int64
    for library in libraries.values():
        # The last argument, 0, asks for float32. Revisions before the bf16 path take one argument fewer; the
        # extra one then sits in a register they never read (x86-64 and AArch64 pass the first 8 integers so).
        library.prefill_attention.argtypes = [p, i, p, p, i, i, i, i, i, i, ctypes.c_float, p, i]
        library.prefill_attention.restype = ctypes.c_int
    for start, length in ((0, 256), (0, 512), (768, 256), (0, 1024)):
        max_len = start + length + 64
        keys = [torch.randn(KV_HEADS, max_len, DIM) for _ in range(LAYERS)]
        values = [torch.randn(KV_HEADS, max_len, DIM) for _ in range(LAYERS)]
        q = torch.randn(length, HEADS, DIM).transpose(0, 1)  # [heads, T, D] views of rows, as a qkv product lays them
        out = torch.empty(length, HEADS, DIM)

        def run(fn, out=out, keys=keys, values=values, q=q, start=start, length=length, max_len=max_len):
            for k, v in zip(keys, values):
                fn(q.data_ptr(), q.stride(1), k.data_ptr(), v.data_ptr(), max_len, start, length, HEADS, KV_HEADS, DIM,
                   DIM**-0.5, out.data_ptr(), 0)
            return out.clone()

        flops = LAYERS * HEADS * DIM * 4 * sum(start + t + 1 for t in range(length))  # causal pairs, QK and PV
        runs = {name: functools.partial(run, lib.prefill_attention) for name, lib in libraries.items()}
        yield f"{length} queries at offset {start}", flops, runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kernel", choices=("decode_attention", "prefill_attention"))
    parser.add_argument("revision", help="the earlier git revision (a commit, tag or branch)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="decode: the cache's dtype")
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--threads", type=int, default=2)


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    if args.kernel == "prefill_attention" and dtype != torch.float32:
        sys.exit("the prefill kernel is float32 only")
    with tempfile.TemporaryDirectory() as folder:
        libraries = {"now": c_kernels._build(KERNELS / f"{args.kernel}.c"),
                     args.revision: build_at(args.revision, args.kernel, Path(folder))}
    cases = decode_cases if args.kernel == "decode_attention" else prefill_cases
    print(f"# {args.kernel}, {args.dtype}, {LAYERS} layers of {HEADS}/{KV_HEADS} heads x {DIM}, "
          f"{torch.get_num_threads()} threads, {args.reps} alternated reps")
    rows = cases(libraries, dtype)
    unit = "GB/s" if args.kernel == "decode_attention" else "GFLOP/s"
    print(f"| case | now ms | {args.revision} ms | now {unit} | {args.revision} {unit} | now / {args.revision} (paired) | largest difference |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    clock = Clock(torch.device("cpu"))
    for label, work, runs in rows:
        times = time_interleaved(runs, args.reps, clock)
        now, old = times["now"], times[args.revision]
        diff = (runs["now"]().float() - runs[args.revision]().float()).abs().max().item()
        print(f"| {label} | {now.median * 1e3:.2f} | {old.median * 1e3:.2f} | {work / now.median / 1e9:.1f} | "
              f"{work / old.median / 1e9:.1f} | {now.paired_ratio(old):.3f} | {diff:.1e} |")


if __name__ == "__main__":
    cli.run(__name__)

"""prefillbench's gguf tg at concurrency 1 against llama.cpp's own llama-bench: same llama.cpp, same file, same threads.

Each round runs, in an order that rotates from round to round:

* prefillbench: the tg test as `prefillbench run -n 128 -c 1` runs it: a one-token prompt, then n decode steps
  through the engine (sequential strategy) on the gguf backend, t/s counted first to last token
  (`bench.metrics.request_rate`); the mean of --reps runs;
* bare loop (unless --no-bare): the same backend's llama.cpp context driven from Python with nothing of
  prefillbench: one llama_decode + llama_synchronize a token, no logits read (llama-bench's `test_gen`, written
  in Python). prefillbench / bare is what the harness adds; bare / llama-bench is what the process and the
  context (llama-cpp-python's build, ctypes, the context's sizes) add;
* llama-bench: `llama-bench -m MODEL -p 0 -n N -t T -r REPS -o json` (with its own warm-up), built from the
  installed llama-cpp-python's sdist by prefillbench.backends.server.build (make server) (the first run builds it: minutes);
* prefillbench + bar (--progress): the same inside the progress bar `prefillbench run` shows (rich's, which
  redraws from a thread of its own 10 times a second), advanced every step;
* llama-bench with prefillbench's batch sizes (--match-batch): `-b/-ub` set to the backend's n_batch/n_ubatch
  (1 for a tg run), to see whether the context's sizes account for a gap.

Prints each round's t/s and the ratios against llama-bench, then the medians over rounds. llama.cpp's threads
spin-wait: run it on an otherwise idle machine (a loaded one slows every contender, by different amounts).

Usage: python -m benchmarks.gguf.against_llama_bench [-m MODEL.gguf] [-t 2] [-n 128] [--rounds 3] [--reps 3]
           [--match-batch] [--progress] [--llama-bench-args "-fa on"]
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np

from prefillbench import engine
from prefillbench.backends.gguf import GGUFBackend
from prefillbench.bench.metrics import request_rate
from prefillbench.bench.workloads import TestSpec
from prefillbench.models import default_model_path
from prefillbench.sequence import Request
from strategies import make_strategy

from prefillbench.backends.server.build import llama_tool
from benchmarks.lib import cli


def prefillbench_tg(backend: GGUFBackend, n_gen: int, reps: int, rng: np.random.Generator, bar: bool = False) -> dict:
    """Mean t/s of `reps` tg runs through the engine, and the share of the timed span spent outside llama_decode.
    `bar`: inside the CLI's progress bar, advanced by every step as `prefillbench run` does (on stderr)."""
    test = TestSpec(0, n_gen)
    strategy = make_strategy("sequential")
    rates, outside, outside_us = [], [], []
    for _ in range(reps):
        prompt = (int(rng.integers(100, backend.vocab_size)),)
        if bar:
            from prefillbench.commands.session import progress_bar

            with progress_bar(True) as progress:
                task = progress.add_task(f"tg{n_gen}", total=n_gen + 2)
                record = engine.run(backend, strategy, [Request(prompt, test.tokens_to_generate)], 1,
                                    on_tokens=lambda k: progress.advance(task, k))
        else:
            record = engine.run(backend, strategy, [Request(prompt, test.tokens_to_generate)], 1)
        req = record.requests[0]
        rates.append(request_rate(test, req))
        span = req.token_times[-1] - req.token_times[0]
        rest = span - sum(backend.step_decode_seconds[1:])  # step 0 is the prompt's
        outside.append(rest / span)
        outside_us.append(1e6 * rest / n_gen)
    return {"ts": statistics.fmean(rates), "outside": statistics.fmean(outside), "outside_us": statistics.fmean(outside_us)}


def bare_tg(backend: GGUFBackend, n_gen: int, reps: int, rng: np.random.Generator) -> dict:
    """Mean t/s of `reps` runs of llama-bench's test_gen in Python on the backend's own context: a one-token prompt
    (untimed, as prefillbench's), then n_gen single-token decodes, no logits read."""
    import llama_cpp as llama

    backend.prepare(1, TestSpec(0, n_gen).max_seq_len, 1)  # what engine.run prepares: the same context
    ctx, batch, mem = backend.ctx, backend._batch, backend.mem
    tok, pos, seq, out = backend._tok, backend._pos, backend._seq, backend._out
    batch.n_tokens = 1
    seq[0], out[0] = 0, 1
    decode, sync = llama.llama_decode, llama.llama_synchronize
    rates = []
    for _ in range(reps):
        llama.llama_memory_clear(mem, False)
        tok[0], pos[0] = int(rng.integers(100, backend.vocab_size)), 0
        if decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed in the bare loop")
        sync(ctx)
        t0 = time.perf_counter()
        for p in range(1, n_gen + 1):
            tok[0], pos[0] = int(rng.integers(100, backend.vocab_size)), p
            decode(ctx, batch)
            sync(ctx)
        rates.append(n_gen / (time.perf_counter() - t0))
    llama.llama_memory_clear(mem, False)
    return {"ts": statistics.fmean(rates)}


def llama_bench_tg(tool: str, model: str, threads: int, n_gen: int, reps: int, extra: list[str]) -> dict:
    from prefillbench.backends.llama_kernels import extra_buffers

    # the kernels the gguf backend runs: llama.cpp's extra buffer types off where it keeps them off (an AMX CPU)
    repack = [] if extra_buffers()[0] else ["--repack", "0"]
    cmd = [tool, "-m", model, "-t", str(threads), "-p", "0", "-n", str(n_gen), "-r", str(reps), "-o", "json", *repack,
           *extra]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({res.returncode}): {res.stderr.strip()[-500:]}")
    rows = json.loads(res.stdout)
    if len(rows) != 1:
        raise RuntimeError(f"expected one llama-bench result, got {len(rows)} (extra args {extra})")
    row = rows[0]
    return {"ts": float(row["avg_ts"]), "row": row}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--model", default=None, help="a .gguf file (default: the shipped SmolLM2-135M-Instruct Q4_1)")
    parser.add_argument("-t", "--threads", type=int, default=2, help="threads for both (default: 2)")
    parser.add_argument("-n", "--n-gen", type=int, default=128, help="decode steps timed (default: 128, tg128)")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds (default: 3)")
    parser.add_argument("--reps", type=int, default=3, help="runs per contender per round, averaged (default: 3)")
    parser.add_argument("--no-bare", action="store_true", help="leave out the bare Python loop")
    parser.add_argument("--match-batch", action="store_true",
                        help="also run llama-bench with the backend's n_batch/n_ubatch (-b/-ub)")
    parser.add_argument("--progress", action="store_true",
                        help="also run prefillbench inside the CLI's progress bar (rich, on stderr), as `prefillbench run` does")
    parser.add_argument("--flash-attn", default="auto", choices=("on", "off", "auto"),
                        help="flash attention for both (default: auto, both tools' default)")
    parser.add_argument("--llama-bench-args", default="", help="extra arguments for every llama-bench run")
    parser.add_argument("--jobs", type=int, default=2, help="compile jobs if llama-bench must be built (default: 2)")


def main(args: argparse.Namespace) -> int:
    model = args.model or default_model_path()
    tool = str(llama_tool("llama-bench", jobs=args.jobs))
    backend = GGUFBackend.load(model, threads=args.threads, flash_attn=args.flash_attn)
    rng = np.random.default_rng(0)
    extra = ["-fa", args.flash_attn, *shlex.split(args.llama_bench_args)]

    # Warm up prefillbench once (the context is made here), and learn the batch sizes a tg run prepares.
    prefillbench_tg(backend, args.n_gen, 1, rng)
    meta = backend.metadata()
    contenders = {"prefillbench": lambda: prefillbench_tg(backend, args.n_gen, args.reps, rng)}
    if args.progress:
        contenders["prefillbench + bar"] = lambda: prefillbench_tg(backend, args.n_gen, args.reps, rng, bar=True)
    if not args.no_bare:
        contenders["bare loop"] = lambda: bare_tg(backend, args.n_gen, args.reps, rng)
    contenders["llama-bench"] = lambda: llama_bench_tg(tool, model, args.threads, args.n_gen, args.reps, extra)
    if args.match_batch:
        matched = [*extra, "-b", str(backend.n_batch), "-ub", str(backend.n_ubatch)]
        contenders[f"llama-bench -b {backend.n_batch} -ub {backend.n_ubatch}"] = (
            lambda: llama_bench_tg(tool, model, args.threads, args.n_gen, args.reps, matched))

    first = llama_bench_tg(tool, model, args.threads, 1, 1, extra)["row"]  # checks the tool runs; its build
    print(f"tg{args.n_gen} at c=1, {args.threads} thread(s), flash attention {args.flash_attn}, {args.rounds} rounds "
          f"of {args.reps} run(s) per contender, order rotated")
    print(f"model {model}")
    print(f"backend: llama-cpp-python {meta['llama_cpp_python']}, ggml {meta['ggml']}, n_ctx {meta['n_ctx']}, "
          f"n_batch {backend.n_batch}, n_ubatch {backend.n_ubatch}")
    print(f"llama-bench: {tool} (build {first.get('build_commit')}, {first.get('backends')}, "
          f"n_batch {first.get('n_batch')}, n_ubatch {first.get('n_ubatch')})")

    names = list(contenders)
    ts: dict[str, list[float]] = {name: [] for name in names}
    outside: list[float] = []
    outside_us: list[float] = []
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            res = contenders[name]()
            ts[name].append(res["ts"])
            if name == "prefillbench":
                outside.append(res["outside"])
                outside_us.append(res["outside_us"])
        ref = ts["llama-bench"][-1]
        cells = [f"{name} {ts[name][-1]:.1f} t/s" for name in names]
        ratios = [f"{name}/llama-bench {ts[name][-1] / ref:.3f}" for name in names if name != "llama-bench"]
        print(f"round {r + 1} (order: {', '.join(order)}): " + "; ".join(cells) + " | " + "; ".join(ratios)
              + f" | prefillbench outside llama_decode {100 * outside[-1]:.2f}% ({outside_us[-1]:.0f} us a token)",
              flush=True)

    med = {name: statistics.median(v) for name, v in ts.items()}
    ratio_med = {name: statistics.median([a / b for a, b in zip(ts[name], ts["llama-bench"])])
                 for name in names if name != "llama-bench"}
    spread = {name: (max(v) - min(v)) / statistics.median(v) for name, v in ts.items()}
    print("median over rounds: " + "; ".join(f"{name} {med[name]:.1f} t/s (spread {100 * spread[name]:.0f}%)"
                                             for name in names))
    if max(spread.values()) > 0.1:
        print("warning: a contender moved by more than 10% between rounds: the machine is not quiet, "
              "and the ratios below mean little")
    print("median ratio per round: " + "; ".join(f"{name}/llama-bench {v:.3f}" for name, v in ratio_med.items()))
    if "bare loop" in ts:
        per_round = statistics.median([a / b for a, b in zip(ts["prefillbench"], ts["bare loop"])])
        print(f"median prefillbench/bare loop: {per_round:.3f} (what the harness adds on top of a Python "
              f"llama_decode loop); prefillbench's time outside llama_decode: {100 * statistics.median(outside):.2f}% "
              f"({statistics.median(outside_us):.0f} us a token)")
    backend.close()
    return 0


if __name__ == "__main__":
    cli.run(__name__)

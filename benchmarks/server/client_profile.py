"""Where the streaming client's microseconds go: one open loop against the stub server under cProfile, the client's
CPU per streamed token, and its functions by their own time (tottime), as microseconds per streamed token.

  python -m benchmarks.server.client_profile --rate 100 --tokens 100 --seconds 5 --api openai
  python -m benchmarks.server.client_profile --module old_client    # another client (a module with stream_requests)
  python -m benchmarks.server.client_profile --no-profile           # the CPU per token and send lag, unprofiled

cProfile (timed by the process's CPU clock, so that time the process waited for a core is not counted) slows what it
profiles (by about half again on this client): the per-token figures say where the time
goes, the un-profiled run (client_scale.py, client_load.py) what it costs.
"""
from __future__ import annotations

import argparse
import cProfile
import importlib
import pstats
import sys
import time

import numpy as np

from benchmarks.lib import cli
from prefillbench.backends.server.process import ServerProcess, free_port
from prefillbench.sequence import Request


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=100.0, help="requests a second (default 100)")
    parser.add_argument("--tokens", type=int, default=100, help="tokens each request streams (default 100)")
    parser.add_argument("--seconds", type=float, default=5.0, help="the arrivals span this long (default 5)")
    parser.add_argument("--token-ms", type=float, default=10.0, help="the stub's pace (default 10 ms)")
    parser.add_argument("--api", choices=("llama", "openai"), default="openai", help="the stream (default openai)")
    parser.add_argument("--module", default="prefillbench.backends.server.client", help="the client's module")
    parser.add_argument("--top", type=int, default=15, help="functions shown (default 15)")
    parser.add_argument("--no-profile", action="store_true", help="only the CPU per token and the send lag, unprofiled")


def main(args: argparse.Namespace) -> int:
    client = importlib.import_module(args.module)
    port = free_port()
    server = ServerProcess([sys.executable, "-m", "prefillbench.backends.server.stub", "--port", str(port),
                            "--token-ms", str(args.token_ms)], f"http://127.0.0.1:{port}/health")
    server.start()
    n = max(int(args.rate * args.seconds), 2)
    gaps = np.random.default_rng(7).exponential(1.0 / args.rate, n)
    arrivals = np.cumsum(gaps) - gaps[0]
    requests = [Request(tuple(range(i % 1000, i % 1000 + 64)), args.tokens, float(t)) for i, t in enumerate(arrivals)]
    profile = cProfile.Profile(time.process_time)  # CPU time: a machine shared with others does not count
    try:
        cpu0 = time.process_time()
        if not args.no_profile:
            profile.enable()
        run = client.stream_requests(f"http://127.0.0.1:{port}", args.api, requests, 0)
        profile.disable()
        cpu = time.process_time() - cpu0
    finally:
        server.stop()
    tokens = sum(len(s.tokens) for s in run.done if s.error is None)
    lags = np.array([s.lag for s in run.done]) * 1e3
    print(f"{args.module}: {n} requests at {args.rate:g}/s x {args.tokens} tokens ({args.api}), {tokens} tokens, "
          f"{sum(s.error is not None for s in run.done)} failed; {'' if args.no_profile else 'profiled '}CPU "
          f"{1e6 * cpu / max(tokens, 1):.1f} us/token, send lag p99 {np.percentile(lags, 99):.1f} ms\n")
    if args.no_profile:
        return 0
    stats = pstats.Stats(profile)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:args.top]
    print("| us/token (own) | us/token (with callees) | calls/token | function |")
    print("| ---: | ---: | ---: | --- |")
    for (path, line, name), (_, calls, own, cumulative, _) in rows:
        where = f"{path.rsplit('site-packages/', 1)[-1].rsplit('/work/main/', 1)[-1]}:{line}({name})"
        print(f"| {1e6 * own / tokens:.2f} | {1e6 * cumulative / tokens:.2f} | {calls / tokens:.2f} | {where} |")
    return 0


if __name__ == "__main__":
    cli.run(__name__)

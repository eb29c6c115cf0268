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
import time

import numpy as np

from benchmarks.lib import cli
from benchmarks.lib.stub_load import open_loop, stub_server


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
    n = max(int(args.rate * args.seconds), 2)
    requests = open_loop(n, args.rate, 64, args.tokens)
    profile = cProfile.Profile(time.process_time)  # CPU time: a machine shared with others does not count
    with stub_server(args.token_ms) as url:
        cpu0 = time.process_time()
        if not args.no_profile:
            profile.enable()
        run = client.stream_requests(url, args.api, requests, 0)
        profile.disable()
        cpu = time.process_time() - cpu0
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

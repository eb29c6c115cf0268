"""What one client machine can drive: prefillbench's streaming client alone against the stub server, which streams
tokens at a set pace and schedules nothing, at rising request rates. Per rate: the send lag (actual minus scheduled
send time) p50/p99, the client's CPU time per streamed token, and whether every request completed.

  python -m benchmarks.server.client_load --rates 10,25,50,100 --tokens 100 --seconds 10
  python -m benchmarks.server.client_load --module old_client    # another client (a module with stream_requests)

Both streams by default (`--apis llama,openai`): llama-server's /completion and the OpenAI /v1/completions that
vLLM and SGLang serve, their events of different sizes and fields.

The stub runs in a process of its own (on this 2-core VM it shares the cores with the client, as an engine would
not: its cost is its own process's CPU time, reported apart).
"""
from __future__ import annotations

import argparse
import importlib
import resource
import time

import numpy as np

from benchmarks.lib import cli
from benchmarks.lib.stub_load import open_loop, stub_server


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rates", default="10,25,50,100", help="requests per second, a comma list")
    parser.add_argument("--tokens", type=int, default=100, help="tokens each request streams")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens each request sends")
    parser.add_argument("--seconds", type=float, default=10.0, help="arrivals span this long at each rate")
    parser.add_argument("--token-ms", type=float, default=10.0, help="the stub's pace: ms between a request's tokens")
    parser.add_argument("--apis", default="llama,openai", help="the streams, a comma list (default both)")
    parser.add_argument("--module", default="prefillbench.backends.server.client", help="the client's module")


def main(args: argparse.Namespace) -> None:
    client = importlib.import_module(args.module)
    print(f"{args.module}, the stub pacing {args.token_ms:g} ms a token, {args.tokens} tokens a request\n")
    print("| stream | rate req/s | requests | failed | send lag p50 ms | send lag p99 ms | client CPU us/token | "
          "client CPU % |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    with stub_server(args.token_ms) as url:
        for api, rate in ((a, float(r)) for a in args.apis.split(",") for r in args.rates.split(",")):
            n = max(int(rate * args.seconds), 2)
            requests = open_loop(n, rate, args.prompt, args.tokens)
            cpu0, wall0 = _cpu(), time.perf_counter()
            run = client.stream_requests(url, api, requests, 0)
            cpu, wall = _cpu() - cpu0, time.perf_counter() - wall0
            lags = np.array([s.lag for s in run.done]) * 1e3
            tokens = sum(len(s.tokens) for s in run.done)
            failed = sum(s.error is not None for s in run.done)
            print(f"| {api} | {rate:g} | {n} | {failed} | {np.percentile(lags, 50):.2f} | {np.percentile(lags, 99):.2f} | "
                  f"{1e6 * cpu / max(tokens, 1):.1f} | {100 * cpu / wall:.0f} |", flush=True)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    cli.run(__name__)

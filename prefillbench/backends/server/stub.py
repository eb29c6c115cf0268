"""A stub of llama-server's streaming API that streams tokens at a set pace: for the client's own benchmark (what
one client machine can drive, with no engine sharing its cores) and for tests of the server path (launch, health,
streaming, failures, lifecycle) that need no build.

  python -m prefillbench.backends.server.stub --port P [--token-ms 5] [--prompt-ms-per-token 0.01]
      [--fail-every N] [--short-every N] [--die-after N] [--cut-after N] [--slow-start S] [--exit-at-start]
      [--served-model-name NAME] [--ms-per-running MS] [--metrics-scale X] [--slots N] [--ctx N]

Each request: `prompt_progress` events, then n_predict tokens, one event each, every --token-ms, with
llama-server's `timings` (its own clock) on every event, and a last event with `stop`. Requests run concurrently
(no scheduler: each is paced on its own; with --ms-per-running, each token's gap grows by that much for every
other request streaming, as a batch's step grows with its size, so that a rate search ends at a finite rate).

It also serves `/v1/completions` as vLLM does: a text chunk a token, the last with its `finish_reason`, then the
usage (`stream_options.include_usage`) and `[DONE]`. With --served-model-name, a request whose `model` is neither
empty nor that name answers 404, as vLLM answers a model it does not serve.

Its own clock, as the engines publish theirs: `/metrics` in vLLM's Prometheus format (the histograms
`vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`, `vllm:request_queue_time_seconds`,
`vllm:request_prefill_time_seconds`, `vllm:request_decode_time_seconds`, with vLLM's default buckets) fed by the
/v1/completions requests, and llama-server's counters (`llamacpp:tokens_predicted_total`, ...) fed by /completion's,
each from the stub's own times of the tokens it paced. `--metrics-scale X` multiplies every duration it reports
there (X=2: an engine whose clock says twice what the client sees), so a test can make the two clocks disagree.
And what a server says of itself: vLLM's /v1/models and /version, llama-server's /props (--slots, --ctx).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="prefillbench-stub-server", allow_abbrev=False)  # engine flags follow
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--token-ms", type=float, default=5.0)
    parser.add_argument("--prompt-ms-per-token", type=float, default=0.01)
    parser.add_argument("--fail-every", type=int, default=0, help="every Nth request answers HTTP 500")
    parser.add_argument("--short-every", type=int, default=0, help="every Nth request stops one token short")
    parser.add_argument("--die-after", type=int, default=0, help="the process exits during its Nth request")
    parser.add_argument("--cut-after", type=int, default=0,
                        help="during its Nth request, after the first token, the stream is cut and the process "
                             "exits a moment later (as a killed engine's does: its socket closes before it is reaped)")
    parser.add_argument("--slow-start", type=float, default=0.0, help="seconds /health answers 503 (loading)")
    parser.add_argument("--exit-at-start", action="store_true", help="print a line and exit 1 (a bad command)")
    parser.add_argument("--pair-every", type=int, default=0, help="every Nth token event carries two tokens")
    parser.add_argument("--ms-per-running", type=float, default=0.0,
                        help="each token's gap grows by this much for every other request streaming")
    parser.add_argument("--served-model-name", default=None,
                        help="/v1/completions: refuse (404) a request naming another model, as vLLM does")
    parser.add_argument("--metrics-scale", type=float, default=1.0,
                        help="/metrics reports every duration times this (1: the truth)")
    parser.add_argument("--slots", type=int, default=4, help="/props: total_slots")
    parser.add_argument("--ctx", type=int, default=4096, help="/props: n_ctx per slot; /v1/models: max_model_len")
    args, _ = parser.parse_known_args(argv)  # the strategy's flags (-b ...) follow; a stub takes none of them
    if args.exit_at_start:
        print("stub: refusing to start (--exit-at-start)", flush=True)
        sys.exit(1)
    asyncio.run(_serve(args))


async def _serve(args) -> None:
    from aiohttp import web

    started = time.monotonic()
    clock = _Clock(args.metrics_scale, args.served_model_name or "stub")
    count = 0
    running = 0  # requests streaming now
    cutting = False  # --cut-after reached: the next token sent cuts its stream

    def gap_s() -> float:
        return (args.token_ms + args.ms_per_running * max(running - 1, 0)) / 1e3

    async def health(request):
        if time.monotonic() - started < args.slow_start:
            return web.json_response({"error": {"message": "Loading model"}}, status=503)
        return web.json_response({"status": "ok"})

    async def serve_one(asked: int, stream):
        """The failures the stub was told to make (exit, HTTP 500, one token short), then `stream(asked)`,
        counted as running while it streams."""
        nonlocal count, running, cutting
        count += 1
        n = count
        if args.die_after and n >= args.die_after:
            os._exit(3)
        if args.cut_after and n >= args.cut_after:
            cutting = True
        if args.fail_every and n % args.fail_every == 0:
            return web.json_response({"error": {"message": "stub failure"}}, status=500)
        if args.short_every and n % args.short_every == 0:
            asked -= 1
        running += 1
        try:
            return await stream(asked)
        finally:
            running -= 1

    async def cut(request) -> None:
        """After a request's first token, once told to: its stream cut, the process gone 0.3 s later."""
        if cutting:
            request.transport.abort()
            await asyncio.sleep(0.3)
            os._exit(3)

    served_prompts: list[list[int]] = []  # every prompt served, for cache_prompt (llama-server's prompt cache)

    def cached_prefix(prompt: list[int]) -> int:
        """The longest prefix `prompt` shares with a prompt served before, never its last token."""
        best = 0
        for old in served_prompts:
            n = 0
            for a, b in zip(old, prompt):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return min(best, max(len(prompt) - 1, 0))

    async def completion(request):
        body = await request.json()
        prompt = body.get("prompt") or []
        cache_n = cached_prefix(prompt) if body.get("cache_prompt") else 0
        served_prompts.append(list(prompt))
        return await serve_one(int(body.get("n_predict", 16)),
                               lambda n_predict: stream_llama(request, prompt, n_predict, cache_n))

    async def stream_llama(request, prompt, n_predict, cache_n=0):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        slot_start = time.perf_counter()

        async def send(event: dict) -> None:
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")

        prompt_s = (len(prompt) - cache_n) * args.prompt_ms_per_token / 1e3
        # As llama-server sends them: a progress event carries a placeholder token and tokens_predicted 0.
        await send({"content": "", "tokens": [0], "stop": False, "tokens_predicted": 0,
                    "prompt_progress": {"total": len(prompt), "cache": 0, "processed": 0, "time_ms": 0.0}})
        await asyncio.sleep(prompt_s)
        prompt_ms = 1e3 * (time.perf_counter() - slot_start)
        await send({"content": "", "tokens": [0], "stop": False, "tokens_predicted": 0,
                    "prompt_progress": {"total": len(prompt), "cache": 0, "processed": len(prompt), "time_ms": prompt_ms}})
        produced, events = 0, 0
        first_at = last_at = None
        while produced < n_predict:
            events += 1
            k = 2 if args.pair_every and events % args.pair_every == 0 and produced + 2 <= n_predict else 1
            if produced:
                await asyncio.sleep(k * gap_s())
            predicted_ms = 1e3 * (time.perf_counter() - slot_start) - prompt_ms
            last_at = time.perf_counter()
            first_at = first_at if first_at is not None else last_at
            produced += k
            await send({"content": "x" * k, "tokens": list(range(produced - k, produced)), "stop": False,
                        "tokens_predicted": produced,
                        "timings": {"cache_n": cache_n, "prompt_n": len(prompt) - cache_n, "prompt_ms": prompt_ms,
                                    "predicted_n": produced, "predicted_ms": predicted_ms}})
            await cut(request)
        clock.llama(len(prompt), prompt_ms / 1e3, produced, (last_at - first_at) if first_at is not None else 0.0)
        await send({"content": "", "tokens": [], "stop": True, "stop_type": "limit", "tokens_predicted": produced,
                    "timings": {"cache_n": cache_n, "prompt_n": len(prompt) - cache_n, "prompt_ms": prompt_ms,
                                "predicted_n": produced,
                                "predicted_ms": 1e3 * (time.perf_counter() - slot_start) - prompt_ms}})
        await response.write_eof()
        return response

    async def openai_completion(request):
        """/v1/completions as vLLM streams it: one text chunk a token, then the usage, then [DONE]."""
        body = await request.json()
        model = body.get("model") or ""
        if args.served_model_name is not None and model and model != args.served_model_name:
            # vLLM's _check_model: a model name it does not serve is 404, never served as its own
            return web.json_response({"object": "error", "message": f"The model `{model}` does not exist.",
                                      "type": "NotFoundError", "code": 404}, status=404)
        prompt = body.get("prompt") or []
        return await serve_one(int(body.get("max_tokens", 16)),
                               lambda max_tokens: stream_openai(request, body, model, prompt, max_tokens))

    async def stream_openai(request, body, model, prompt, max_tokens):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(event) -> None:
            data = event if isinstance(event, str) else json.dumps(event)
            await response.write(b"data: " + data.encode() + b"\n\n")

        arrived = time.perf_counter()
        await asyncio.sleep(len(prompt) * args.prompt_ms_per_token / 1e3)
        times = []
        for i in range(max_tokens):
            if i:
                await asyncio.sleep(gap_s())
            times.append(time.perf_counter())
            last = i == max_tokens - 1
            await send({"object": "text_completion", "model": model or args.served_model_name or "stub",
                        "choices": [{"index": 0, "text": "x", "finish_reason": "length" if last else None}]})
            await cut(request)
        clock.vllm(arrived, times)
        if (body.get("stream_options") or {}).get("include_usage"):
            await send({"object": "text_completion", "choices": [],
                        "usage": {"prompt_tokens": len(prompt), "completion_tokens": max_tokens,
                                  "total_tokens": len(prompt) + max_tokens}})
        await send("[DONE]")
        await response.write_eof()
        return response

    async def metrics(request):
        return web.Response(text=clock.text(), content_type="text/plain")

    async def models(request):
        name = args.served_model_name or "stub"
        return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "root": name,
                                                             "max_model_len": args.ctx}]})

    async def version(request):
        return web.json_response({"version": "stub"})

    async def props(request):
        return web.json_response({"default_generation_settings": {"n_ctx": args.ctx}, "total_slots": args.slots,
                                  "model_path": "stub.gguf", "build_info": "stub"})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", version)
    app.router.add_get("/props", props)
    app.router.add_post("/completion", completion)
    app.router.add_post("/v1/completions", openai_completion)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    print(f"stub: listening on {args.host}:{args.port}", flush=True)
    await asyncio.Event().wait()


#: vLLM's default buckets (vllm/v1/metrics/buckets.py, 0.32), so the stub's histograms resolve as vLLM's do.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)


class _Clock:
    """The stub's own account of its requests, in the engines' /metrics formats; every duration times `scale`."""

    HISTOGRAMS = (("vllm:time_to_first_token_seconds", TTFT_BUCKETS), ("vllm:inter_token_latency_seconds", ITL_BUCKETS),
                  ("vllm:request_queue_time_seconds", REQUEST_BUCKETS),
                  ("vllm:request_prefill_time_seconds", REQUEST_BUCKETS),
                  ("vllm:request_decode_time_seconds", REQUEST_BUCKETS),
                  ("vllm:e2e_request_latency_seconds", REQUEST_BUCKETS))

    def __init__(self, scale: float, model: str) -> None:
        self.scale, self.model = scale, model
        self.observed: dict[str, list[float]] = {name: [] for name, _ in self.HISTOGRAMS}
        self.counters = {"prompt_tokens_total": 0.0, "prompt_seconds_total": 0.0, "tokens_predicted_total": 0.0,
                         "tokens_predicted_seconds_total": 0.0}

    def vllm(self, arrived: float, times: list[float]) -> None:
        """One /v1/completions request: it arrived, its tokens went out at `times` (no queue: it runs at once)."""
        if not times:
            return
        s = self.scale
        self.observed["vllm:time_to_first_token_seconds"].append(s * (times[0] - arrived))
        self.observed["vllm:inter_token_latency_seconds"] += [s * (b - a) for a, b in zip(times, times[1:])]
        self.observed["vllm:request_queue_time_seconds"].append(0.0)
        self.observed["vllm:request_prefill_time_seconds"].append(s * (times[0] - arrived))
        self.observed["vllm:request_decode_time_seconds"].append(s * (times[-1] - times[0]))
        self.observed["vllm:e2e_request_latency_seconds"].append(s * (times[-1] - arrived))

    def llama(self, prompt_tokens: int, prompt_s: float, predicted: int, predicted_s: float) -> None:
        self.counters["prompt_tokens_total"] += prompt_tokens
        self.counters["prompt_seconds_total"] += self.scale * prompt_s
        self.counters["tokens_predicted_total"] += predicted
        self.counters["tokens_predicted_seconds_total"] += self.scale * predicted_s

    def text(self) -> str:
        labels = f'engine="0",model_name="{self.model}"'
        lines = []
        for name, bounds in self.HISTOGRAMS:
            values = self.observed[name]
            lines += [f"# HELP {name} the stub's own clock", f"# TYPE {name} histogram"]
            for bound in (*bounds, float("inf")):
                le = "+Inf" if bound == float("inf") else repr(float(bound))
                lines.append(f'{name}_bucket{{{labels},le="{le}"}} {float(sum(v <= bound for v in values))}')
            lines += [f"{name}_count{{{labels}}} {float(len(values))}", f"{name}_sum{{{labels}}} {sum(values)!r}"]
        for name, value in self.counters.items():
            lines += [f"# HELP llamacpp:{name} the stub's own clock", f"# TYPE llamacpp:{name} counter",
                      f"llamacpp:{name} {value!r}"]
        return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

"""A streaming client made for measurement: asyncio and aiohttp, one keep-alive connection per request in flight,
every streamed event stamped with the client's clock on arrival.

Each request's scheduled and actual send time are kept (the difference is the client's lag, reported). Where the
engine sends its own clock per token (llama-server's `timings_per_token`), both clocks are kept, and an event that
carries several tokens is split by the server's clock rather than counted as one long gap and a zero one (vLLM's
`bench serve` counts it as one: vllm#27485). Prompt progress events (llama-server's `return_progress`) give when a
request's prompt started, the scheduling delay's end. A request that fails (an HTTP error, a dropped stream, fewer
tokens than asked, a prompt served from the cache) is kept as failed with its reason, never dropped.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefillbench.sequence import Request, SessionTurns, queue_by_arrival

clock = time.perf_counter


@dataclass
class Streamed:
    """One request as the client saw it. Times are perf_counter seconds."""

    request: Request
    scheduled: float  # when it was due: its arrival (open loop), or when a place in flight freed (closed loop)
    sent: float | None = None
    token_times: list[float] = field(default_factory=list)
    server_token_times: list[float] = field(default_factory=list)  # the engine's clock, ms from the slot's start
    tokens: list[int] = field(default_factory=list)
    first_scheduled: float | None = None  # the prompt's start, from the engine's progress events
    cached_tokens: int | None = None  # prompt tokens the engine found in its prefix cache, as it reported them
    error: str | None = None
    events: int = 0
    queued: bool = False  # it waited for a place in flight (the concurrency cap): its send time is not lag
    # the OpenAI stream's reading state (OpenAIApi): the last token event's arrival, the last chunk's start and size
    last_event_at: float | None = None
    chunk_start: float | None = None
    chunk_tokens: int = 0

    @property
    def lag(self) -> float:
        return (self.sent - self.scheduled) if self.sent is not None else 0.0


@dataclass
class StreamRun:
    start: float
    end: float
    done: list[Streamed]  # in the order they finished
    stopped: bool = False
    # the engine's own clock over the run (engine_clock.Reading), set by the backend where its /metrics could be read
    engine_clock: Any = None


class Api:
    """How to ask one engine for a stream and read its events; `cache`: the engine's prefix cache is on (its
    reported cached tokens are kept), or off (any it reports fails the request: the run meant every prompt whole)."""

    path = ""

    def __init__(self, cache: bool = False) -> None:
        self.cache = cache

    def cached(self, n: int, s: Streamed) -> None:
        """The engine said `n` of the request's prompt tokens came from its cache."""
        if self.cache:
            s.cached_tokens = n
        elif n:
            s.error = f"{n} prompt tokens came from the server's prompt cache"

    def body(self, request: Request, model: str) -> dict[str, Any]:
        raise NotImplementedError

    def read(self, event: dict[str, Any], arrived: float, s: Streamed) -> bool:
        """Take one event into `s`; True when it is the last."""
        raise NotImplementedError


class LlamaApi(Api):
    """llama-server's native /completion: token ids in, token ids out, its clock and prompt progress."""

    path = "/completion"

    def body(self, request: Request, model: str) -> dict[str, Any]:
        return {"prompt": list(request.prompt), "n_predict": request.n_gen, "ignore_eos": True, "stream": True,
                "cache_prompt": self.cache, "timings_per_token": True, "return_progress": True, "temperature": 0.0,
                "return_tokens": True}

    def read(self, event: dict[str, Any], arrived: float, s: Streamed) -> bool:
        progress = event.get("prompt_progress")
        if progress is not None:
            # Every progress event dates the prompt's start from above: its arrival less the engine's time since that
            # start (time_ms, the same origin as the token timings). The least is the best bound: the 0% event is
            # sent just before the prompt's first batch, which on a machine with no core to spare keeps the client
            # from reading it until the batch is done (18 ms late at c=4 on 2 cores, CI); the batch's own event
            # comes with its elapsed time and is not late.
            start = arrived - progress.get("time_ms", 0.0) / 1e3
            s.first_scheduled = start if s.first_scheduled is None else min(s.first_scheduled, start)
        tokens = event.get("tokens") or []
        predicted = event.get("tokens_predicted")
        if predicted is not None:
            # Prompt progress events carry a placeholder token ([0]) with tokens_predicted 0: only the count of
            # tokens generated says which of an event's tokens are new.
            new = predicted - len(s.tokens)
            tokens = tokens[-new:] if new > 0 else []
        timings = event.get("timings") or {}
        if tokens:
            # The server's time of the last of them: prompt done plus generation so far, ms from the slot's start.
            server_now = timings.get("prompt_ms", 0.0) + timings.get("predicted_ms", 0.0) if timings else None
            previous = s.server_token_times[-1] if s.server_token_times else None
            k = len(tokens)
            for i in range(k):
                if server_now is not None and previous is not None and k > 1:
                    server_i = previous + (i + 1) / k * (server_now - previous)
                    s.token_times.append(arrived - (server_now - server_i) / 1e3)
                    s.server_token_times.append(server_i)
                else:
                    s.token_times.append(arrived)
                    if server_now is not None:
                        s.server_token_times.append(server_now)
            s.tokens.extend(int(t) for t in tokens)
        if event.get("stop"):
            self.cached(int(timings.get("cache_n", 0)), s)
            return True
        return False


class OpenAIApi(Api):
    """/v1/completions as vLLM, SGLang and TGI serve it: token ids in, a stream of chunks out, then a usage event
    (`"choices": []`, asked for with `include_usage`), then `[DONE]`.

    Tokens are counted per chunk exactly where the engine says which it carries (vLLM's `return_token_ids`: each
    chunk's `token_ids` are its delta), else one a chunk with text; the usage event's `completion_tokens` is the
    check, and tokens it counts beyond the chunks' are the last chunk's. A chunk carrying k > 1 tokens (an engine
    that ran several steps between two sends, a detokenizer holding text back) is split evenly between the previous
    event's arrival and its own: its tokens were made in that interval, and the client has no clock finer than its
    events (no engine sends its own here, as llama-server does). Stamped all at its arrival, it would count as one
    long gap and k-1 gaps of zero (vllm#27485); split, the median and the sum of the gaps are both right for tokens
    made at an even pace."""

    path = "/v1/completions"

    def body(self, request: Request, model: str) -> dict[str, Any]:
        return {"model": model, "prompt": list(request.prompt), "max_tokens": request.n_gen, "ignore_eos": True,
                "stream": True, "temperature": 0.0, "stream_options": {"include_usage": True},
                "return_token_ids": True}

    def read(self, event: dict[str, Any], arrived: float, s: Streamed) -> bool:
        for choice in event.get("choices") or []:
            ids = choice.get("token_ids")
            if ids is not None:
                tokens = [int(t) for t in ids]
            elif choice.get("text") is not None and (choice.get("text") or not choice.get("finish_reason")):
                tokens = [-1]
            else:
                tokens = []
            if tokens:
                _stamp(s, tokens, arrived)
        usage = event.get("usage")
        if usage and not event.get("choices"):
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:  # vLLM with --enable-prompt-tokens-details
                self.cached(int(details["cached_tokens"]), s)
            told = int(usage.get("completion_tokens", len(s.tokens)))
            if told > len(s.tokens):
                # chunks that carried several tokens without saying which: the rest are the last chunk's, spread
                # with its own over its interval
                s.tokens.extend([-1] * (told - len(s.tokens)))
                del s.token_times[len(s.token_times) - s.chunk_tokens:]
                start, end = (s.chunk_start, s.last_event_at) if s.chunk_tokens else (None, arrived)
                _spread(s, told - len(s.token_times), start, end)
            return True
        return False


def _stamp(s: Streamed, tokens: list[int], arrived: float) -> None:
    """A chunk's tokens, spread over (the previous token event, `arrived`]. The first chunk's all at its arrival:
    before it the prompt ran, and nothing tells when its tokens' steps did."""
    s.tokens.extend(tokens)
    _spread(s, len(tokens), s.last_event_at, arrived)
    s.chunk_start, s.chunk_tokens, s.last_event_at = s.last_event_at, len(tokens), arrived


def _spread(s: Streamed, k: int, start: float | None, end: float) -> None:
    s.token_times.extend(end if start is None else start + (i + 1) / k * (end - start) for i in range(k))


APIS: dict[str, type[Api]] = {"llama": LlamaApi, "openai": OpenAIApi}


async def _stream_one(session, url: str, api: Api, model: str, s: Streamed, headers: dict[str, str]) -> None:
    import aiohttp

    s.sent = clock()
    for attempt in (0, 1):
        try:
            await _post(session, url, api, model, s, headers)
            break
        except aiohttp.ServerDisconnectedError:
            # A kept-alive connection the server had closed, found so before a byte came back: the request never
            # reached it; once more, on a fresh connection. Past the first event it is a dropped stream.
            if attempt or s.events:
                s.error = "ServerDisconnectedError: the server closed the stream"
                return
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
            s.error = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
            return
    if s.error is None and len(s.tokens) < s.request.n_gen:
        s.error = f"{len(s.tokens)} of {s.request.n_gen} tokens"


async def _post(session, url: str, api: Api, model: str, s: Streamed, headers: dict[str, str]) -> None:
    """One request and its stream, read into `s`."""
    async with session.post(url + api.path, json=api.body(s.request, model), headers=headers) as response:
        if response.status != 200:
            text = (await response.text())[:200]
            s.error = f"HTTP {response.status}: {' '.join(text.split())}"
            return
        finished = False
        async for raw in response.content:
            arrived = clock()
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            try:
                event = json.loads(data)
            except json.JSONDecodeError:
                s.error = "a malformed event in the stream"
                return
            if not isinstance(event, dict):
                s.error = "an event in the stream that is not a JSON object"
                return
            if "error" in event:
                s.error = f"the server's error: {str(event['error'])[:200]}"
                return
            s.events += 1
            try:
                finished = api.read(event, arrived, s) or finished
            except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
                # a field of another shape than the API's (a server of another version): this request failed, the
                # run goes on and counts it
                s.error = f"an event the client could not read ({type(e).__name__}: {str(e)[:120]})"
                return
        if not finished:
            s.error = "the stream ended before its last event"


def stream_requests(url: str, api_name: str, requests: list[Request], concurrency: int, *, model: str = "",
                    headers: dict[str, str] | None = None, watch: Callable[[StreamRun, list[Streamed], deque], bool] | None = None,
                    alive: Callable[[], Exception | None] | None = None, on_done: Callable[[Streamed], None] | None = None,
                    poll_s: float = 0.05, cache: bool = False) -> StreamRun:
    """Send every request and stream its tokens. Closed loop (no arrival times): `concurrency` in flight, each
    finished one replaced by the next. Open loop: each sent at its arrival, at most `concurrency` in flight (0: no
    cap; later ones wait, and their wait counts). A multi-turn session's later turn (Request.follows) is sent its
    think time after the last token of the turn before it, as the engine's admission does on a step backend.
    `watch(run, live, pending)` is asked every `poll_s`: True ends the run (`stopped`); `alive()` returns an
    exception that ends it (the server died)."""
    try:
        return asyncio.run(_stream_all(url, APIS[api_name](cache), requests, concurrency, model, headers or {}, watch, alive,
                                       on_done, poll_s))
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None  # a Ctrl-C asyncio's runner passed on as the cancelled task


async def _stream_all(url, api, requests, concurrency, model, headers, watch, alive, on_done, poll_s) -> StreamRun:
    import aiohttp

    open_loop = bool(requests) and requests[0].arrival_s is not None
    cap = concurrency if concurrency > 0 else len(requests)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=600)
    run = StreamRun(clock(), 0.0, [])
    live: list[Streamed] = []
    # a session's later turns wait for the turn before them to finish; the rest queue by arrival
    held = SessionTurns(requests)
    pending: deque[Request] = deque(held.first)
    turn_due = asyncio.Event()  # a held turn joined `pending`: the sender looks again
    places = asyncio.Semaphore(cap)
    failure: Exception | None = None
    sent: list[asyncio.Task] = []  # every request's task: none may outlive the session (a stop, a server's death)

    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(request: Request, scheduled: float) -> None:
            queued = places.locked()
            async with places:
                s = Streamed(request, scheduled, queued=queued)
                live.append(s)
                await _stream_one(session, url, api, model, s, headers)
                live.remove(s)
                run.done.append(s)
                if on_done is not None:
                    on_done(s)
                # the session's next turn arrives its think time after this turn's last token (or its failure)
                follow = held.after(request.session, request.turn, (s.token_times[-1] if s.token_times else clock()) - run.start)
                if follow is not None:
                    queue_by_arrival(pending, follow)
                    turn_due.set()

        async def send_all() -> None:
            tasks = []
            while pending or held:
                if not pending:  # only turns whose turn before is still in flight
                    await turn_due.wait()
                    turn_due.clear()
                    continue
                request = pending[0]
                if open_loop:
                    due = run.start + request.arrival_s
                    delay = due - clock()
                    if delay > 0:
                        turn_due.clear()
                        try:  # until it is due, or until a turn that may come first is queued
                            await asyncio.wait_for(turn_due.wait(), delay)
                            continue
                        except asyncio.TimeoutError:
                            pass
                else:
                    await places.acquire()  # a closed loop's request is due when a place frees
                    places.release()
                    due = clock()
                pending.popleft()
                tasks.append(asyncio.create_task(one(request, due)))
                sent.append(tasks[-1])
                await asyncio.sleep(0)  # let it take its place before the next is considered
            await asyncio.gather(*tasks)

        async def watcher(main: asyncio.Task) -> None:
            nonlocal failure
            while not main.done():
                await asyncio.sleep(poll_s)
                if alive is not None and (failure := alive()) is not None:
                    main.cancel()
                    return
                if watch is not None and watch(run, live, pending):
                    run.stopped = True
                    main.cancel()
                    return

        main = asyncio.create_task(send_all())
        guard = asyncio.create_task(watcher(main))
        try:
            await main
        except asyncio.CancelledError:
            if not run.stopped and failure is None:
                raise
        finally:
            guard.cancel()
            # A stopped run's requests still in flight or waiting for a place end here, before the session closes:
            # left running, one would post on the closed session ("Session is closed", a task's exception never
            # retrieved) or add itself to the run after it was returned.
            for task in sent:
                task.cancel()
            await asyncio.gather(*sent, return_exceptions=True)
    run.end = clock()
    if failure is not None:
        raise failure
    return run

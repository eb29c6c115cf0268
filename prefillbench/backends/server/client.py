"""A streaming client made for measurement: asyncio, one connection per request in flight (client_http.py).

The hot loop does two things per read a stream delivers: it reads the monotonic clock and keeps the bytes beside
it (the connection's protocol, no task woken). The answers are parsed off that path (client_http.AnswerReader,
client_events.EventReader): after the run, or as each stream ends once the bytes held pass RAW_BYTES_HELD, or by
the watcher every `poll_s` where a watch must see the tokens during the run (capacity's early stop). A read takes
whatever the socket has (asyncio's reads are up to 256 KiB: no line-by-line buffer to outgrow, as aiohttp's 64 KiB
one was at long contexts: vllm#39963, sglang PR #6737).

Each request's scheduled and actual send time are kept (the difference is the client's lag, reported), and the
run's CPU time (`StreamRun.cpu_s`): a row says whether the client kept up. A request that fails (an HTTP error, a
dropped stream, fewer tokens than asked, a prompt served from the cache) is kept as failed with its reason, never
dropped. Several processes, or machines, share a run through client_workers.py.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable

from prefillbench.backends.server import client_http
from prefillbench.backends.server.client_alarm import SendAlarm, until
from prefillbench.backends.server.client_events import APIS, Api, LlamaApi, OpenAIApi
from prefillbench.backends.server.client_http import StreamReading, read_stream
from prefillbench.backends.server.client_records import StreamRun, Streamed, clock
from prefillbench.sequence import Request, SessionTurns, queue_by_arrival

__all__ = ["APIS", "Api", "LlamaApi", "OpenAIApi", "StreamRun", "Streamed", "clock", "stream_requests"]

#: Raw bytes the run keeps unparsed before it parses each stream as it ends: at about 250 bytes an event, 256 MiB
#: holds a million events (100 s at 10k tokens a second) with nothing parsed during the run.
RAW_BYTES_HELD = 256 * 2**20


async def _stream_one(endpoint: client_http.Endpoint, api: Api, model: str, s: Streamed) -> None:
    body = json.dumps(api.body(s.request, model)).encode()
    s.sent = clock()
    await client_http.post(endpoint, api.path, body, s)


def stream_requests(url: str, api_name: str, requests: list[Request], concurrency: int, *, model: str = "",
                    headers: dict[str, str] | None = None, watch: Callable[[StreamRun, list[Streamed], deque], bool] | None = None,
                    alive: Callable[[], Exception | None] | None = None, on_done: Callable[[Streamed], None] | None = None,
                    poll_s: float = 0.05, cache: bool = False, start_at: float | None = None) -> StreamRun:
    """Send every request and stream its tokens. Closed loop (no arrival times): `concurrency` in flight, each
    finished one replaced by the next. Open loop: each sent at its arrival, at most `concurrency` in flight (0: no
    cap; later ones wait, and their wait counts). A multi-turn session's later turn (Request.follows) is sent its
    think time after the last token of the turn before it, as the engine's admission does on a step backend.
    `watch(run, live, pending)` is asked every `poll_s`: True ends the run (`stopped`); `alive()` returns an
    exception that ends it (the server died). `on_done(s)` as each request ends: its tokens are read by then only
    where a watch is given or it is a session's turn (`s.parsed`); every record is read when the run returns.
    `start_at`: the clock's time the schedule starts (the run's `start`; default: now), for workers that share one."""
    try:
        return _run_loop(_stream_all(url, APIS[api_name](cache), requests, concurrency, model, headers or {}, watch,
                                     alive, on_done, poll_s, start_at))
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None  # a Ctrl-C asyncio's runner passed on as the cancelled task


def _run_loop(main):
    """The run on uvloop (libuv's event loop in C: a read costs a third of what asyncio's own loop's does), or on
    asyncio's where uvloop is not installed (Windows)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


async def _stream_all(url, api, requests, concurrency, model, headers, watch, alive, on_done, poll_s,
                      start_at) -> StreamRun:
    open_loop = bool(requests) and requests[0].arrival_s is not None
    cap = concurrency if concurrency > 0 else len(requests)
    endpoint = client_http.Endpoint(url, headers)
    cpu0 = time.process_time()
    run = StreamRun(clock() if start_at is None else start_at, 0.0, [])
    live: list[Streamed] = []
    readings: dict[int, StreamReading] = {}  # a watched run's live streams, read as the watcher catches up
    # a session's later turns wait for the turn before them to finish; the rest queue by arrival
    held = SessionTurns(requests)
    pending: deque[Request] = deque(held.first)
    turn_due = SendAlarm(asyncio.get_running_loop())  # when the next is due; rung when a held turn joins `pending`
    places = asyncio.Semaphore(cap)
    failure: Exception | None = None
    sent: list[asyncio.Task] = []  # every request's task: none may outlive the run (a stop, a server's death)
    raw_bytes = 0  # bytes of finished streams kept unparsed

    async def one(request: Request, scheduled: float) -> None:
        nonlocal raw_bytes
        queued = places.locked()
        async with places:
            s = Streamed(request, scheduled, queued=queued)
            if watch is not None:
                readings[id(s)] = StreamReading(api, s)
            live.append(s)
            await _stream_one(endpoint, api, model, s)
            if watch is not None:
                readings.pop(id(s)).close()
            elif request.session is not None or raw_bytes > RAW_BYTES_HELD:
                read_stream(api, s)  # its last token dates the next turn; or memory is bounded
            else:
                raw_bytes += sum(map(len, s.chunks))
            live.remove(s)
            run.done.append(s)
            if on_done is not None:
                on_done(s)
            # the session's next turn arrives its think time after this turn's last token (or its failure)
            follow = held.after(request.session, request.turn, (s.token_times[-1] if s.token_times else clock()) - run.start)
            if follow is not None:
                queue_by_arrival(pending, follow)
                turn_due.ring()

    async def send_all() -> None:
        tasks = []
        if not open_loop:
            await until(run.start)  # a closed loop's first requests are due at the start
        while pending or held:
            if not pending:  # only turns whose turn before is still in flight
                await turn_due.wait(None)
                continue
            request = pending[0]
            if open_loop:
                due = run.start + request.arrival_s
                if due > clock():
                    if await turn_due.wait(due):  # a turn that may come first was queued
                        continue
                    if pending[0] is not request:  # one was queued ahead of it meanwhile, due as soon
                        continue
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
            if watch is not None:
                for reading in readings.values():  # the live streams' tokens so far, for the watch
                    reading.catch_up()
                if watch(run, live, pending):
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
        # A stopped run's requests still in flight or waiting for a place end here (their connections closed): left
        # running, one would add itself to the run after it was returned.
        for task in sent:
            task.cancel()
        await asyncio.gather(*sent, return_exceptions=True)
        endpoint.close()  # connections whose server has not closed them yet
        turn_due.close()
    run.end = clock()
    if failure is not None:
        raise failure
    for s in run.done:  # off the hot path: the answers of every stream kept raw
        read_stream(api, s)
    run.cpu_s = time.process_time() - cpu0
    return run

"""A streaming client made for measurement: asyncio and aiohttp, one keep-alive connection per request in flight.

The hot loop does two things per chunk of bytes a stream delivers: it reads the monotonic clock and keeps the
chunk beside its time. The events are parsed off that path (client_events.py): after the run, or as each stream
ends once the bytes held pass RAW_BYTES_HELD, or as they come where a watch must see the tokens during the run
(capacity's early stop). Reads take what the socket has, up to READ_BUFSIZE at a time (a 64 KiB buffer and lines
read one by one collapse a client at long contexts: vllm#39963, sglang PR #6737).

Each request's scheduled and actual send time are kept (the difference is the client's lag, reported), and the
run's CPU time (`StreamRun.cpu_s`): a row says whether the client kept up. A request that fails (an HTTP error, a
dropped stream, fewer tokens than asked, a prompt served from the cache) is kept as failed with its reason, never
dropped. Several processes, or machines, share a run through client_workers.py.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from prefillbench.backends.server.client_events import APIS, Api, EventReader, LlamaApi, OpenAIApi, read_stream
from prefillbench.backends.server.client_records import StreamRun, Streamed, clock
from prefillbench.sequence import Request, SessionTurns, queue_by_arrival

__all__ = ["APIS", "Api", "LlamaApi", "OpenAIApi", "StreamRun", "Streamed", "clock", "stream_requests"]

#: aiohttp's read buffer per connection (its default is 64 KiB): a long prompt's answer or a burst of events is
#: taken in one read.
READ_BUFSIZE = 4 * 2**20
#: Raw bytes the run keeps unparsed before it parses each stream as it ends: at about 250 bytes an event, 256 MiB
#: holds a million events (100 s at 10k tokens a second) with nothing parsed during the run.
RAW_BYTES_HELD = 256 * 2**20


async def _stream_one(session, url: str, api: Api, model: str, s: Streamed, headers: dict[str, str],
                      live: EventReader | None) -> None:
    import aiohttp

    s.sent = clock()
    for attempt in (0, 1):
        try:
            await _post(session, url, api, model, s, headers, live)
            return
        except aiohttp.ServerDisconnectedError:
            # A kept-alive connection the server had closed, found so before a byte came back: the request never
            # reached it; once more, on a fresh connection. Past the first bytes it is a dropped stream.
            if attempt or s.chunk_times or s.events:
                s.error = "ServerDisconnectedError: the server closed the stream"
                return
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
            s.error = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
            return


async def _post(session, url: str, api: Api, model: str, s: Streamed, headers: dict[str, str],
                live: EventReader | None) -> None:
    """One request and its stream: every chunk stamped on arrival and kept, or fed to `live` at once."""
    async with session.post(url + api.path, json=api.body(s.request, model), headers=headers) as response:
        if response.status != 200:
            text = (await response.text())[:200]
            s.error = f"HTTP {response.status}: {' '.join(text.split())}"
            return
        read = response.content.readany
        if live is not None:
            while data := await read():
                live.feed(data, clock())
            return
        chunks, times = s.chunks, s.chunk_times
        while True:
            data = await read()
            if not data:
                return
            times.append(clock())
            chunks.append(data)


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
        return asyncio.run(_stream_all(url, APIS[api_name](cache), requests, concurrency, model, headers or {}, watch, alive,
                                       on_done, poll_s, start_at))
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None  # a Ctrl-C asyncio's runner passed on as the cancelled task


async def _stream_all(url, api, requests, concurrency, model, headers, watch, alive, on_done, poll_s,
                      start_at) -> StreamRun:
    import aiohttp

    open_loop = bool(requests) and requests[0].arrival_s is not None
    cap = concurrency if concurrency > 0 else len(requests)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=600)
    cpu0 = time.process_time()
    run = StreamRun(clock() if start_at is None else start_at, 0.0, [])
    live: list[Streamed] = []
    # a session's later turns wait for the turn before them to finish; the rest queue by arrival
    held = SessionTurns(requests)
    pending: deque[Request] = deque(held.first)
    turn_due = asyncio.Event()  # a held turn joined `pending`: the sender looks again
    places = asyncio.Semaphore(cap)
    failure: Exception | None = None
    sent: list[asyncio.Task] = []  # every request's task: none may outlive the session (a stop, a server's death)
    raw_bytes = 0  # bytes of finished streams kept unparsed

    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0),
                                     read_bufsize=READ_BUFSIZE) as session:

        async def one(request: Request, scheduled: float) -> None:
            nonlocal raw_bytes
            queued = places.locked()
            async with places:
                s = Streamed(request, scheduled, queued=queued)
                reader = EventReader(api, s) if watch is not None else None
                live.append(s)
                await _stream_one(session, url, api, model, s, headers, reader)
                if reader is not None:
                    reader.close()
                    s.parsed = True
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
                    turn_due.set()

        async def send_all() -> None:
            tasks = []
            if not open_loop and run.start > clock():
                await asyncio.sleep(run.start - clock())  # a closed loop's first requests are due at the start
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
    for s in run.done:  # off the hot path: the events of every stream kept raw
        read_stream(api, s)
    run.cpu_s = time.process_time() - cpu0
    return run

"""The client's wire: one HTTP/1.1 POST a connection, its answer kept as the socket gave it. The protocol's
`data_received` is the whole hot loop: it reads the monotonic clock and keeps the bytes beside it; nothing is
parsed, and no task wakes, until the answer is over. `Connection: close` makes the server end the connection with
the answer (so no parsing is needed to find its end, and the server, closing first, keeps the closed connection's
TIME_WAIT rather than the client's ports); an answer's last chunk (`0\\r\\n\\r\\n` of the chunked encoding) ends it
too, a moment later, for a server that keeps the connection open all the same.

An AnswerReader then reads the kept bytes (after the run, or as a watch needs them): the status line, the headers,
and the body (chunked, by length, or to the close) as pieces, each with its read's arrival, into the event reader
(client_events.py).

Why not aiohttp for the stream: its StreamReader wakes the reading task for every read (a task step, its buffer's
flow control, a readline or readany call), which was most of the 40-60 CPU us a streamed token cost the client
(issue 60's profile, docs/servers.md); here a read costs a clock reading and an append.
"""
from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlsplit

from prefillbench.backends.server.client_records import Streamed, clock

#: How a request that failed on the wire says so (the backend reads a dropped stream by these: backend.DROPPED).
CONNECT_FAILED = "ConnectError"
STREAM_CUT = "the stream was cut"
#: The last chunk of a chunked answer, after the CRLF that ends the chunk before it.
LAST_CHUNK = b"\r\n0\r\n\r\n"
#: Seconds to connect, and the most an answer may stay silent.
CONNECT_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 600.0
#: Seconds a server that sent its answer's last chunk has to close the connection before the client does.
CLOSE_GRACE_S = 1.0


class _Answer(asyncio.Protocol):
    """One connection's answer, kept raw: each read and its arrival."""

    __slots__ = ("chunks", "times", "done", "transport", "error", "endpoint")

    def __init__(self, chunks: list[bytes], times: list[float], done: asyncio.Future, endpoint: "Endpoint") -> None:
        self.chunks, self.times, self.done, self.endpoint = chunks, times, done, endpoint
        self.transport: asyncio.Transport | None = None
        self.error: str | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.times.append(clock())
        self.chunks.append(data)
        if data.endswith(LAST_CHUNK) or data == LAST_CHUNK[2:]:
            # the answer is whole; its connection is left a moment for the server to close first (the side that
            # closes first keeps the connection's TIME_WAIT, and a client opening hundreds a second must not run
            # out of ports), then closed here, for a server that keeps it open all the same
            if not self.done.done():
                self.done.set_result(None)
            asyncio.get_running_loop().call_later(CLOSE_GRACE_S, self.transport.close)

    def eof_received(self) -> bool:
        return False  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.endpoint.open.discard(self.transport)
        if exc is not None:
            self.error = f"{STREAM_CUT}: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
        if not self.done.done():
            self.done.set_result(None)


class Endpoint:
    """Where the requests go: host, port, TLS, and the request head's fixed part; the connections still open (an
    answer whole, its server not yet gone), closed at the run's end (`close`)."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.open: set[asyncio.Transport] = set()
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        host = parts.netloc.rsplit("@", 1)[-1]
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.head = (f"Host: {host}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
                     f"Connection: close\r\nUser-Agent: prefillbench\r\n{extra}")

    def request(self, path: str, body: bytes) -> bytes:
        return (f"POST {self.prefix}{path} HTTP/1.1\r\n{self.head}Content-Length: {len(body)}\r\n\r\n").encode() + body

    def close(self) -> None:
        for transport in self.open:
            transport.close()
        self.open.clear()


async def post(endpoint: Endpoint, path: str, body: bytes, s: Streamed) -> None:
    """One request; its answer's bytes kept in `s.chunks` (with `s.chunk_times`), or why it failed in `s.error`.

    One timer a request keeps its time limits: the connect's, then the answer's silence, re-armed as it expires while
    reads came (asyncio.wait_for costs a task and a timer a wait, two waits a request: a tenth of the client's CPU per
    request, issue 60's profile)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    answer = _Answer(s.chunks, s.chunk_times, done, endpoint)
    limit = _Limit(loop, asyncio.current_task(), done, s)
    transport, whole = None, False
    try:
        try:
            transport, _ = await loop.create_connection(lambda: answer, endpoint.host, endpoint.port, ssl=endpoint.tls)
        except OSError as e:
            s.error = f"{CONNECT_FAILED}: {type(e).__name__}: {' '.join(str(e).split())[:160]}"
            return
        limit.reading()
        transport.write(endpoint.request(path, body))
        await done
        if limit.silent:
            s.error = f"no answer for {READ_TIMEOUT_S:g} s"
            return
        if answer.error is not None:
            s.error = answer.error
        whole = True
    except asyncio.CancelledError:
        if not limit.expired:  # the run's own cancel (a stop, a server's death)
            raise
        # the connect's limit passed: its cancel came at the connect, or at the answer's wait where the connection
        # came as the limit passed
        s.error = f"{CONNECT_FAILED}: TimeoutError: no connection in {CONNECT_TIMEOUT_S:g} s"
    finally:
        limit.cancel()
        if transport is not None:
            if whole and not transport.is_closing():
                # the server closes it (or the grace timer does); the run's end at the latest
                endpoint.open.add(transport)
            else:
                transport.close()


class _Limit:
    """A request's time limits on one timer: the connect's (the connecting task cancelled), then the answer's silence
    (`done` settled, `silent` set), looked at each READ_TIMEOUT_S and re-armed while reads still come."""

    __slots__ = ("loop", "task", "done", "s", "handle", "expired", "silent", "seen")

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task, done: asyncio.Future, s: Streamed) -> None:
        self.loop, self.task, self.done, self.s = loop, task, done, s
        self.expired = self.silent = False
        self.seen = 0
        self.handle = loop.call_later(CONNECT_TIMEOUT_S, self._connect_expired)

    def _connect_expired(self) -> None:
        self.expired = True
        self.task.cancel()

    def reading(self) -> None:
        self.handle.cancel()
        self.handle = self.loop.call_later(READ_TIMEOUT_S, self._look)

    def _look(self) -> None:
        if len(self.s.chunk_times) == self.seen and not self.done.done():
            self.silent = True
            self.done.set_result(None)
            return
        self.seen = len(self.s.chunk_times)
        self.handle = self.loop.call_later(READ_TIMEOUT_S, self._look)

    def cancel(self) -> None:
        self.handle.cancel()


class AnswerReader:
    """An answer's bytes, fed in order with their arrivals, read into its events as they go: the status line and
    headers, then the body (chunked, by its length, or to the close), each piece handed to `events` (an
    client_events.EventReader) with the arrival of the read that brought it. A status other than 200 keeps the
    body's start for its reason; an answer that stops short of its framing's end is a stream cut."""

    __slots__ = ("events", "buffer", "state", "status", "remaining", "error_body", "seen")

    def __init__(self, events) -> None:
        self.events = events
        self.buffer = b""
        self.state = "head"  # head, size, data, crlf, length, rest, done
        self.status = 0
        self.remaining = 0
        self.error_body = b""
        self.seen = False

    def feed(self, data: bytes, arrived: float) -> None:
        self.seen = True
        first = len(self.events.s.token_times)
        if self.state == "size" and not self.buffer:
            # most reads: one whole chunk of the chunked encoding (a server's write of one event)
            end = data.find(b"\r\n")
            if end > 0:
                try:
                    size = int(data[:end], 16)
                except ValueError:
                    size = -1
                if size > 0 and len(data) == end + size + 4 and data.endswith(b"\r\n"):
                    self._body(data[end + 2:end + 2 + size], arrived)
                    self.events.date_by_server(first)
                    return
        buf = self.buffer + data if self.buffer else data
        at = 0
        while at < len(buf) and self.state != "done":
            state = self.state
            if state == "head":
                end = buf.find(b"\r\n\r\n", at)
                if end < 0:
                    break
                self._head(buf[at:end].decode("latin-1"))
                at = end + 4
            elif state == "size":
                end = buf.find(b"\r\n", at)
                if end < 0:
                    break
                try:
                    self.remaining = int(buf[at:end].split(b";")[0], 16)
                except ValueError:
                    self.state, self.status = "done", -1
                    break
                at = end + 2
                self.state = "data" if self.remaining else "done"
            elif state in ("data", "length"):
                take = min(self.remaining, len(buf) - at)
                self._body(buf[at:at + take], arrived)
                at += take
                self.remaining -= take
                if not self.remaining:
                    self.state = "crlf" if state == "data" else "done"
            elif state == "crlf":
                if len(buf) - at < 2:
                    break
                at += 2
                self.state = "size"
            else:  # rest: the body runs to the close
                self._body(buf[at:], arrived)
                at = len(buf)
        self.buffer = buf[at:] if self.state != "done" else b""
        self.events.date_by_server(first)  # one read's tokens, however many chunks and events brought them

    def _head(self, text: str) -> None:
        lines = text.split("\r\n")
        parts = lines[0].split()
        self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = headers.get("content-length", "")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = "size"
        elif length.isdigit():
            self.state, self.remaining = ("length", int(length)) if int(length) else ("done", 0)
        else:
            self.state = "rest"

    def _body(self, piece: bytes, arrived: float) -> None:
        if self.status == 200:
            self.events.feed(piece, arrived)
        elif len(self.error_body) < 400:
            self.error_body += piece[:400]

    def close(self) -> None:
        """The connection is over: the request's outcome (the events' own checks where its answer was whole)."""
        s = self.events.s
        if s.error is None:
            if self.state == "head":
                s.error = "an HTTP answer cut in its headers" if self.seen else f"{STREAM_CUT}: no answer"
            elif self.status != 200:
                text = " ".join(self.error_body.decode(errors="replace").split())[:200]
                s.error = f"HTTP {self.status}: {text}" if self.status > 0 else "not an HTTP answer"
            elif self.state not in ("done", "rest"):
                s.error = f"{STREAM_CUT} before the answer's end"
        self.events.close()


class StreamReading:
    """A stream read as far as its kept bytes go: after the run, or by the watcher as it goes (a watch that must see
    the tokens of requests still streaming); `close` when the stream is over."""

    __slots__ = ("s", "answer", "upto")

    def __init__(self, api, s: Streamed) -> None:
        from prefillbench.backends.server.client_events import EventReader

        self.s, self.answer, self.upto = s, AnswerReader(EventReader(api, s)), 0

    def catch_up(self) -> None:
        s = self.s
        for i in range(self.upto, len(s.chunks)):
            self.answer.feed(s.chunks[i], s.chunk_times[i])
        self.upto = len(s.chunks)

    def close(self) -> None:
        self.catch_up()
        self.answer.close()
        self.s.chunks = []
        self.s.parsed = True


def read_stream(api, s: Streamed) -> None:
    """A stream kept raw, read whole now (once), its bytes let go."""
    if not s.parsed:
        StreamReading(api, s).close()

"""The client's timers (issue 60's lean loop): the sender's alarm never lets a request go before it is due (on the
kernel's timerfd and on asyncio's timer where there is none) and ends its wait when rung; a request's one timer keeps
the connect's and the answer's time limits; a record's text stays short however much it holds (asyncio's runner
formats its result when it ends)."""
from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest

from prefillbench.backends.server import client_alarm, client_http
from prefillbench.backends.server.client import _run_loop as run_loop  # the client's loop: uvloop where installed
from prefillbench.backends.server.client_records import StreamRun, Streamed, clock
from prefillbench.sequence import Request


@pytest.fixture(params=["timerfd", "asyncio"])
def alarm_kind(request, monkeypatch):
    if request.param == "asyncio":
        monkeypatch.setattr(client_alarm, "_LIBC", None)
    elif client_alarm._LIBC is None:
        pytest.skip("no timerfd on this platform: the asyncio case covers it")
    return request.param


def test_the_alarm_never_ends_a_wait_before_its_due_time(alarm_kind):
    async def main():
        alarm = client_alarm.SendAlarm(asyncio.get_running_loop())
        assert (alarm.fd is not None) == (alarm_kind == "timerfd")
        early = []
        try:
            for k in range(40):  # due times off the millisecond grid, some under a millisecond away
                due = clock() + 0.0003 + (k % 7) * 0.00071
                rung = await alarm.wait(due)
                early.append((rung, clock() - due))
        finally:
            alarm.close()
        return early

    waits = run_loop(main())
    assert all(rung is False for rung, _ in waits)
    assert min(after for _, after in waits) >= 0.0


def test_a_ring_ends_the_wait_and_says_so(alarm_kind):
    async def main():
        loop = asyncio.get_running_loop()
        alarm = client_alarm.SendAlarm(loop)
        try:
            loop.call_later(0.01, alarm.ring)
            rung = await alarm.wait(clock() + 60.0)
            alarm.ring()  # nobody waits: not kept
            late = await alarm.wait(clock() + 0.005)
        finally:
            alarm.close()
        return rung, late

    assert run_loop(main()) == (True, False)


def test_an_expiry_read_late_does_not_end_the_next_wait_early():
    if client_alarm._LIBC is None:
        pytest.skip("no timerfd on this platform")

    async def main():
        loop = asyncio.get_running_loop()
        alarm = client_alarm.SendAlarm(loop)
        try:
            loop.call_later(0.0, alarm.ring)
            assert await alarm.wait(clock() + 0.002) is True  # rung first; its timer still expires
            time.sleep(0.005)  # the expiry is in the fd, unread
            due = clock() + 0.02
            assert await alarm.wait(due) is False
            return clock() - due
        finally:
            alarm.close()

    assert run_loop(main()) >= 0.0


def _silent_server(gap_s: float | None, count: int = 0):
    """A server that takes the connection and then says nothing (gap_s None), or sends an answer's head and `count`
    reads `gap_s` apart, then the last chunk."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        try:
            conn, _ = listener.accept()
        except OSError:  # the test closed the listener first (a connect that gave up before it was taken)
            return
        with conn:
            conn.recv(65536)
            if gap_s is None:
                time.sleep(2.0)
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(count):
                time.sleep(gap_s)
                conn.sendall(b"2\r\nhi\r\n")
            conn.sendall(b"0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def _post(url: str) -> Streamed:
    s = Streamed(Request((1, 2), 1, 0.0), 0.0)

    async def main():
        endpoint = client_http.Endpoint(url, {})
        try:
            await client_http.post(endpoint, "/x", b"{}", s)
        finally:
            endpoint.close()

    run_loop(main())
    return s


def test_an_answer_silent_past_the_read_limit_fails_the_request(monkeypatch):
    monkeypatch.setattr(client_http, "READ_TIMEOUT_S", 0.2)
    listener, thread = _silent_server(None)
    with listener:
        s = _post(f"http://127.0.0.1:{listener.getsockname()[1]}")
    assert s.error == "no answer for 0.2 s"


def test_an_answer_that_keeps_coming_outlives_the_read_limit(monkeypatch):
    # six reads 0.1 s apart: 0.6 s in all, three times the limit, never silent for as long as it
    monkeypatch.setattr(client_http, "READ_TIMEOUT_S", 0.2)
    listener, thread = _silent_server(0.1, count=6)
    with listener:
        s = _post(f"http://127.0.0.1:{listener.getsockname()[1]}")
        thread.join(5.0)
    assert s.error is None
    assert len(s.chunk_times) >= 2 and s.chunk_times[-1] - s.chunk_times[0] > 0.2


def test_a_connect_past_its_limit_is_a_connect_failure(monkeypatch):
    # a limit of 0 s: the timer is due before any connection can be made, whichever side of it the connect lands
    monkeypatch.setattr(client_http, "CONNECT_TIMEOUT_S", 0.0)
    listener, thread = _silent_server(None)
    with listener:
        s = _post(f"http://127.0.0.1:{listener.getsockname()[1]}")
    assert s.error == f"{client_http.CONNECT_FAILED}: TimeoutError: no connection in 0 s"


def test_a_records_text_stays_short_however_much_it_holds():
    s = Streamed(Request(tuple(range(4000)), 3, 0.0), 0.0)
    s.chunks = [b"data: {}\n\n"] * 10_000
    s.chunk_times = [0.0] * 10_000
    run = StreamRun(0.0, 1.0, [s] * 1000)
    assert len(repr(s)) < 200 and len(repr(run)) < 200


def test_the_alarm_gives_its_timerfd_back():
    if client_alarm._LIBC is None:
        pytest.skip("no timerfd on this platform")

    async def main():
        for _ in range(50):
            alarm = client_alarm.SendAlarm(asyncio.get_running_loop())
            await alarm.wait(clock() + 0.0001)
            alarm.close()

    # Counted by kind, timerfds only: in the whole suite another test's thread or child may open or close a pipe
    # or socket of the same process while this runs, so a count of all descriptors is not this alarm's.
    before = timerfds()
    run_loop(main())
    assert timerfds() == before


def timerfds() -> int:
    """The process's open timerfds (each shows in /proc/self/fd as a link to anon_inode:[timerfd])."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[timerfd]"
        except OSError:  # closed since listed (listdir's own descriptor among them)
            pass
    return n

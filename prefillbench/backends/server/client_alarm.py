"""The sender's clock: wait until a request is due, or until rung (a session's next turn was queued), whichever comes
first, with the send no earlier than due and as little late as the kernel's timers allow.

Why not asyncio's timers alone: uvloop keeps them in whole milliseconds of a clock read at the start of each pass
of the loop, so a sleep ends up to 1.5 ms early, and a send may not go early (a negative lag; MLPerf's loadgen rule);
the rest was waited out in passes of the loop, twenty a request, a tenth of the client's CPU (issue 60's profile).
On Linux the wait is a timerfd at the due time on the monotonic clock (the clock `clock` reads), watched by the loop
like a socket: the loop sleeps until a read or the due time, which the kernel keeps to tens of microseconds. Where
there is no timerfd (macOS, Windows), asyncio's timer and the passes of the loop, as before.
"""
from __future__ import annotations

import asyncio
import ctypes
import math
import os
import sys

from prefillbench.backends.server.client_records import clock

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK_CLOEXEC = os.O_NONBLOCK | os.O_CLOEXEC  # TFD_NONBLOCK and TFD_CLOEXEC are O_NONBLOCK and O_CLOEXEC
_TFD_TIMER_ABSTIME = 1
#: How early asyncio's timer may end a wait (uvloop's whole milliseconds of a clock read at the pass's start: up to
#: 1.5 ms): a wait that near its due time is waited out in passes of the loop.
TIMER_EARLY_S = 0.002


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create, libc.timerfd_settime  # noqa: B018 (both, or neither)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


async def until(due: float) -> None:
    """Not before `due` on the clock, with asyncio's timer and passes of the loop (no timerfd): a timer may fire up
    to 1.5 ms early; the rest is waited out in passes of the loop, which read what came meanwhile."""
    if due - clock() > TIMER_EARLY_S:
        await asyncio.sleep(due - clock() - TIMER_EARLY_S / 2)
    while clock() < due:
        await asyncio.sleep(0)


class SendAlarm:
    """One per sending loop; `close` when the run ends."""

    __slots__ = ("loop", "waiter", "due", "fd", "spec")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiter: asyncio.Future | None = None
        self.due = math.inf
        self.fd: int | None = None
        if _LIBC is not None:
            fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK_CLOEXEC)
            if fd >= 0:
                self.fd, self.spec = fd, _Itimerspec()
                loop.add_reader(fd, self._fired)

    def ring(self) -> None:
        """Something to send may be due sooner: the wait ends (a ring while nobody waits is not kept: the sender
        looks at its queue before every wait)."""
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(True)

    async def wait(self, due: float | None) -> bool:
        """True where rung; False where `due` came (None: no time), the clock then at or past it."""
        self.waiter = waiter = self.loop.create_future()
        timer = None
        if due is not None:
            self.due = due
            if self.fd is not None:
                self._arm(due)
            else:
                timer = self.loop.call_later(max(due - clock(), 0.0), self._settle)
        try:
            rung = await waiter
        finally:
            self.waiter, self.due = None, math.inf
            if timer is not None:
                timer.cancel()
        if not rung and clock() < due:  # asyncio's timer, early
            await until(due)
        return rung

    def _arm(self, due: float) -> None:
        nanoseconds = math.ceil(due * 1e9)  # never before due: the clock reads the same monotonic nanoseconds
        self.spec.it_value.tv_sec, self.spec.it_value.tv_nsec = divmod(max(nanoseconds, 1), 1_000_000_000)
        if _LIBC.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self.spec), None) != 0:
            # the kernel refused the time: asyncio's timer instead, this once (it may fire early: the passes after)
            self.loop.call_later(max(due - clock(), 0.0), self._settle)

    def _fired(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return
        if clock() >= self.due:  # not an expiry of an earlier wait's time, read only now
            self._settle()

    def _settle(self) -> None:
        if self.waiter is not None and not self.waiter.done() and clock() >= self.due - TIMER_EARLY_S:
            self.waiter.set_result(False)

    def close(self) -> None:
        if self.fd is not None:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = None

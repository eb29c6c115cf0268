"""Searches that take turns on one backend, a backend call each in a fixed round-robin order.

Measured one after another, the configurations of tune's measured stage each met the minutes they ran in: on a
VM whose speed moved by a third from one probe to the next, the one measured second ran 1.20x slower than the
calibration in two runs out of two, and measured a third less than its twin (docs/history, 2026-12-01d). Taking
turns spreads the machine's drift over all of them, as `run --interleave` does for strategies.

Each search is written as plain sequential code (tune_config's bracket-and-bisect) and runs in a thread of its
own, but only one thread runs at any moment: a search hands the main thread each backend call (a thunk) and
waits; the main thread runs it, hands back the result and waits for that search's next call or its end before
it serves the next search. So a search computes what it computes alone, its callbacks never run beside another
search, and Ctrl-C reaches the main thread inside the backend call, as in a serial run.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
#: What a search is given to run a piece of work on the backend: call(thunk) returns thunk().
BackendCall = Callable[[Callable[[], T]], T]


def run_here(work: Callable[[], T]) -> T:
    """The BackendCall of a search that runs alone: the work, now, on this thread."""
    return work()


class _Search(threading.Thread):
    def __init__(self, task: Callable[[BackendCall], Any]) -> None:
        super().__init__(daemon=True)
        self.task = task
        self.cond = threading.Condition()
        self.request: Callable[[], Any] | None = None  # a call handed over, not yet taken by the main thread
        self.answer: tuple[Any, BaseException | None] | None = None
        self.waiting = False  # inside call(), until answered
        self.finished = False
        self.outcome: Any = None  # the task's return value, or the exception it raised

    def call(self, thunk: Callable[[], T]) -> T:
        with self.cond:
            self.request, self.answer, self.waiting = thunk, None, True
            self.cond.notify_all()
            while self.answer is None:
                self.cond.wait()
            (value, error), self.answer, self.waiting = self.answer, None, False
        if error is not None:
            raise error
        return value

    def run(self) -> None:
        try:
            self.outcome = self.task(self.call)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which decides
            self.outcome = e
        with self.cond:
            self.finished = True
            self.cond.notify_all()

    def next_request(self) -> Callable[[], Any] | None:
        """Let the search run until it hands over its next call (returned) or ends (None)."""
        with self.cond:
            while self.request is None and not self.finished:
                self.cond.wait()
            thunk, self.request = self.request, None
            return thunk

    def reply(self, value: Any, error: BaseException | None) -> None:
        with self.cond:
            self.answer = (value, error)
            self.cond.notify_all()

    def interrupt_until_finished(self) -> None:
        """Answer every call it makes from now on with KeyboardInterrupt, until it ends."""
        with self.cond:
            while not self.finished:
                if self.waiting and self.answer is None:
                    self.request = None
                    self.answer = (None, KeyboardInterrupt())
                    self.cond.notify_all()
                self.cond.wait()


def take_turns(tasks: list[Callable[[BackendCall], Any]]) -> list[Any]:
    """Run the tasks, each given a `call` for its backend work, their calls made by this thread in turns (the
    first call of each task in task order, then the second of each still running, ...). Returns each task's
    return value or the exception it ended with. A Ctrl-C during a call, or a call's error (handed to the task
    that made it), ends the others too: each is answered with KeyboardInterrupt from then on, so each keeps what
    it finished; a task that never started ends with KeyboardInterrupt."""
    searches = [_Search(t) for t in tasks]
    pending: dict[_Search, Callable[[], Any] | None] = {}
    try:
        for s in searches:  # one at a time: each runs up to its first call
            s.start()
            pending[s] = s.next_request()
        failed = False
        while not failed and any(pending.values()):
            for s in searches:
                thunk, pending[s] = pending[s], None
                if thunk is None:
                    continue
                try:
                    value, error = thunk(), None
                except Exception as e:  # noqa: BLE001 - the task's own error, raised in the task
                    value, error = None, e
                s.reply(value, error)
                pending[s] = s.next_request()
                if error is not None:
                    failed = True
                    break
    except KeyboardInterrupt:
        pass
    for s in searches:
        if s.ident is None:
            s.outcome = KeyboardInterrupt()
        else:
            s.interrupt_until_finished()
    return [s.outcome for s in searches]

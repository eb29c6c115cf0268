"""Searches taking turns on one backend: round-robin calls, one thread at a time, Ctrl-C and errors end all."""
from __future__ import annotations

import threading

import pytest

from prefillbench.bench.turns import take_turns


def counting_task(name: str, n: int, log: list[str], running: list[int]):
    def task(call):
        out = []
        for i in range(n):
            running[0] += 1
            assert running[0] == 1, "two searches ran at once"
            running[0] -= 1
            out.append(call(lambda i=i: (log.append(f"{name}{i}"), threading.current_thread() is threading.main_thread())[1]))
        return out
    return task


def test_calls_go_round_robin_on_the_main_thread_and_each_task_gets_its_own_results():
    log: list[str] = []
    running = [0]
    outcomes = take_turns([counting_task("a", 3, log, running), counting_task("b", 1, log, running),
                           counting_task("c", 2, log, running)])
    assert log == ["a0", "b0", "c0", "a1", "c1", "a2"]
    assert outcomes == [[True] * 3, [True], [True] * 2]  # every call ran on the main thread


def test_a_ctrl_c_during_a_call_reaches_every_task_still_running():
    seen: dict[str, list] = {"a": [], "b": [], "c": []}
    calls = [0]

    def work():
        calls[0] += 1
        if calls[0] == 4:
            raise KeyboardInterrupt
        return calls[0]

    def task(name):
        def run(call):
            for _ in range(5):
                try:
                    seen[name].append(call(work))
                except KeyboardInterrupt:
                    seen[name].append("interrupted")
                    return "kept " + name
            return "done " + name
        return run

    outcomes = take_turns([task("a"), task("b"), task("c")])
    # a1 b2 c3, then a's second call is interrupted: a, b and c each keep what they had
    assert seen == {"a": [1, "interrupted"], "b": [2, "interrupted"], "c": [3, "interrupted"]}
    assert outcomes == ["kept a", "kept b", "kept c"]


def test_an_error_goes_to_the_task_that_made_the_call_and_ends_the_others():
    def failing(call):
        call(lambda: None)
        call(lambda: 1 / 0)

    def patient(call):
        n = 0
        try:
            while True:
                call(lambda: None)
                n += 1
        except KeyboardInterrupt:
            return n

    outcomes = take_turns([failing, patient])
    assert isinstance(outcomes[0], ZeroDivisionError)
    assert outcomes[1] == 1  # its first call ran; its second was answered with KeyboardInterrupt


def test_a_task_that_never_calls_the_backend_just_returns():
    assert take_turns([lambda call: 7, lambda call: call(lambda: 8)]) == [7, 8]
    with pytest.raises(ValueError):
        raise take_turns([lambda call: (_ for _ in ()).throw(ValueError("x"))])[0]

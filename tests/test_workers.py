"""The forked worker pools (tune's grid, the design search): no worker outlives its pool, and a forked worker does
not inherit the servers or the SIGTERM handler of the process that forked it."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from prefillbench.backends.server import process
from prefillbench.bench import workers


def _sleep(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def _deaf_to_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_forked_child_drops_the_parents_servers_and_sigterm_handler(monkeypatch):
    monkeypatch.setattr(process, "_running", process._running)  # restored whatever the child does to it
    previous = signal.signal(signal.SIGTERM, process._on_signal)
    sentinel = object()
    process._running.add(sentinel)
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report and leave at once, never into pytest's teardown
            os.write(write, f"{len(process._running)} {signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}".encode())
            os._exit(0)
        os.close(write)
        report = os.read(read, 100).decode()
        os.waitpid(pid, 0)
        assert report == "0 True"
        assert sentinel in process._running and signal.getsignal(signal.SIGTERM) is process._on_signal  # the parent's
    finally:
        process._running.discard(sentinel)
        signal.signal(signal.SIGTERM, previous)


def test_an_interrupt_ends_busy_workers_even_those_deaf_to_sigterm():
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with workers.forked_pool(2, _deaf_to_sigterm) as pool:
            futures = [pool.submit(_sleep, 60) for _ in range(3)]
            time.sleep(0.5)  # both workers busy, one task queued
            pids = list(pool._processes)
            raise KeyboardInterrupt
    # killed after the grace, not left to finish their minute of work
    assert time.monotonic() - started < 0.5 + workers.END_GRACE_S + 5
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids)
    assert all(f.done() for f in futures)


def test_a_normal_exit_waits_for_the_tasks():
    with workers.forked_pool(2, _deaf_to_sigterm) as pool:
        futures = [pool.submit(_sleep, 0.2) for _ in range(4)]
    assert all(f.done() and not f.cancelled() for f in futures)
    assert len({f.result() for f in futures}) <= 2


def test_a_process_with_a_server_handler_exits_after_an_interrupted_pool():
    """The hang CI met: the parent had started a server (so its SIGTERM handler was installed), a pool was
    interrupted, and a worker that survived its SIGTERM kept the interpreter's exit waiting for the pool's manager
    thread. Each run is a fresh interpreter: the hang was at exit."""
    script = textwrap.dedent("""
        import signal, time
        from prefillbench.backends.server import process
        from prefillbench.bench import workers
        signal.signal(signal.SIGTERM, process._on_signal)
        def busy(): time.sleep(60)
        try:
            with workers.forked_pool(2, lambda: None) as pool:
                for _ in range(4): pool.submit(busy)
                time.sleep(0.3)
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            print("interrupted")
    """)
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and done.stdout.strip() == "interrupted", done.stderr[-2000:]

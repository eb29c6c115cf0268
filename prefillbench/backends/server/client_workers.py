"""One run's client in several processes (`--client-workers N`), on this machine or as Ray actors on a cluster's
(client_ray.py), or in several commands (`--shard i/N`, merged by `prefillbench merge`).

Every worker gets a deterministic slice of the same schedule (`slices`): an open loop's requests dealt round-robin
in arrival order, so each sends every N-th at its scheduled time, and a multi-turn session whole to one worker (its
turns wait on each other); a closed loop's concurrency split as evenly as it goes, with the requests dealt the same
way. The workers start the schedule together, at a wall-clock time the parent sets once every worker is ready
(START_LEAD_S after), and each sends its slice with the same client (client.py), reads the events after its run
(parsing off every hot path), and returns its raw records with its CPU time. The parent moves the records onto its
own clock by that common start (`merge`: on one machine the monotonic clock is shared and the move is the few
microseconds between the two clocks' readings) and merges them into one run.

How many: EVENTS_PER_WORKER_S, a stated constant, not a figure tuned to this machine: `auto` sends an open loop's
expected token rate (its arrival rate times the mean tokens a request) with one worker for each EVENTS_PER_WORKER_S
events a second, and a closed loop with one for each IN_FLIGHT_PER_WORKER requests in flight.

  python -m prefillbench.backends.server.client_workers   (a worker: a pickled SliceJob on stdin, its SliceResult
                                                           on stdout; started by client_pool.stream_in_workers)
"""
from __future__ import annotations

import math
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prefillbench.backends.server.client_records import StreamRun, Streamed, clock
from prefillbench.errors import BackendError
from prefillbench.sequence import Request

#: Streamed events a second one worker is given. The single-process client before issue 60 used 40-60 CPU us an
#: event and so saturated a core near 20-25k events a second, its send lag p99 past 400 ms from 20k (issue 60's
#: table); at 10k it held 48% of a core and a 3.9 ms lag p99. Half that core's saturation leaves a worker's event
#: loop idle at least half the time, which is what keeps sends on time; the client since costs about half as much
#: an event (docs/servers.md), so the constant leaves room rather than being tuned to the edge.
EVENTS_PER_WORKER_S = 10_000
#: A closed loop's requests in flight per worker (inference-perf's 100 a worker process).
IN_FLIGHT_PER_WORKER = 100
#: Seconds from the last worker ready to the schedule's start: the start message reaches every worker by then.
START_LEAD_S = 0.25
#: How long a worker may take to import and say it is ready.
READY_TIMEOUT_S = 60.0
#: The most workers `auto` picks on this machine: one per core, less one for the parent and the rest.
LOCAL_CORES = max((len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) - 1, 1)


@dataclass
class Slice:
    """Worker `index` of `of`: its requests (the run's own objects) and its share of the concurrency."""

    index: int
    of: int
    requests: list[Request]
    concurrency: int


def slices(requests: list[Request], concurrency: int, n: int) -> list[Slice]:
    """The run's requests dealt to `n` workers: round-robin in their order (an open loop's is by arrival), a session
    whole to the worker its first turn went to, and a concurrency cap split with the remainder to the first ones.
    Slices that would be empty are not made (fewer requests, or places in flight, than workers)."""
    # a cap of 0 means none: no worker may get a share of 0 from a cap that is one (fewer workers than its places)
    n = max(1, min(n, len(requests) or 1, concurrency if concurrency > 0 else n))
    dealt: list[list[Request]] = [[] for _ in range(n)]
    session_of: dict[int, int] = {}
    k = 0
    for r in requests:
        if r.session is not None and r.session in session_of:
            dealt[session_of[r.session]].append(r)
            continue
        if r.session is not None:
            session_of[r.session] = k % n
        dealt[k % n].append(r)
        k += 1
    caps = [concurrency // n + (i < concurrency % n) for i in range(n)] if concurrency > 0 else [0] * n
    return [Slice(i, n, dealt[i], caps[i]) for i in range(n) if dealt[i]]


def auto_workers(requests: list[Request], concurrency: int, cores: int | None = LOCAL_CORES) -> int:
    """`--client-workers auto`: enough workers for the expected events a second (open loop) or requests in flight
    (closed loop), at most `cores` (None: no cap, a cluster's)."""
    if not requests:
        return 1
    if requests[0].arrival_s is not None:
        times = [r.arrival_s for r in requests if r.arrival_s is not None]
        span = max(times) - min(times)
        rate = (len(times) - 1) / span if span > 0 else math.inf
        tokens = sum(r.n_gen for r in requests) / len(requests)
        needed = math.ceil(rate * tokens / EVENTS_PER_WORKER_S) if math.isfinite(rate) else 1
    else:
        needed = math.ceil(concurrency / IN_FLIGHT_PER_WORKER)
    return max(1, min(needed, cores) if cores is not None else needed)


@dataclass
class SliceJob:
    """What one worker is sent: its slice and how to reach the engine."""

    url: str
    api: str
    requests: list[Request]
    concurrency: int
    model: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    cache: bool = False


@dataclass
class SliceResult:
    """What a worker sends back: its records and run times in seconds from the common start, its CPU time, where it
    ran; or why it failed."""

    done: list[Streamed]
    end: float
    cpu_s: float
    host: str
    error: str = ""


def local_start(start_unix: float) -> float:
    """The common start (wall-clock seconds) on this process's monotonic clock."""
    return clock() + (start_unix - time.time())


def run_slice(job: SliceJob, start_unix: float) -> SliceResult:
    """A worker's run: its slice sent from the common start; times returned from that start."""
    from prefillbench.backends.server import client

    start = local_start(start_unix)
    try:
        run = client.stream_requests(job.url, job.api, job.requests, job.concurrency, model=job.model,
                                     headers=job.headers, cache=job.cache, start_at=start)
    except Exception as e:  # noqa: BLE001 - any failure is the parent's one line
        return SliceResult([], 0.0, 0.0, socket.gethostname(), f"{type(e).__name__}: {e}")
    for s in run.done:
        s.shift(-start)
    return SliceResult(run.done, run.end - start, run.cpu_s, socket.gethostname())


def merge(results: list[SliceResult], start: float) -> StreamRun:
    """The workers' records as one run on this process's clock, `start` the common start here."""
    failed = [r.error for r in results if r.error]
    if failed:
        raise BackendError(f"a client worker failed: {failed[0]}")
    done = [s for r in results for s in r.done]
    for s in done:
        s.shift(start)
    done.sort(key=lambda s: s.token_times[-1] if s.token_times else (s.sent or s.scheduled))  # as they finished
    end = start + max((r.end for r in results), default=0.0)
    return StreamRun(start, end, done, cpu_s=sum(r.cpu_s for r in results), workers=len(results))


def run_in_processes(jobs: list[SliceJob], alive, poll_s: float) -> tuple[list[SliceResult], float]:
    from prefillbench.backends.server.process import _die_with_parent

    logs = [tempfile.TemporaryFile() for _ in jobs]
    procs = [subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=log, preexec_fn=_die_with_parent) for log in logs]
    results: list[SliceResult | None] = [None] * len(jobs)
    try:
        for proc, job in zip(procs, jobs):
            pickle.dump(job, proc.stdin)
            proc.stdin.flush()
        readers = [threading.Thread(target=_ready, args=(p,), daemon=True) for p in procs]
        for t in readers:
            t.start()
        _wait(readers, alive, poll_s, READY_TIMEOUT_S, procs, logs, "start")
        start_unix = time.time() + START_LEAD_S
        start = local_start(start_unix)
        for proc in procs:
            proc.stdin.write(f"{start_unix!r}\n".encode())
            proc.stdin.flush()

        def collect(i: int) -> None:
            try:
                results[i] = pickle.load(procs[i].stdout)
            except Exception:  # noqa: BLE001 - a worker that died or wrote anything else: no records, said below
                results[i] = None

        readers = [threading.Thread(target=collect, args=(i,), daemon=True) for i in range(len(procs))]
        for t in readers:
            t.start()
        _wait(readers, alive, poll_s, None, procs, logs, "run")
        for i, r in enumerate(results):
            if r is None:
                raise BackendError(f"client worker {i} ended without its records{_log_tail(logs[i])}")
        return results, start
    finally:
        for proc in procs:
            _end(proc)
        for log in logs:
            log.close()


def _ready(proc: subprocess.Popen) -> None:
    proc.stdout.readline()  # b"ready\n", or b"" where it died


def _wait(threads, alive, poll_s: float, timeout: float | None, procs, logs, what: str) -> None:
    """Until every thread is done; the server's death (alive) or a worker's ends it with that failure."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(poll_s / len(threads))
        if alive is not None and (failure := alive()) is not None:
            raise failure
        for i, p in enumerate(procs):
            if p.poll() not in (None, 0):
                raise BackendError(f"client worker {i} exited with {p.returncode} during its {what}{_log_tail(logs[i])}")
        if deadline is not None and time.monotonic() > deadline:
            raise BackendError(f"client workers not ready after {timeout:g} s")


def _log_tail(log) -> str:
    log.seek(0)
    lines = log.read().decode(errors="replace").strip().splitlines()
    return f": {lines[-1]}" if lines else ""


def _end(proc: subprocess.Popen) -> None:
    """A worker ended: its stdin closed (it exits at EOF), killed if still there a moment later."""
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _worker_main() -> None:
    """A worker process: its job, ready, the start time, its run, its result; it exits when its parent's pipe
    closes (a parent killed, or done)."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    job = pickle.load(stdin)
    from prefillbench.backends.server import client  # noqa: F401 - imported before saying it is ready

    stdout.write(b"ready\n")
    stdout.flush()
    line = stdin.readline()
    if not line:
        return
    start_unix = float(line)

    def parent_gone() -> None:
        stdin.read()  # returns at EOF: the parent closed the pipe or died
        os._exit(0)

    threading.Thread(target=parent_gone, daemon=True).start()
    result = run_slice(job, start_unix)
    pickle.dump(result, stdout)
    stdout.flush()


if __name__ == "__main__":
    # from the module by its name, so that what it pickles is the parent's client_workers.SliceResult, not __main__'s
    from prefillbench.backends.server.client_workers import _worker_main as worker_main

    worker_main()

"""The client's workers as Ray actors (`--client-workers N --client-ray`): one actor a slice of the schedule, spread
over the cluster's nodes, each sending its slice from the common start (wall-clock time, so nodes whose clocks
are synchronised start together) and returning its raw records; the driver merges them into one run
(client_workers.merge). Ray is an optional extra: `pip install 'prefillbench[ray]'`.

The cluster: RAY_ADDRESS where it is set (`ray start --head` on one node, `ray start --address=HEAD:6379` on the
others, prefillbench installed on each), else a local one started for the run and shut down after it."""
from __future__ import annotations

import os
import time
from collections.abc import Callable

from prefillbench.backends.server.client_workers import (READY_TIMEOUT_S, START_LEAD_S, SliceJob, SliceResult,
                                                         local_start, run_slice)
from prefillbench.backends.server.client_settings import NO_RAY
from prefillbench.errors import BackendError



class SliceWorker:
    """One Ray actor: a worker of the run, on whichever node Ray placed it."""

    def ready(self) -> str:
        from prefillbench.backends.server import client  # noqa: F401 - imported before the start is set

        import socket

        return socket.gethostname()

    def run(self, job: SliceJob, start_unix: float) -> SliceResult:
        return run_slice(job, start_unix)


def run_on_ray(jobs: list[SliceJob], alive: Callable[[], Exception | None] | None,
               poll_s: float) -> tuple[list[SliceResult], float]:
    """Each job on an actor of its own (spread over the nodes); their results, and the common start here."""
    try:
        import ray
    except ImportError:
        raise BackendError(NO_RAY) from None
    started = not ray.is_initialized()
    if started:
        address = os.environ.get("RAY_ADDRESS")
        # a local cluster started here holds every worker, on as many CPUs as it takes (a cluster's are its own)
        cpus = None if address else max(len(jobs), os.cpu_count() or 1)
        ray.init(address=address, num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    actors = []
    try:
        remote = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(SliceWorker)
        actors = [remote.remote() for _ in jobs]
        ready = [a.ready.remote() for a in actors]
        done, waiting = ray.wait(ready, num_returns=len(ready), timeout=READY_TIMEOUT_S)
        if waiting:
            raise BackendError(f"{len(waiting)} of {len(ready)} Ray client workers not ready after {READY_TIMEOUT_S:g} s "
                               "(too few CPUs in the cluster for one a worker?)")
        ray.get(ready)
        start_unix = time.time() + START_LEAD_S
        start = local_start(start_unix)
        refs = [a.run.remote(job, start_unix) for a, job in zip(actors, jobs)]
        waiting = list(refs)
        while waiting:
            _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=poll_s)
            if alive is not None and (failure := alive()) is not None:
                raise failure
        return ray.get(refs), start
    finally:
        for actor in actors:
            ray.kill(actor)
        if started:
            ray.shutdown()

"""Where a run's client workers run: processes on this machine (client_workers.py) or Ray actors placed on a
cluster's nodes (client_ray.py); either way the same slices, their raw records merged into one run. A module of its
own so that neither of the two imports the other."""
from __future__ import annotations

from collections.abc import Callable

from prefillbench.backends.server.client_records import StreamRun
from prefillbench.backends.server.client_workers import SliceJob, merge, run_in_processes


def stream_in_workers(jobs: list[SliceJob], *, ray: bool = False, alive: Callable[[], Exception | None] | None = None,
                      poll_s: float = 0.05) -> StreamRun:
    """Each job in a worker of its own (a process here, or a Ray actor), started together; one run merged."""
    if ray:
        from prefillbench.backends.server.client_ray import run_on_ray  # Ray only where asked for: an extra

        results, start = run_on_ray(jobs, alive, poll_s)
    else:
        results, start = run_in_processes(jobs, alive, poll_s)
    return merge(results, start)

"""A pool of forked worker processes that the parent can always end: tune's grid and the design search run on
one. Forked workers inherit the parent's heap (the sim, its specs), so nothing is pickled but the tasks; they
ignore Ctrl-C (the parent takes it and keeps what finished) and never outlive the pool: `ended` terminates them,
kills the ones still there after a grace, and shuts the pool down, on an interrupt and on any error alike. A
worker left alive keeps the pool's manager thread waiting for it, and that thread is joined when the interpreter
exits: the command (or the test process) would hang after it had finished."""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing as mp
import signal
from collections.abc import Callable, Iterator

#: Seconds a terminated worker has to exit before it is killed.
END_GRACE_S = 2.0


def _ignore_ctrl_c_then(initializer: Callable, args: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    initializer(*args)


def end(pool: cf.ProcessPoolExecutor) -> None:
    """Stop the workers now (SIGTERM, SIGKILL after END_GRACE_S) and shut the pool down; queued tasks are dropped."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for p in processes:
        p.terminate()
    for p in processes:
        p.join(END_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join()
    pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def forked_pool(jobs: int, initializer: Callable, initargs: tuple = ()) -> Iterator[cf.ProcessPoolExecutor]:
    """`jobs` forked workers, each set up by initializer(*initargs). Leaving the block normally waits for the tasks
    submitted; leaving it by an exception (Ctrl-C included) ends the workers first."""
    pool = cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork"), initializer=_ignore_ctrl_c_then,
                                  initargs=(initializer, initargs))
    try:
        yield pool
    except BaseException:
        end(pool)
        raise
    pool.shutdown(wait=True)

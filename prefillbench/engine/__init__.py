"""The engine: feeds a strategy's steps to a backend and records when every token appeared.

Requests enter in one of two ways:
- closed loop (requests without an arrival time): `concurrency` of them are in
  flight from the start, and each one that finishes is replaced by the next, so
  fresh prefills keep meeting running decodes;
- open loop (every request has `arrival_s`, seconds after the run starts): a
  request is admitted once it has arrived and fewer than `concurrency` are in
  flight (0: no cap; later ones queue). When nothing can run before the next
  arrival the backend waits for it (`StepBackend.wait_until`: wall time on a real
  backend, the virtual clock on the sim).

A backend may hold several steps at once (the sim's pipeline stages,
`StepBackend.max_steps_in_flight`): a sequence whose step has not come out yet is
not offered to the strategy again, since its next token does not exist yet.
A strategy sees only `waiting` and `running`, never arrivals.

Its parts, as nano-vllm's engine splits its own (LLMEngine, Scheduler, BlockManager):
- `run`, here: checks the requests and runs them on one engine, or on data-parallel ranks (`lockstep`);
- `setup`: one engine's run set up (its KV memory and cache, the strategy, the drafter) and its admission;
- `admission`: how many sequences may be in flight (`fit`: the most the KV cache holds beside their steps),
  and which requests enter when (`Admission`);
- `loop`: the steps, in flight and retired, decode runs, stop checks (`Loop`);
- `records`: what a run returns (RunRecord, RequestRecord, StepRecord) and what `stop` sees (Progress).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from strategies import Strategy

from prefillbench.backends.base import Backend, BackendError, ServingBackend, StepBackend
from prefillbench.engine.admission import Feed
from prefillbench.engine.lockstep import run_lockstep
from prefillbench.engine.loop import STOP_CHECK_STEPS, Loop, StepFailed
from prefillbench.engine.records import Progress, RequestRecord, RunRecord, StepRecord
from prefillbench.engine.served import serve
from prefillbench.engine.setup import admission_for, set_up
from prefillbench.sequence import Request

__all__ = ["STOP_CHECK_STEPS", "Backend", "Progress", "RequestRecord", "RunRecord", "ServingBackend", "StepBackend",
           "StepFailed", "StepRecord", "run"]


def run(
    backend: StepBackend | ServingBackend,
    strategy: Strategy,
    requests: Iterable[Request],
    concurrency: int,
    *,
    keep_logits: bool = False,
    on_tokens: Callable[[int], None] | None = None,
    stop: Callable[[Progress], bool] | None = None,
    feed: Feed | None = None,
) -> RunRecord:
    """Run every request to completion and return what happened, with timestamps.

    `concurrency`: requests in flight (closed loop), or at most in flight (open
    loop, where 0 means no cap). `on_tokens`: called after each step with the tokens it processed (prompt
    tokens of its chunks, pads left out, plus its decodes), for a progress bar that counts work. `stop`: asked
    every STOP_CHECK_STEPS steps whether the run's outcome is already known; True ends it there (`stopped`).
    `feed`: the requests come from it as the run goes (admission.Feed); `requests` are the same ones beforehand,
    for the run's size (their lengths and count), never admitted from the list.

    A ServingBackend is handed the requests whole (`serve`): its engine schedules its own steps, so the strategy
    only names the configuration it is launched with, and `keep_logits` and `feed` do not apply.
    """
    reqs, open_loop, longest_prompt, max_seq_len = _checked(requests, concurrency, backend)
    if isinstance(backend, ServingBackend):
        return serve(backend, strategy, reqs, concurrency, on_tokens, stop)
    if backend.data_parallel > 1:  # N ranks, each an engine of its own, stepping in lockstep (lockstep.py)
        return run_lockstep(backend, strategy, reqs, open_loop, concurrency, longest_prompt, max_seq_len,
                            keep_logits=keep_logits, on_tokens=on_tokens, stop=stop, feed=feed)
    asked = min(concurrency or len(reqs), len(reqs))
    cap, memory, engine_cache, proposer = set_up(backend, strategy, reqs, asked, longest_prompt, max_seq_len,
                                                 keep_logits)
    spec = strategy.speculation
    depth = max(1, backend.max_steps_in_flight)
    # Decode runs (Loop.decode_run) skip the strategy and the step-by-step bookkeeping, where the backend can run
    # them; a forced token or kept logits need every step's own.
    # With speculation on, decode runs are off: every step's drafts come from the tokens of the step before.
    steady = ((strategy.steady_decodes or strategy.steady_while_none_waits) and backend.runs_decodes and depth == 1 and not keep_logits
              and all(r.forced_tokens is None for r in reqs) and spec is None)
    admission = admission_for(backend, strategy, memory, reqs if feed is None else [], open_loop, cap, backend.now(),
                              feed)
    return Loop(backend, strategy, admission, memory, depth, steady, keep_logits, on_tokens, stop,
                spec, proposer).run()


def _checked(requests: Iterable[Request], concurrency: int,
             backend: Backend) -> tuple[list[Request], bool, int, int]:
    """The requests as a list (an open loop's by arrival), whether they are an open loop, the longest prompt and
    the most positions one sequence needs; raises on a run that cannot be."""
    reqs = list(requests)
    if not reqs:
        raise ValueError("a run needs at least one request")
    open_loop = _check_arrivals(reqs)
    if concurrency < (0 if open_loop else 1):
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if open_loop:  # stable: ties keep their order; a session's later turns have no time yet
        reqs.sort(key=lambda r: math.inf if r.follows else r.arrival_s)
    longest_prompt = max(len(r.prompt) for r in reqs)
    max_seq_len = max(len(r.prompt) + r.n_gen for r in reqs)
    if max_seq_len > backend.context_length:
        raise BackendError(
            f"a prompt of {longest_prompt} tokens plus its generation needs {max_seq_len} positions; "
            f"the model's context is {backend.context_length}"
        )
    return reqs, open_loop, longest_prompt, max_seq_len


def _check_arrivals(requests: list[Request]) -> bool:
    """Whether the run is an open loop; the requests must agree. A session's later turns arrive after the turn
    before them (Admission.finished), so only first turns have a time, and sessions run open loop only."""
    followers = [r for r in requests if r.follows]
    requests = [r for r in requests if not r.follows]
    timed = [r.arrival_s is not None for r in requests]
    if followers and not all(timed):
        raise ValueError("multi-turn sessions arrive in an open loop: every first turn needs an arrival time")
    firsts = {r.session for r in requests if r.session is not None}
    if any(r.session not in firsts for r in followers):
        raise ValueError("a session's later turn has no first turn")
    if any(timed) and not all(timed):
        raise ValueError("either every request has an arrival time or none has")
    if all(timed) and min(r.arrival_s for r in requests) < 0:
        raise ValueError("arrival times cannot be negative")
    return all(timed)

"""Admission: how many sequences a run may hold at once, and which requests enter when (nano-vllm's BlockManager,
for a backend that owns its cache).

`fit` sizes the run once, before it starts: backends with a bounded KV cache (the sim) cap the sequences in
flight, and the strategies only ever see those. Fewer sequences need smaller steps, which leave more room for
cache, so it bisects for the most that fit together with their steps.

`Admission` then holds the requests not admitted yet and, once per loop, admits those that have arrived while
fewer than the cap are in flight: closed loop, every queued request has arrived (each finish lets the next in);
open loop, request i arrives `arrival_s` after the run's start.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Protocol

from strategies import Strategy

from prefillbench.backends.base import Backend, BackendError
from prefillbench.sequence import Request, Sequence, SessionTurns, queue_by_arrival


def fit(backend: Backend, strategy: Strategy, asked: int, longest_prompt: int, max_seq_len: int) -> int:
    """The most sequences, at most `asked`, whose KV cache fits in the backend beside the strategy's largest step
    for that many; the backend is told (note_clamp) when that is fewer than asked."""

    def fits(n: int) -> bool:
        step = strategy.max_step_tokens(longest_prompt, n)
        allowed = backend.max_concurrency(max_seq_len, step)
        if backend.kv_cache_tokens is not None:  # --kv-cache-tokens: whole lengths within the shrunk cache too
            room = backend.kv_capacity_tokens(step) // max(max_seq_len, 1)
            allowed = room if allowed is None else min(allowed, room)
        return allowed is None or allowed >= n

    if fits(asked):
        return asked
    lo, hi = 0, asked
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    if lo < 1:
        raise BackendError(f"not one sequence of {max_seq_len} tokens fits in {backend.room()}")
    backend.note_clamp(asked, lo, binding_limit(backend, strategy, lo, longest_prompt, max_seq_len))
    return lo


def binding_limit(backend: Backend, strategy: Strategy, allowed: int, longest_prompt: int, max_seq_len: int) -> str:
    """Which limit keeps sequence `allowed` + 1 out, in words for the clamp line: the engine's max_num_seqs,
    --kv-cache-tokens, the activations of the strategy's largest step (the KV alone would hold more at their whole
    length), or the KV tokens themselves."""
    cap = backend.engine_max_num_seqs
    if cap is not None and allowed >= cap:
        return f"max_num_seqs {cap}"
    step = strategy.max_step_tokens(longest_prompt, allowed + 1)
    own = backend.own_kv_capacity_tokens(step)
    given = backend.kv_cache_tokens
    whole = f"{allowed} sequences of {max_seq_len:,} tokens at their whole length"
    if given is not None and (own is None or given < own) and given // max(max_seq_len, 1) <= allowed:
        return f"--kv-cache-tokens {given:,} holds {whole}"
    alone = backend.max_concurrency(max_seq_len, 0)
    if alone is None or alone > allowed:
        held = "all asked" if alone is None else f"{alone}"
        return (f"{strategy.spec}'s step activations: its largest step, {step:,} tokens for {allowed + 1} sequences, "
                f"takes the room of {'the rest' if alone is None else alone - allowed}; the KV alone holds {held} at "
                f"their whole length")
    room = backend.own_kv_capacity_tokens(0)
    return f"KV tokens: {'the cache' if room is None else f'{room:,}'} hold {whole}"


class Feed(Protocol):
    """Requests that arrive during a run from outside it (deploy/gguf_split.py: prompts whose KV another process
    computed), each with its arrival time, in seconds from the run's start, set when it came."""

    left: int  # requests still to come

    def poll(self, start: float) -> list[Request]:
        """The requests that have come since the last poll (never blocks)."""
        ...

    def wait(self, timeout: float | None) -> None:
        """Block until a request comes or `timeout` seconds pass (None: until one comes)."""
        ...


class Admission:
    """The requests not admitted yet (`pending`, by arrival), and the sequences admitted and not finished (`live`,
    by seq_id, which counts admissions from 0).

    A sequence joins `waiting` (its prompt to process) or, with an empty prompt, `running`; the engine's loop
    moves it on from there and takes it out of all three when it finishes.
    """

    __slots__ = ("pending", "held", "cap", "open_loop", "start", "reuse", "accept", "feed", "reserve", "live", "waiting",
                 "running", "next_id", "next_at", "idle_from", "arrival_lags")

    def __init__(self, requests: list[Request], open_loop: bool, cap: int, start: float,
                 reuse: Callable[[int, tuple[int, ...]], int] | None = None,
                 accept: Callable[[int, Request], None] | None = None, feed: Feed | None = None,
                 reserve=None) -> None:
        # A session's later turns wait for the turn before them to finish (`finished`); the rest queue by arrival.
        self.held = SessionTurns(requests)
        self.pending = deque(self.held.first)
        self.cap = cap  # most sequences in flight
        self.open_loop = open_loop
        self.start = start  # the clock when the run started: an open loop's arrivals count from it
        #: The backend's prefix cache (Backend.reuse_prefix), asked once per admitted prompt; None: no cache this run.
        self.reuse = reuse
        #: The backend's taker of a handed-off prompt's KV (Backend.accept_handoff), asked once per such request.
        self.accept = accept
        #: Requests that arrive from elsewhere as the run goes (a decode instance's handed-off prompts, Feed).
        self.feed = feed
        #: The KV memory (engine/memory.py) in which each admitted sequence reserves its whole length, for the
        #: strategies whose engines reserve; None: the strategy's own memory rule (paged) holds it
        self.reserve = reserve
        self.live: dict[int, Sequence] = {}
        # The strategy's two lists, kept by the loop as sequences move between them rather than rebuilt from `live`
        # every step (a pass over every sequence in flight per step: a tenth of the sim's time). Both in admission order.
        self.waiting: list[Sequence] = []  # prompt not fully processed
        self.running: list[Sequence] = []  # decoding
        self.next_id = 0
        #: The clock from which the first pending request may enter (-inf: any time, a closed loop; inf: none is
        #: left): the loop calls `admit` only from then on, one comparison a pass instead of a call.
        self.next_at = self._first_arrival()
        #: Since when the engine has waited with no step running (set by the loop; None while a step runs), and how
        #: late each request that arrived during such a wait was admitted: the clock's wake-up (open loop only; a
        #: request that arrived during a step waits for it, its scheduling delay, not lag).
        self.idle_from: float | None = start  # nothing runs before the first step
        self.arrival_lags: list[float] = []

    def _first_arrival(self) -> float:
        if not self.pending:
            return math.inf
        return self.start + self.pending[0].arrival_s if self.open_loop else -math.inf

    def admit(self, now: float) -> None:
        """Admit, in order, the requests that have arrived by `now` while fewer than `cap` are in flight."""
        if now < self.next_at or len(self.live) >= self.cap:
            return
        pending, live, cap, start, open_loop = self.pending, self.live, self.cap, self.start, self.open_loop
        while pending and len(live) < cap:
            if open_loop and start + pending[0].arrival_s > now:
                break
            req = pending.popleft()
            arrival = start + req.arrival_s if open_loop else now
            if open_loop and self.idle_from is not None and arrival >= self.idle_from:
                self.arrival_lags.append(now - arrival)
            seq = live[self.next_id] = Sequence.admit(self.next_id, req, arrival, start)
            if self.reserve is not None:  # fit() sized the cap to whole lengths: recorded, never refused here
                self.reserve.grow(seq.seq_id, len(req.prompt) + req.n_gen, strict=False)
            if req.handoff is not None and self.accept is not None:
                self.accept(seq.seq_id, req)
            elif self.reuse is not None:
                seq.n_prefilled = seq.n_cached = self.reuse(seq.seq_id, seq.prompt)
            (self.running if seq.prefill_done else self.waiting).append(seq)
            self.next_id += 1
        self.next_at = self._first_arrival()

    def finished(self, seq: Sequence) -> None:
        """A sequence finished: its session's next turn arrives its think time after the last token (an open
        loop's arrival, in seconds from the run's start), queued in arrival order."""
        follow = self.held.after(seq.session, seq.turn, seq.token_times[-1] - self.start) if seq.session is not None else None
        if follow is not None:
            self.queue(follow)

    def queue(self, request: Request) -> None:
        """A request whose arrival (an open loop's, from the run's start) is known only now, queued by it."""
        queue_by_arrival(self.pending, request)
        self.next_at = self._first_arrival()

    def hand(self, request: Request) -> None:
        """A request handed over as it arrives (a data-parallel rank's, engine/lockstep.py): after every one queued,
        in a closed loop too, whose requests have no arrival time for `queue` to order by."""
        self.pending.append(request)
        self.next_at = self._first_arrival()

    def take_fed(self) -> None:
        """What the feed has brought since the last look, queued."""
        for request in self.feed.poll(self.start):
            self.queue(request)

    @property
    def awaiting(self) -> bool:
        """Requests are still to come from the feed."""
        return self.feed is not None and self.feed.left > 0

    def next_arrival(self) -> float | None:
        """When the next queued request may be admitted; None if it may be now or never before a finish."""
        if not self.pending or len(self.live) >= self.cap or not self.open_loop:
            return None
        return self.next_at

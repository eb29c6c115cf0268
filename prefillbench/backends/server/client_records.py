"""What the streaming client records: each request as it saw it (Streamed) and the run (StreamRun). Times are the
monotonic clock's seconds (`clock`): one clock for every process of this machine (Linux's CLOCK_MONOTONIC), so
worker processes' records need no translation; records from another machine are moved onto this one's clock by
the run's common start (client_workers.merge)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prefillbench.sequence import Request

clock = time.monotonic


@dataclass(repr=False)
class Streamed:
    """One request as the client saw it."""

    request: Request
    scheduled: float  # when it was due: its arrival (open loop), or when a place in flight freed (closed loop)
    sent: float | None = None
    token_times: list[float] = field(default_factory=list)
    server_token_times: list[float] = field(default_factory=list)  # the engine's clock, ms from the slot's start
    tokens: list[int] = field(default_factory=list)
    first_scheduled: float | None = None  # the prompt's start, from the engine's progress events
    cached_tokens: int | None = None  # prompt tokens the engine found in its prefix cache, as it reported them
    error: str | None = None
    events: int = 0
    queued: bool = False  # it waited for a place in flight (the concurrency cap): its send time is not lag
    # the OpenAI stream's reading state (OpenAIApi): the last token event's arrival, the last chunk's start and size
    last_event_at: float | None = None
    chunk_start: float | None = None
    chunk_tokens: int = 0
    # the stream as it came: each chunk of bytes and its arrival, until it is read (client_events.read_stream)
    chunks: list[bytes] = field(default_factory=list)
    chunk_times: list[float] = field(default_factory=list)
    parsed: bool = False  # its events are read: tokens, times and outcome are known

    def __repr__(self) -> str:
        # short: asyncio's runner formats its main task, result and all, when it restores the SIGINT handler
        # (signal.getsignal's enum lookup); a record's every chunk and time in that text cost a tenth of the run's CPU
        return (f"Streamed(n_prompt={len(self.request.prompt)}, n_gen={self.request.n_gen}, "
                f"tokens={len(self.tokens)}, reads={len(self.chunk_times)}, error={self.error!r})")

    @property
    def lag(self) -> float:
        return (self.sent - self.scheduled) if self.sent is not None else 0.0

    def shift(self, delta: float) -> None:
        """Every time of the record moved by `delta` seconds (onto another clock)."""
        self.scheduled += delta
        if self.sent is not None:
            self.sent += delta
        self.token_times = [t + delta for t in self.token_times]
        self.chunk_times = [t + delta for t in self.chunk_times]
        for name in ("first_scheduled", "last_event_at", "chunk_start"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value + delta)


@dataclass(repr=False)
class StreamRun:
    start: float
    end: float
    done: list[Streamed]  # in the order they finished
    stopped: bool = False
    # the engine's own clock over the run (engine_clock.Reading), set by the backend where its /metrics could be read
    engine_clock: Any = None
    # the engine's own account of its KV memory over the run (engine_metrics.KVMemory), where it gives one
    engine_kv: Any = None
    # the client's own cost: CPU seconds of its processes over the run, and the processes that sent it
    cpu_s: float = 0.0
    workers: int = 1
    #: where the row's latencies start: "scheduled" (each request's due time, MLPerf loadgen's rule: a late client
    #: cannot hide delay) or "sent" (when it went out, as vLLM's bench serve times it)
    latency_from: str = "scheduled"

    def __repr__(self) -> str:
        return f"StreamRun({len(self.done)} requests, {self.end - self.start:.3f} s, workers={self.workers})"

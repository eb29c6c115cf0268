"""What a run returns: a record of every step and every request, with the backend's timestamps."""
from __future__ import annotations

import math

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prefillbench.sequence import Request, Sequence
from prefillbench.step import Step


@dataclass
class StepRecord:
    start: float
    end: float
    prefill_chunks: list[tuple[int, int]]  # (start position, length) of each chunk
    n_pad: int
    decode_contexts: list[int]  # context length each decode token attends to
    chunk_emits: int = 0  # prompt chunks that were their prompt's last, so emitted a token (the decodes all do)
    cached: int = 0  # prompt tokens of this step's first chunks that the prefix cache held (so were not computed)
    instance: int = 0  # the deployment's instance that ran it (deploy/: prefill instances first); 0 colocated
    preempted: int = 0  # sequences preempted (or retracted) before it ran
    #: prompt chunks (and their tokens) that recompute a preempted sequence's KV, output included: vLLM's iteration
    #: log counts these as generation, not context, requests (its output tokens are not 0)
    resumed_chunks: int = 0
    resumed_tokens: int = 0
    policy_values: tuple[tuple[str, float], ...] = ()  # the strategy's state as it chose the step (Step.policy_values)
    #: draft tokens its decodes fed after their tokens (speculative decoding): query tokens beside the decodes' own
    drafts: int = 0

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class RequestRecord:
    prompt_len: int
    arrival: float
    token_times: list[float]
    tokens: list[int]
    logits: list = field(default_factory=list)
    #: Start of the first step that carried the request; its scheduling delay is this minus `arrival`.
    first_scheduled: float | None = None
    #: A served request that failed (an HTTP error, a dropped stream, fewer tokens than asked): why.
    error: str | None = None
    #: A server's own clock for each token (ms from its slot's start), where the engine reports one.
    server_token_times: list[float] | None = None
    #: Leading prompt tokens the backend's prefix cache held (a server: what the engine reported); None: not known.
    cached_tokens: int | None = None
    session: int | None = None  # a multi-turn session's id, and the turn (0 first)
    turn: int = 0
    #: A disaggregated deployment (deploy/): the instance that decoded it, and when its KV arrived there.
    instance: int = 0
    kv_arrival: float | None = None
    #: Times its KV was freed before it finished (preempted or retracted), and the tokens computed again for it.
    preemptions: int = 0
    recomputed: int = 0
    found_again: int = 0  # of the tokens its preemptions freed, those the engine's block cache held on resuming
    retractions: int = 0  # of its preemptions, those that sent it to the queue's tail (SGLang's retraction)
    length_class: str | None = None  # the request's class (Request.length_class); None: none given
    #: Speculative decoding (counted only with it on): draft tokens fed, of those accepted, decode steps that carried
    #: drafts (verify steps), and decode steps in all.
    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0
    decode_steps: int = 0


@dataclass
class RunRecord:
    start: float
    end: float
    requests: list[RequestRecord]  # when stopped: only the finished ones
    steps: list[StepRecord]
    stopped: bool = False  # ended by `stop` before every request finished
    failed: list[RequestRecord] = field(default_factory=list)  # served requests that failed: counted, never timed
    # a served run's engine clock (backends.server.engine_clock.Reading): what its /metrics counted over the run
    engine_clock: Any = None
    # a served run's KV memory as the engine reported it (backends.server.engine_metrics.KVMemory)
    engine_kv: Any = None
    # seconds each open-loop request was taken late: sent after its due time (a server's client; not those that
    # waited for a place in flight), or admitted after arriving while the engine waited idle (a step backend)
    arrival_lags: list[float] = field(default_factory=list)
    #: the engine's KV memory: the most of it held at once (a share; nan: unbounded) and how it was held ("reserve":
    #: whole lengths from admission, "paged": blocks as computed, with preemption); "" for a served run
    kv_peak_fraction: float = math.nan
    kv_policy: str = ""
    #: the engine's block cache over the run (engine/block_cache.py CacheStats: vLLM's prefix-cache counters and the
    #: blocks evicted); None: no block cache
    kv_cache: Any = None
    #: a served run's client (backends/server/client.py): the CPU seconds its processes spent over the run, and how
    #: many processes sent it (0: no client, a step backend)
    client_cpu_s: float = math.nan
    client_workers: int = 0

    @property
    def wall(self) -> float:
        return self.end - self.start


@dataclass
class Progress:
    """A run so far, for a caller that can tell its outcome before it ends (capacity's certain failures).
    Times are the backend's clock; `pending` are the requests not admitted yet, by arrival."""

    start: float
    now: float
    finished: list[RequestRecord]  # in the order they finished
    live: list[Sequence]
    pending: deque[Request]


def step_record(step: Step, start: float, end: float) -> StepRecord:
    prefills = step.prefills
    if not prefills:  # most steps on the sim: one record per simulated step
        record = StepRecord(start, end, [], 0, [d.position + 1 for d in step.decodes])
    else:
        record = StepRecord(start, end, [(c.start, len(c.tokens)) for c in prefills], step.n_pad_tokens,
                            [d.position + 1 for d in step.decodes], sum([c.is_last for c in prefills]))
    if step.policy_values:
        record.policy_values = step.policy_values
    return record


def request_record(seq: Sequence, logits: list, cached: bool = False) -> RequestRecord:
    """A finished sequence's record; `cached`: the run had a prefix cache, so its count of cached tokens is known."""
    return RequestRecord(seq.request_prompt_len, seq.arrival, seq.token_times, seq.generated, logits, seq.first_scheduled,
                         cached_tokens=seq.n_cached if cached else None, session=seq.session, turn=seq.turn,
                         kv_arrival=seq.kv_arrival, preemptions=seq.preemptions, recomputed=seq.recomputed,
                         found_again=seq.found_again,
                         retractions=seq.retractions,
                         length_class=seq.length_class, drafted=seq.n_drafted, accepted=seq.n_accepted,
                         verify_steps=seq.n_verify_steps, decode_steps=seq.n_decode_steps)

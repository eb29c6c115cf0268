"""The engine: feeds a strategy's steps to a backend and records when every token appeared.

Requests enter a closed loop: `concurrency` of them are in flight from the
start, and each one that finishes is replaced by the next waiting request, so
fresh prefills keep meeting running decodes.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from strategies import Strategy

from .backends.base import Backend, BackendError
from .sequence import Sequence
from .step import Step
from .workloads import Request


@dataclass
class StepRecord:
    start: float
    end: float
    prefill_chunks: list[tuple[int, int]]  # (start position, length) of each chunk
    n_pad: int
    decode_contexts: list[int]  # context length each decode token attends to

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


@dataclass
class RunRecord:
    start: float
    end: float
    requests: list[RequestRecord]
    steps: list[StepRecord]

    @property
    def wall(self) -> float:
        return self.end - self.start


class StepFailed(BackendError):
    """A backend could not execute a step; says which one."""


def _step_record(step: Step, start: float, end: float) -> StepRecord:
    return StepRecord(
        start,
        end,
        [(c.start, len(c.tokens)) for c in step.prefills],
        step.n_pad_tokens,
        [d.position + 1 for d in step.decodes],
    )


def run(
    backend: Backend,
    strategy: Strategy,
    requests: Iterable[Request],
    concurrency: int,
    *,
    keep_logits: bool = False,
    on_token: Callable[[int], None] | None = None,
) -> RunRecord:
    """Run every request to completion and return what happened, with timestamps."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    pending = deque(requests)
    if not pending:
        raise ValueError("a run needs at least one request")
    longest_prompt = max(len(r.prompt) for r in pending)
    max_seq_len = max(len(r.prompt) + r.n_gen for r in pending)
    if max_seq_len > backend.context_length:
        raise BackendError(
            f"a prompt of {longest_prompt} tokens plus its generation needs {max_seq_len} positions; "
            f"the model's context is {backend.context_length}"
        )
    # Backends with a bounded KV cache (the sim) cap the sequences in flight: the strategies only see those.
    allowed = backend.max_concurrency(max_seq_len, strategy.max_step_tokens(longest_prompt, min(concurrency, len(pending))))
    if allowed is not None:
        if allowed < 1:
            raise BackendError(f"not one sequence of {max_seq_len} tokens fits in {backend.label}'s KV cache")
        if allowed < min(concurrency, len(pending)):
            backend.note_clamp(concurrency, allowed)
            concurrency = allowed
    # Backends that schedule a run themselves (the sim's pipeline parallelism) take over here.
    record = backend.custom_run(strategy, pending, concurrency, on_token=on_token)
    if record is not None:
        return record
    in_flight = min(concurrency, len(pending))
    backend.prepare(in_flight, max_seq_len, strategy.max_step_tokens(longest_prompt, in_flight))

    next_id = 0
    live: dict[int, Sequence] = {}
    done: list[tuple[int, RequestRecord]] = []
    steps: list[StepRecord] = []

    def admit(now: float) -> None:
        nonlocal next_id
        while pending and len(live) < concurrency:
            req = pending.popleft()
            live[next_id] = Sequence(next_id, req.prompt, req.n_gen, now)
            next_id += 1

    start = backend.now()
    admit(start)
    logits: dict[int, list] = {}
    while live:
        seqs = list(live.values())  # dicts keep admission order: oldest first
        waiting = [s for s in seqs if not s.prefill_done]
        running = [s for s in seqs if s.prefill_done]
        step = strategy.next_step(waiting, running)
        if not step:
            raise RuntimeError(f"strategy {strategy.name} produced an empty step with work left")
        t0 = backend.now()
        try:
            result = backend.execute(step, return_logits=keep_logits)
        except BackendError as e:
            raise StepFailed(f"step {len(steps)} ({step.n_tokens} tokens) failed: {e}") from None
        t1 = backend.now()
        steps.append(_step_record(step, t0, t1))
        for chunk in step.prefills:
            live[chunk.seq_id].n_prefilled = chunk.end
        for seq_id, token in result.next_tokens.items():
            seq = live[seq_id]
            seq.generated.append(token)
            seq.token_times.append(t1)
            if keep_logits and result.logits is not None:
                logits.setdefault(seq_id, []).append(result.logits[seq_id])
        if on_token is not None:
            on_token(len(result.next_tokens))
        for seq in [s for s in live.values() if s.finished]:
            backend.release(seq.seq_id)
            del live[seq.seq_id]
            done.append(
                (seq.seq_id, RequestRecord(seq.prompt_len, seq.arrival, seq.token_times, seq.generated, logits.pop(seq.seq_id, [])))
            )
        admit(t1)
    end = backend.now()
    done.sort(key=lambda item: item[0])
    return RunRecord(start, end, [record for _, record in done], steps)

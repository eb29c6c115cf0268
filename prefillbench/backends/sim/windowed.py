"""The sim backend's steps for a model with sliding windows (Mistral's, gpt-oss's alternating layers): each sequence
holds kv_positions(length) of the cache and decode attention is priced on each window's capped contexts. The
dense path (backend.py) runs wherever every sequence stays within every window; these run the rest, on the
backend's own state, as its methods would."""
from __future__ import annotations

import math
from bisect import bisect_right
from itertools import repeat
from operator import add

from prefillbench.backends.base import DecodeRun
from prefillbench.backends.sim.placeholders import placeholder_run, placeholder_token
from prefillbench.step import Step, StepResult


def execute_windowed(backend, step: Step) -> StepResult:
    """execute for a model with sliding windows: each sequence holds kv_positions(length) of the cache, and
    decode attention is priced on each window's capped contexts."""
    held = backend._seq_tokens
    span = backend._token_span
    charge = backend.model.kv_positions
    tokens: dict[int, int] = {}
    lengths = []
    for d in step.decodes:
        length = d.position + 1
        lengths.append(length)
        backend._held += charge(length) - charge(held.get(d.seq_id, 0))
        held[d.seq_id] = length
        tokens[d.seq_id] = placeholder_token(d.seq_id, length, span)
    chunks, emitting = backend.hold_prefills(step, tokens, charge)
    n_emit = len(lengths) + emitting
    if backend._trace is None:
        window_ctx = {w: sum(min(x, w) for x in lengths) for w in backend.cost.windows}
        seconds = backend.cost.fast_seconds(chunks, len(lengths), sum(lengths), n_emit, window_ctx, backend._idle)
    else:
        cost = backend.step_cost(step, backend._idle)
        backend.trace_step(step, backend.clock, cost)
        seconds = cost.seconds
    backend.end_step(step, seconds, held="layer-positions")
    return StepResult(tokens)


def run_decodes_windowed(backend, step: Step, max_steps: int, until: float) -> DecodeRun | None:
    """run_decodes for a model with sliding windows: a step adds one position per sequence on each full layer
    and on each windowed layer whose window the sequence has not yet filled."""
    decodes = step.decodes
    n = len(decodes)
    ids = [d[0] for d in decodes]
    lengths = [d[2] + 1 for d in decodes]
    held = backend._seq_tokens
    charge = backend.model.kv_positions
    grown = sum(map(charge, lengths)) - sum(charge(held.get(i, 0)) for i in ids)
    if backend._held + grown > backend._kv_capacity:
        return None  # the first step overflows: execute says so
    ordered = sorted(lengths)
    windows = backend.cost.windows
    window_ctx = {w: sum(min(x, w) for x in lengths) for w in windows}
    price, sigma, jitter = backend.cost.fast_seconds, backend.gpu.step_jitter, backend._jitter
    start = clock = backend.clock
    ctx = sum(lengths)
    ends = []
    k = 0
    idle, backend._idle = backend._idle, False
    while True:
        seconds = price((), n, ctx, n, window_ctx, idle)
        idle = False
        if jitter is not None:
            seconds *= math.exp(sigma * jitter.gauss(0.0, 1.0))
        clock += seconds
        ends.append(clock)
        k += 1
        if clock >= until or k >= max_steps:
            break
        # The next step: contexts one longer; on a window's layers only those still under it grow.
        under = {w: bisect_right(ordered, w - k) for w in windows}  # sequences with length + k <= w
        more = backend._full_layers * n + sum(backend._window_layers[w] * under[w] for w in windows)
        if backend._held + grown + more > backend._kv_capacity:
            break
        grown += more
        ctx += n
        for w in windows:
            window_ctx[w] += under[w]
    backend.clock = clock
    backend.n_steps += k
    backend._held += grown
    held.update(zip(ids, map(add, lengths, repeat(k - 1, n))))
    span = backend._token_span
    return DecodeRun(start, ends, {i: placeholder_run(i, length, k, span) for i, length in zip(ids, lengths)})

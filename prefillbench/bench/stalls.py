"""Which prefill made a decode wait: every gap between two tokens of a request, traced to the steps it spanned.

A gap runs from one token of a request to its next (both are the ends of steps: a token exists once its step
has come out). Over that window the backend ran steps, its own or other sequences': the gap's time is split into
the time in steps that computed prompt tokens (`behind`: the decode waited behind a prefill, whether it shared
the step, as in a chunked step, or was left out of it, as sequential's whole prompt leaves every decode), the
time in decode-only steps (`decode`), and the rest (`between`: no step ran, the engine's own work between steps,
or a wait). The prompt tokens computed in the window (pads included: they cost what real tokens cost) say how
large the prefill was.

Where steps overlap (the sim's pipeline stages), a moment is behind prefill when any step running then computed
prompt tokens. A served run (a server schedules its own steps) has no step records; where the engine dates each
prompt's start (llama-server's prompt progress events: `first_scheduled`), its prompt's span, from that start to its
first token, stands in for its steps: llama-server puts a chunk of a prompt in every batch until the prompt is done,
so a moment inside a span is in a step computing prompt tokens. Outside every span the engine ran decodes or
nothing, which the client cannot tell apart (both count as `decode`), and a span's prompt tokens (less what the
engine found cached) are spread evenly over it. vLLM dates no prompt's start: its rows have no attribution.

TBT p99 is split the same way: the p99 sits between two order statistics of the gaps (numpy's linear rule), and
its parts are those two gaps' parts with the same weights, so they add up to the p99 exactly. The parts are
measured, not fitted: `behind + decode` is the steps' own time, `between` what no step accounts for.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from prefillbench.engine import RunRecord


@dataclass(frozen=True)
class Gaps:
    """Every gap between two tokens of one request over a run's requests (in request order, then token order),
    with its parts in ms and the prompt tokens computed while it lasted."""

    ms: np.ndarray
    behind_ms: np.ndarray
    decode_ms: np.ndarray
    prompt_tokens: np.ndarray

    @property
    def between_ms(self) -> np.ndarray:
        # what is left once the steps' time is taken out; rounding leaves -1e-15 where steps fill the gap
        return np.maximum(self.ms - self.behind_ms - self.decode_ms, 0.0)

    @staticmethod
    def concat(parts: list[Gaps]) -> Gaps:
        return Gaps(*(np.concatenate([getattr(p, f) for p in parts]) if parts else np.zeros(0) for f in GAP_FIELDS))


GAP_FIELDS = ("ms", "behind_ms", "decode_ms", "prompt_tokens")


def _gap_counts(requests: list) -> np.ndarray:
    """Each request's gaps: one fewer than its tokens."""
    return np.array([max(len(r.token_times) - 1, 0) for r in requests], dtype=int)


def request_gaps(run: RunRecord) -> list[Gaps] | None:
    """run_gaps cut per request, in the run's request order; None where the run has no steps."""
    gaps = run_gaps(run)
    if gaps is None:
        return None
    cuts = np.cumsum(_gap_counts(run.requests))[:-1]
    return [Gaps(*parts) for parts in zip(*(np.split(getattr(gaps, f), cuts) for f in GAP_FIELDS))]


def run_gaps(run: RunRecord) -> Gaps | None:
    """The run's gaps, attributed; None where the run has no steps (a served run). In a deployment (deploy/) a
    request's gaps are read on the steps of the instance that decoded it: a prefill instance's steps hold up no
    decode (the first gap, from the prefill instance's token to the decode instance's, spans the KV's transfer:
    time in no step of the decode instance, or in its steps for others)."""
    if not run.steps:
        return _served_gaps(run)
    instances = sorted({s.instance for s in run.steps} | {r.instance for r in run.requests})
    if len(instances) == 1:
        return _gaps(run.steps, run.requests)
    # each instance's requests on its own steps, put back in the run's request order, which the row's TBT array has
    # (metrics.tbts_ms): the positions of a request's gaps in that order are its offset onwards
    counts = _gap_counts(run.requests)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    out = {f: np.empty(offsets[-1]) for f in GAP_FIELDS}
    for k in instances:
        mine = [i for i, r in enumerate(run.requests) if r.instance == k]
        g = _gaps([s for s in run.steps if s.instance == k], [run.requests[i] for i in mine])
        at = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in mine]) if mine else np.zeros(0, int)
        for f in GAP_FIELDS:
            out[f][at] = getattr(g, f)
    return Gaps(*(out[f] for f in GAP_FIELDS))


def _gaps(steps: list, requests: list) -> Gaps:
    """The gaps of `requests` between the `steps` of one instance."""
    if not steps:
        n = int(_gap_counts(requests).sum())
        ms = np.concatenate([1e3 * np.diff(r.token_times) for r in requests]) if n else np.zeros(0)
        return Gaps(ms, np.zeros(n), np.zeros(n), np.zeros(n))
    starts = np.fromiter((s.start for s in steps), float, len(steps))
    ends = np.fromiter((s.end for s in steps), float, len(steps))
    # most steps decode only (no chunk): their prompt tokens are 0, no sum to take
    tokens = np.fromiter(((sum(n for _, n in c) + s.n_pad) if (c := s.prefill_chunks) else 0 for s in steps), float,
                         len(steps))
    order = np.argsort(starts, kind="stable")
    starts, ends, tokens = starts[order], ends[order], tokens[order]
    timeline = Timeline(starts, ends, tokens > 0)
    # the prompt tokens of the steps overlapping a window, by prefix sums over the steps by start (their ends,
    # made monotone, for the first step ending after the window opens)
    reach = np.maximum.accumulate(ends)
    prompt_sums = np.concatenate([[0.0], np.cumsum(tokens)])
    a, b = _windows(requests)
    if a.size == 0:
        return Gaps.concat([])
    behind = timeline.behind(b) - timeline.behind(a)
    busy = timeline.busy(b) - timeline.busy(a)
    first = np.searchsorted(reach, a, side="right")
    last = np.searchsorted(starts, b, side="left")
    prompt = prompt_sums[np.maximum(last, first)] - prompt_sums[first]
    return Gaps(1e3 * (b - a), 1e3 * behind, 1e3 * (busy - behind), prompt)


def _served_gaps(run: RunRecord) -> Gaps | None:
    """A served run's gaps against its prompts' spans (the module's docstring); None where no prompt is dated."""
    spans = [(r.first_scheduled, r.token_times[0], r.prompt_len - (r.cached_tokens or 0)) for r in run.requests
             if r.first_scheduled is not None and r.token_times and r.token_times[0] > r.first_scheduled]
    if not spans:
        return None
    starts, ends, tokens = (np.array(v, dtype=float) for v in zip(*spans))
    timeline = Timeline(starts, ends, np.ones(len(starts), dtype=bool))
    a, b = _windows(run.requests)
    if a.size == 0:
        return Gaps.concat([])
    behind = timeline.behind(b) - timeline.behind(a)
    # the prompt tokens computed in a window: each span's tokens at an even rate over it
    rate = tokens / (ends - starts)
    computed = lambda t: (np.clip(t[:, None] - starts[None, :], 0, (ends - starts)[None, :]) * rate).sum(axis=1)  # noqa: E731
    ms = 1e3 * (b - a)
    return Gaps(ms, 1e3 * behind, ms - 1e3 * behind, computed(b) - computed(a))


def _windows(requests: list) -> tuple[np.ndarray, np.ndarray]:
    """Every gap's (from, to) over the requests, in their order: all token times in one array, each request's last
    left out of the starts and its first out of the ends."""
    counts = np.array([len(r.token_times) for r in requests], dtype=int)
    if not (counts > 1).any():
        return np.zeros(0), np.zeros(0)
    times = np.fromiter((t for r in requests for t in r.token_times), float, int(counts.sum()))
    ends = np.cumsum(counts)
    last = np.zeros(len(times), dtype=bool)
    first = np.zeros(len(times), dtype=bool)
    last[ends[counts > 0] - 1] = True
    first[(ends - counts)[counts > 0]] = True
    return times[~last], times[~first]


class Timeline:
    """The run's clock cut where any step starts or ends; for each piece, whether a step ran and whether one
    computed prompt tokens; `busy(t)` and `behind(t)`: the time of each kind from the first step to t (steps that
    overlap count once); `busy_s`: all of it."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray, prefill: np.ndarray) -> None:
        cuts = np.unique(np.concatenate([starts, ends]))
        at_start, at_end = np.searchsorted(cuts, starts), np.searchsorted(cuts, ends)
        running = np.zeros(len(cuts) + 1)
        np.add.at(running, at_start, 1)
        np.add.at(running, at_end, -1)
        prefilling = np.zeros(len(cuts) + 1)
        np.add.at(prefilling, at_start[prefill], 1)
        np.add.at(prefilling, at_end[prefill], -1)
        lengths = np.diff(cuts)
        self.cuts = cuts
        self._busy = np.concatenate([[0.0], np.cumsum(lengths * (np.cumsum(running)[:-2] > 0))])
        self._behind = np.concatenate([[0.0], np.cumsum(lengths * (np.cumsum(prefilling)[:-2] > 0))])

    @property
    def busy_s(self) -> float:
        return float(self._busy[-1])

    def busy(self, t: np.ndarray) -> np.ndarray:
        return np.interp(t, self.cuts, self._busy)

    def behind(self, t: np.ndarray) -> np.ndarray:
        return np.interp(t, self.cuts, self._behind)


@dataclass(frozen=True)
class TailParts:
    """TBT p99 and its parts (ms; they add up to it), the prompt tokens computed during it, how many of the gaps
    at or above it waited behind a prefill, and the p99s of the gaps with no prompt token in them and with some."""

    p99_ms: float
    behind_ms: float
    decode_ms: float
    between_ms: float
    prompt_tokens: float
    tail_behind_share: float
    decode_only_p99_ms: float
    behind_prefill_p99_ms: float


NO_PARTS = TailParts(*[math.nan] * 8)


def tail_parts(gaps: Gaps, q: float = 99.0) -> TailParts:
    """The q-th percentile of the gaps split into its parts (the module's docstring says how)."""
    n = gaps.ms.size
    if n == 0:
        return NO_PARTS
    order = np.argsort(gaps.ms, kind="stable")
    rank = q / 100 * (n - 1)
    k = int(math.floor(rank))
    w = rank - k
    i, j = order[k], order[min(k + 1, n - 1)]

    def at(values: np.ndarray) -> float:
        return float((1 - w) * values[i] + w * values[j])

    p99 = at(gaps.ms)
    tail = gaps.ms >= gaps.ms[i]
    behind_any = gaps.prompt_tokens > 0
    return TailParts(
        p99, at(gaps.behind_ms), at(gaps.decode_ms), at(gaps.between_ms), at(gaps.prompt_tokens),
        float(np.mean(behind_any[tail])), _p(gaps.ms[~behind_any], q), _p(gaps.ms[behind_any], q))


def _p(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


def stall_columns(runs: list[RunRecord]) -> dict:
    """The row's stall columns (metrics.ResultRow): TBT p99's parts over every gap of every run; {} where the runs
    have no steps or no gaps."""
    found = [g for run in runs if (g := run_gaps(run)) is not None]
    if not found:
        return {}
    parts = tail_parts(Gaps.concat(found))
    if math.isnan(parts.p99_ms):
        return {}
    return {"tbt_p99_behind_prefill_ms": parts.behind_ms, "tbt_p99_decode_ms": parts.decode_ms,
            "tbt_p99_between_steps_ms": parts.between_ms, "tbt_p99_prefill_tokens": parts.prompt_tokens,
            "tbt_tail_behind_prefill": parts.tail_behind_share, "tbt_p99_decode_only_ms": parts.decode_only_p99_ms,
            "tbt_p99_with_prefill_ms": parts.behind_prefill_p99_ms}

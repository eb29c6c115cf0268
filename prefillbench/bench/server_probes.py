"""The sim calibrated on a serving engine from its own answers: request shapes chosen so that what the client sees
is one known step, then the same fit `calibrate` runs on a stepped backend (backends.sim.calibration.fit).

A serving engine cannot be handed a step; it can be handed requests whose steps are known, under a configuration
that makes them so (a token budget above every probe's prompt beside its decodes, as many slots as the probes have
requests in flight). Three shapes, each measuring one kind of step:

- a lone prompt of n tokens, nothing else running: its TTFT is one step of an n-token chunk (plus the request's
  way in and its first token's way out: a per-request constant the fit's step overhead takes);
- c requests decoding together at context L: in the window where all c have their first token and none has
  finished, every gap between two of a request's tokens is one step of c decodes at context L + k;
- a prompt arriving while c requests decode: the engine runs it whole in its next step beside the decodes
  (decodes first, then prompt tokens up to the budget: llama-server's update_slots, vLLM's V1 scheduler), so the
  decoders' gap that ends with the prompt's first token is that mixed step.

One probe shape is held out of the fit and its error reported apart (a check on data the fit never saw). This
module knows no server class: it calls `serve(requests, concurrency)` and reads what the client recorded for each
request (`.request`, `.sent`, `.token_times`, `.error`: backends.server.client.Streamed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from prefillbench.backends.sim import calibration_measured
from prefillbench.backends.sim.calibration import JITTER_KEY, Point, Sample, document, fit, medians
from prefillbench.backends.sim.cost import Batch, CostModel
from prefillbench.backends.sim.specs import GPUSpec, ModelSpec
from prefillbench.errors import BackendError
from prefillbench.sequence import Request

#: A probe's gaps where one is under this share of the median came in events carrying several tokens (vLLM's
#: stream under load): the step is then the window's mean, not its median gap.
MERGED_SHARE = 0.25
#: A decoder's token belongs to the arriving prompt's step when it came within this share of a decode step of
#: the prompt's first token (one step's events leave the server together; the next step's come a step later).
SAME_STEP_SHARE = 0.3


@dataclass(frozen=True)
class ProbePlan:
    """Which shapes are probed. `decodes`: (requests decoding together, their prompt length); `chunks`: prompts
    arriving beside `beside` decoders whose prompts are `beside_prompt` long."""

    prompts: tuple[int, ...]
    decodes: tuple[tuple[int, int], ...]
    chunks: tuple[int, ...]
    beside: int
    beside_prompt: int
    repeats: int = 3
    decode_tokens: int = 24

    @property
    def slots(self) -> int:
        return max([c for c, _ in self.decodes] + [self.beside + 1 if self.chunks else 1])

    @property
    def slot_length(self) -> int:
        """Each slot's context, the same in every probe (a longer one would relaunch the server): a whole multiple
        of 256, as the server backend sizes it, with room for the mixed probe's decoders to run for a while."""
        longest = max([n + 1 for n in self.prompts] + [L + self.decode_tokens for _, L in self.decodes]
                      + [self.beside_prompt + 256 if self.chunks else 0])
        return -(-longest // 256) * 256

    @property
    def budget(self) -> int:
        """A token budget that holds every probe's step whole: a lone prompt, or a chunk beside its decoders (the
        decodes count in it, as llama-server's -b counts them), rounded up to 64."""
        most = max(list(self.prompts) + [n + self.beside for n in self.chunks] + [self.slots])
        return -(-most // 64) * 64

    def held_out(self) -> Point:
        """The shape the fit does not see: the last mixed one where there are two (the mixed-step factor is then
        fitted on the others and checked on it), else the middle decode batch."""
        if len(self.chunks) >= 2:
            return Point((0, self.chunks[-1]), self.beside, self.beside_prompt)
        c, L = sorted(self.decodes)[len(self.decodes) // 2]
        return Point(None, c, L)

    def describe(self) -> str:
        return (f"lone prompts of {', '.join(map(str, self.prompts))} tokens; "
                f"{', '.join(f'{c} decoding at {L}' for c, L in self.decodes)}; "
                + (f"prompts of {', '.join(map(str, self.chunks))} beside {self.beside} decodes; " if self.chunks else "")
                + f"x{self.repeats}, budget {self.budget}, {self.slots} slots of {self.slot_length}")


def plan(quick: bool = False, prompt: int | None = None, n_gen: int = 0, budgets: tuple[int, ...] = (),
         context: int = 8192, repeats: int | None = None) -> ProbePlan:
    """The default shapes, plus a workload's: its prompt as a lone prompt, its budgets' chunks beside decodes,
    decodes at its mid-generation context."""
    prompts = [32, 128, 256] if quick else [16, 32, 64, 128, 256]
    concurrency = [1, 4, 8] if quick else [1, 2, 4, 8]
    contexts = [64, 256] if quick else [64, 192, 384]
    chunks = [64, 256] if quick else [32, 64, 128, 256]
    if prompt:
        prompts.append(prompt)
        contexts.append(prompt + max(n_gen // 2, 1))
        chunks += [min(b, prompt) for b in budgets] + [prompt]
    limit = max(64, context - 64)
    keep = lambda xs: tuple(sorted({x for x in xs if 0 < x <= limit}))  # noqa: E731
    ctxs = keep(contexts)
    decodes = tuple((c, L) for c in sorted(set(concurrency)) for L in ctxs)
    most = max(concurrency)
    return ProbePlan(keep(prompts), decodes, keep(chunks), most - 1, 128,
                     repeats or (2 if quick else 3), 16 if quick else 24)


# ---- measuring ------------------------------------------------------------------------------------------
@dataclass
class Measured:
    """Every probe's samples: `fit` one per shape (a median), `spread` every repeat and every decode gap, each with
    the step it timed (its context included): the jitter's."""

    fit: list[Sample]
    spread: list[Sample]
    failed: int = 0
    skipped: list[str] = field(default_factory=list)  # probes that measured nothing, and why


def jitter(samples: list[Sample], cost: CostModel) -> float:
    """The pooled standard deviation of log step time, as a stepped calibration's (calibration.jitter), but around
    the fitted price of each sample's own step: a decode probe's gaps grow with their context a position a step, and
    a mixed probe's repeats meet the decoders at different contexts, trends the fit prices and no spread."""
    by_point: dict[Point, list[float]] = {}
    for s in samples:
        by_point.setdefault(s.point, []).append(math.log(s.seconds / cost.seconds(s.batch)))
    squares = sum(float(np.sum((np.array(v) - np.mean(v)) ** 2)) for v in by_point.values())
    dof = sum(len(v) - 1 for v in by_point.values())
    return math.sqrt(squares / dof) if dof > 0 else 0.0


class _Prompts:
    """Unique prompts of random token ids (no two requests share a prefix a cache could reuse)."""

    def __init__(self, vocab: int, seed: int = 11) -> None:
        self.rng = np.random.default_rng(seed)
        self.low, self.vocab = min(100, vocab // 4), vocab

    def __call__(self, n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in self.rng.integers(self.low, self.vocab, n))


def measure(serve: Callable[..., Any], p: ProbePlan, vocab: int, progress=None) -> Measured:
    """Run the plan's probes through `serve(requests, concurrency, watch=None)` (a stream run; `watch(run, live,
    pending)` True stops it): a warm-up that fixes the slots and their length, the lone prompts, the decode batches,
    then the mixed probe, whose timing is set from the first two."""
    prompt = _Prompts(vocab)
    kinds = 2 + len(p.decodes) + bool(p.chunks)
    finished = 0

    def step(label: str) -> None:
        nonlocal finished
        finished += 1
        if progress:
            progress(finished, kinds, label)

    # The warm-up holds the longest request and as many as the slots, so the server launched for it serves every
    # later probe (a longer request or more slots would relaunch it); its times are not kept.
    warm = [Request(prompt(p.slot_length - 2), 2)] + [Request(prompt(16), 4) for _ in range(p.slots - 1)]
    _ok(serve(warm, p.slots).done, "the warm-up", Measured([], []))
    step("warm-up")
    out = Measured([], [])
    lone = [Request(prompt(n), 1) for _ in range(p.repeats) for n in p.prompts]
    samples = []
    for s in _ok(serve(lone, 1).done, "the lone prompts", out):
        n = len(s.request.prompt)
        samples.append(Sample(Point((0, n), 0, 0), Batch(((0, n, True),)), s.token_times[0] - s.sent))
    out.fit += medians(samples)
    out.spread += samples
    step("lone prompts")
    for c, L in p.decodes:
        done = _ok(serve([Request(prompt(L), p.decode_tokens) for _ in range(c)], c).done, f"{c} decoding at {L}", out)
        seconds, by_request = decode_step(done, L)
        point = Point(None, c, L)
        if seconds is None or len(done) < c:
            # a server at --url with fewer slots queues the rest: there is no step of c decodes to read
            out.skipped.append(f"{c} decoding at {L}: no window where all {c} decoded together (fewer slots?)")
            step(f"{c} decoding at {L}")
            continue
        ctx = round(np.mean([ctx for gaps in by_request for _, ctx in gaps]))
        out.fit.append(Sample(point, Batch((), (ctx,) * c), seconds))
        # one request's gaps (every request's are the same steps), those of merged events left out
        out.spread += [Sample(point, Batch((), (k,) * c), g) for g, k in max(by_request, key=len)
                       if g > MERGED_SHARE * seconds]
        step(f"{c} decoding at {L}")
    if not any(s.point.n_decodes for s in out.fit):
        raise BackendError(f"no decode probe measured a step: {'; '.join(out.skipped)}")
    if p.chunks:
        requests = _mixed_requests(p, out.fit, prompt)
        arrivals = len(requests) - p.beside
        seen: dict[int, Any] = {}

        def watch(run, live, pending) -> bool:
            """Ends the probe once every arriving prompt has its token: the decoders, still running (their count is
            an estimate of the time needed), are kept as they were (a stopped run returns only those done)."""
            for s in live:
                seen[id(s)] = s
            return not pending and sum(s.request.n_gen == 1 for s in run.done) >= arrivals

        run = serve(requests, p.beside + 1, watch)
        for s in run.done:
            seen[id(s)] = s
        done = _ok(list(seen.values()), "the mixed probe", out)
        samples = mixed_steps(done, p.beside, p.beside_prompt)
        out.fit += medians(samples)
        out.spread += samples
        step("prompts beside decodes")
    return out


def _ok(done: list, what: str, out: Measured) -> list:
    """The requests of a probe that came back whole (failures counted); a probe most of whose requests failed ends
    the calibration."""
    good = [s for s in done if s.error is None and s.token_times and s.sent is not None]
    bad = [s for s in done if s not in good]
    out.failed += len(bad)
    if bad and len(bad) * 2 >= len(done):
        raise BackendError(f"{what}: {len(bad)} of {len(done)} requests failed ({bad[0].error or 'no token'})")
    return good


def decode_step(done: list, prompt_len: int) -> tuple[float | None, list[list[tuple[float, int]]]]:
    """One decode step's time from requests that decoded together: within the window where every one has its first
    token and none has finished, each gap between a request's tokens is one step of them all. Returns the step
    (median gap, or the window's mean where events carried several tokens) and each request's (gap, context)s."""
    if not done:
        return None, []
    start = max(s.token_times[0] for s in done)
    end = min(s.token_times[-1] for s in done)
    by_request, means = [], []
    for s in done:
        inside = [(k, t) for k, t in enumerate(s.token_times) if start <= t <= end]
        by_request.append([(b - a, prompt_len + k) for (_, a), (k, b) in zip(inside, inside[1:])])
        if len(inside) >= 2:
            means.append((inside[-1][1] - inside[0][1]) / (len(inside) - 1))
    values = np.array([g for gaps in by_request for g, _ in gaps])
    if not len(values):
        return None, []
    median = float(np.median(values))
    merged = values.min() < MERGED_SHARE * median
    return (float(np.median(means)) if merged else median), by_request


def _mixed_requests(p: ProbePlan, fitted: list[Sample], prompt) -> list[Request]:
    """The decoders (all at 0 s) and the arriving prompts, spaced by what the probes so far measured: the first
    after the decoders' prompts are done, each next after the one before has had its step and a few decodes."""
    lone = sorted((s.point.chunk[1], s.seconds) for s in fitted if s.point.chunk and not s.point.n_decodes)
    slowest: dict[int, float] = {}  # each concurrency's step at its longest context
    for s in fitted:
        if not s.point.chunk:
            slowest[s.point.n_decodes] = max(slowest.get(s.point.n_decodes, 0.0), s.seconds)

    def ttft(n: int) -> float:
        lengths, times = zip(*lone)
        return float(np.interp(n, lengths, times)) * max(1.0, n / lengths[-1])

    d = float(np.interp(p.beside, *zip(*sorted(slowest.items()))))
    t, schedule = ttft(p.beside_prompt) * p.beside * 1.5 + 6 * d, []
    for _ in range(p.repeats):
        for n in p.chunks:
            schedule.append((t, n))
            t += 2 * ttft(n) + 6 * d
    room = p.slot_length - p.beside_prompt - 1
    tokens = min(room, math.ceil(1.2 * t / d) + 4)
    decoders = [Request(prompt(p.beside_prompt), tokens, arrival_s=0.0) for _ in range(p.beside)]
    return decoders + [Request(prompt(n), 1, arrival_s=at) for at, n in schedule]


def mixed_steps(done: list, beside: int, decoder_prompt: int) -> list[Sample]:
    """Each arriving prompt's step: the gap, in every decoder still decoding then, that ends with its token of the
    same step as the prompt's first token. A prompt no decoder's token matched (the engine ran it apart from the
    decodes) gives no sample."""
    decoders = [s for s in done if s.request.n_gen > 1]
    arrivals = [s for s in done if s.request.n_gen == 1]
    if not decoders:
        return []
    step = float(np.median([g for s in decoders for g in np.diff(s.token_times)[len(s.token_times) // 2:]] or [0]))
    out = []
    for a in arrivals:
        first = a.token_times[0]
        gaps, ctxs = [], []
        for s in decoders:
            times = np.array(s.token_times)
            j = int(np.argmin(np.abs(times - first)))
            if j >= 1 and abs(times[j] - first) <= SAME_STEP_SHARE * step:
                gaps.append(times[j] - times[j - 1])
                ctxs.append(decoder_prompt + j)
        if gaps:
            n = len(a.request.prompt)
            # the point names the plan's shape; the batch holds the decoders that ran in that step
            out.append(Sample(Point((0, n), beside, decoder_prompt), Batch(((0, n, True),), tuple(ctxs)),
                              float(np.median(gaps))))
    return out


# ---- the fit ---------------------------------------------------------------------------------------------
def kind_of(point: Point) -> str:
    if point.chunk and point.n_decodes:
        return "prompt beside decodes: the decoders' gap"
    if point.chunk:
        return "lone prompt: TTFT"
    return "decodes: the gap between tokens"


def fit_probes(measured: Measured, model: ModelSpec, nominal: GPUSpec, p: ProbePlan) -> dict[str, Any]:
    """The fit on every shape but the held-out one, and each shape's measured and fitted time."""
    held = p.held_out()

    def is_held(s: Sample) -> bool:
        return s.point == held

    fit_set = [s for s in measured.fit if not is_held(s)]
    check = [s for s in measured.fit if is_held(s)]
    if not fit_set:
        raise BackendError("no probe came back to fit")
    fitted = fit(model, nominal, fit_set)
    cm = CostModel(model, nominal.with_calibration(fitted))
    fitted[JITTER_KEY] = jitter(measured.spread, cm)
    gpu = nominal.with_calibration(fitted)
    rows = []
    for s in measured.fit:
        predicted = cm.seconds(s.batch)
        rows.append({"point": s.point.label, "probe": kind_of(s.point), "held_out": is_held(s),
                     "measured_ms": s.seconds * 1e3, "predicted_ms": predicted * 1e3, "error": predicted / s.seconds - 1})
    held_out_error = float(np.median([abs(r["error"]) for r in rows if r["held_out"]])) if check else None
    return document(model, gpu, nominal, fitted, rows, [r["error"] for r in rows if not r["held_out"]],
                    tail={"held_out_abs_error": held_out_error,
                          "measured": calibration_measured.section(model, nominal, fit_set, fitted, check),
                          "probes": {"plan": p.describe(), "failed_requests": measured.failed, "held_out": held.label,
                                     "skipped": measured.skipped}})

"""The sim's calibration: fit its attainable fractions and per-step overhead to step times measured on a backend.

prefillbench/calibrate.py (the `calibrate` command) loads the real backend and calls these.

A sweep of synthetic steps (prefill chunks of several sizes and offsets, decode
batches at several contexts, mixed chunk + decode steps) runs on any Backend:
state is built the honest way (untimed prefills up to each context, positions
kept consecutive, so llama.cpp accepts them too), then each timed step is
recorded with its shape. The cost model's operators are priced once with unit
fractions; the fit then searches compute fraction, memory fraction, per-step
overhead, decode attention's own fraction and the factor on steps that mix
chunks with decodes for the least squares of log(predicted / measured) step
time. The last two are what a roofline of three parameters could not price on
llama.cpp's CPU backend: decodes at 64 and 320 positions were off by +65% and
-37%, chunks beside decodes by -5..-13% (the quick sweep, pp256 workload).
"""
from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from prefillbench.step import DecodeToken, PrefillChunk, Step

from prefillbench.backends.sim import calibration_measured
from prefillbench.backends.sim.configs import model_from_config
from prefillbench.backends.sim.cost import Batch, CostModel
from prefillbench.backends.sim.fit_errors import error_stats
from prefillbench.backends.sim.specs import GPUSpec, ModelSpec, SimConfigError

FITTED_KEYS = ("compute_fraction", "memory_fraction", "step_overhead_s")
#: Fitted since 2026-12-01; a calibration file without them prices as before (GPUSpec's 1.0).
SHAPE_KEYS = ("decode_attention_fraction", "mixed_step_factor")
#: Also since then: the spread of step times around their price (GPUSpec.step_jitter), from the repeats.
JITTER_KEY = "step_jitter"
#: A mixed step costs at least its operators' sum (nothing measured ran faster mixed) and at most this factor.
MIXED_CEILING = 4.0
#: The fit keeps each attainable fraction within these; one at FRACTION_CEILING means that roof never bound a step.
FRACTION_FLOOR, FRACTION_CEILING = 1e-5, 1e3


# ---- files ----------------------------------------------------------------------------------------
def load_calibration(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise SimConfigError(f"cannot read calibration {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise SimConfigError(f"calibration {path} is not JSON: {e}") from None
    fitted = data.get("fitted") if isinstance(data, dict) else None
    if not isinstance(fitted, dict) or any(k not in fitted for k in FITTED_KEYS):
        raise SimConfigError(f"calibration {path} has no fitted {', '.join(FITTED_KEYS)}")
    return data


def calibration_specs(cal: dict[str, Any]) -> tuple[ModelSpec | None, GPUSpec | None]:
    """The model and device a calibration file was measured on, if it records them."""
    model = ModelSpec(**cal["model"]) if isinstance(cal.get("model"), dict) else None
    gpu = GPUSpec(**cal["gpu"]) if isinstance(cal.get("gpu"), dict) else None
    return model, gpu


def at_speed(cal: dict[str, Any], slowdown: float) -> dict[str, Any]:
    """The calibration of the same machine running every step `slowdown` times as long: each fitted fraction
    divided by it and the per-step overhead multiplied (every term of a single device's step time is one of
    the two, so each step's price scales by exactly `slowdown`; decode attention's share and the mixed-step
    factor are ratios between terms, and the jitter a spread of log time, all of which a uniform slowdown keeps)."""
    fitted = dict(cal["fitted"])
    fitted["compute_fraction"] /= slowdown
    fitted["memory_fraction"] /= slowdown
    fitted["step_overhead_s"] *= slowdown
    return {**cal, "fitted": fitted}


# ---- the sweep ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    """One sweep point: an optional chunk (start, length) and `n_decodes` decodes at context `ctx`."""

    chunk: tuple[int, int] | None
    n_decodes: int
    ctx: int

    @property
    def batch(self) -> Batch:
        """The step this point times, every decode at context `ctx` (a sweep's first repeat)."""
        return Batch(((self.chunk[0], self.chunk[1], True),) if self.chunk else (), (self.ctx,) * self.n_decodes)

    @property
    def label(self) -> str:
        parts = []
        if self.chunk:
            parts.append(f"chunk {self.chunk[1]}@{self.chunk[0]}")
        if self.n_decodes:
            parts.append(f"{self.n_decodes} decodes@{self.ctx}")
        return " + ".join(parts)


def sweep_points(context_length: int, quick: bool = False) -> list[Point]:
    limit = max(64, context_length - 64)
    if quick:  # ~13 points; the untimed state to build stays small (a slow CPU does it in minutes)
        chunks, offsets, decodes, ctxs, mixed = [16, 64, 128, 256], [(256, 64), (256, 256)], [1, 4], [64, 320], [
            (32, 4), (128, 4)]
    else:
        # (512, 512): a chunk whose attention is compute-bound, the one shape that pins prefill attention's compute
        # share (without it any share below the roofline's knee fits every other point, and longer chunks are mispriced)
        chunks, offsets, decodes, ctxs, mixed = [8, 32, 64, 128, 256, 512], [(256, 64), (256, 256), (512, 512), (768, 256)], [
            1, 2, 4, 8], [32, 256, 768], [(32, 2), (128, 2), (256, 2), (32, 8), (128, 8), (256, 8)]
    pts = [Point((0, n), 0, 0) for n in chunks if n <= limit]
    pts += [Point((s, n), 0, 0) for s, n in offsets if s + n <= limit]
    pts += [Point(None, b, c) for b in decodes for c in ctxs if c <= limit]
    pts += [Point((0, n), b, 256) for n, b in mixed if n <= limit and 256 <= limit]
    return pts


@dataclass
class Sample:
    point: Point
    batch: Batch
    seconds: float


class _Runner:
    """Builds the state a point needs on a real backend and times its steps."""

    def __init__(self, backend, vocab: int) -> None:
        self.backend = backend
        self.next_id = 0
        self.vocab = vocab

    def _tokens(self, n: int, salt: int) -> tuple[int, ...]:
        low = min(100, self.vocab // 4)
        return tuple(low + (salt * 7919 + i * 104729) % (self.vocab - low) for i in range(n))

    def _new_seq(self, length: int) -> int:
        """A fresh sequence with `length` positions already in its cache (untimed)."""
        sid = self.next_id
        self.next_id += 1
        if length:
            self.backend.execute(Step(prefills=(PrefillChunk(sid, self._tokens(length, sid), 0, True),)))
        return sid

    def _timed(self, step: Step) -> float:
        t0 = self.backend.now()
        self.backend.execute(step)
        return self.backend.now() - t0

    def run(self, point: Point, repeats: int) -> list[Sample]:
        decoders = [self._new_seq(point.ctx - 1) for _ in range(point.n_decodes)]
        pos = point.ctx - 1
        samples = []
        for r in range(repeats):
            prefills = ()
            chunk_seq = None
            if point.chunk:
                start, n = point.chunk
                chunk_seq = self._new_seq(start)
                prefills = (PrefillChunk(chunk_seq, self._tokens(n, chunk_seq + 1), start, True),)
            decodes = tuple(DecodeToken(sid, 100 + sid % 50, pos) for sid in decoders)
            step = Step(prefills=prefills, decodes=decodes)
            samples.append(Sample(point, Batch.from_step(step), self._timed(step)))
            if chunk_seq is not None:
                self.backend.release(chunk_seq)
            pos += 1
        for sid in decoders:
            self.backend.release(sid)
        return samples


def workload_points(prompt: int, n_gen: int, budgets: list[int], context_length: int) -> list[Point]:
    """The step shapes a serving run of this workload is made of, for a calibration to add to its sweep: the
    whole prompt; each budget's chunk at a chunk boundary halfway into the prompt, beside a few decodes halfway
    through their generation; decode-only batches there. Priced by the quick sweep alone, chunked's steps ran
    1.1-1.3x their price on gguf and sequential's 1.05-1.15x (benchmarks.gguf.priced_steps)."""
    if prompt < 1:
        return []
    limit = max(64, context_length - 64)
    ctx = min(prompt + max(n_gen // 2, 1), limit)
    pts = [Point((0, prompt), 0, 0)] if prompt <= limit else []
    for b in sorted({min(b, prompt) for b in budgets}):
        start = (prompt - b) // 2 // b * b
        if start + b <= limit:
            pts.append(Point((start, b), 4, ctx))
    return pts + [Point(None, n, ctx) for n in (4, 8)]


def measure(backend, points: list[Point], repeats: int = 3, progress=None) -> list[Sample]:
    max_ctx = max([p.ctx + repeats + 1 for p in points] + [(p.chunk[0] + p.chunk[1] + 1) if p.chunk else 0 for p in points])
    max_seqs = max(p.n_decodes for p in points) + 2
    max_tokens = max(max((p.chunk[0] + p.chunk[1]) if p.chunk else 0, p.ctx) + p.n_decodes for p in points)
    backend.prepare(max_seqs, max_ctx, max_tokens)
    runner = _Runner(backend, backend.vocab_size)
    runner.run(points[0], 1)  # warm-up: allocation and kernel selection stay out of the fit
    samples = []
    for i, p in enumerate(points):
        samples += runner.run(p, repeats)
        if progress:
            progress(i + 1, len(points), p)
    return samples


# ---- the fit ---------------------------------------------------------------------------------------
class _Design:
    """Every sample's operators priced once with unit fractions; predictions are then vectorized."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, batches: list[Batch], tp: int = 1, pp: int = 1) -> None:
        unit = replace(gpu, compute_fraction=1.0, memory_fraction=1.0, step_overhead_s=0.0,
                       decode_attention_fraction=1.0, mixed_step_factor=1.0)
        cm = CostModel(model, unit, tp, pp)
        names: dict[str, int] = {"decode_attention": 0}
        fp8: set[str] = set()  # operators priced at the FP8 tensor rate
        rows = []
        for b in batches:
            row: dict[str, tuple[float, float, float]] = {}
            for stage in cm.step_cost(b).stages:
                for op in stage.ops:
                    if op.fp8:
                        fp8.add(op.name)
                    if op.bound in ("compute", "memory"):
                        f, by, _ = row.get(op.name, (0.0, 0.0, 0.0))
                        row[op.name] = (f + op.flops, by + op.bytes, 0.0)
                    else:
                        row.setdefault("_fixed", (0.0, 0.0, 0.0))
                        row["_fixed"] = (0.0, 0.0, row["_fixed"][2] + op.seconds)
            rows.append(row)
            for k in row:
                names.setdefault(k, len(names))
        n, k = len(batches), len(names)
        self.t_compute = np.zeros((n, k))
        self.t_memory = np.zeros((n, k))
        self.fixed = np.zeros(n)
        self.mixed = np.array([bool(b.chunks and b.decodes) for b in batches])
        for i, row in enumerate(rows):
            for name, (f, by, s) in row.items():
                if name == "_fixed":
                    self.fixed[i] += s
                else:
                    self.t_compute[i, names[name]] = f / (gpu.fp8_flops if name in fp8 else gpu.flops)
                    self.t_memory[i, names[name]] = by / gpu.mem_bw

    def predict(self, cf: float, mf: float, overhead: float, attention: float = 1.0, mixed: float = 1.0) -> np.ndarray:
        share = np.ones(self.t_compute.shape[1])
        share[0] = attention  # column 0 is decode attention, whose share of the roofs is fitted on its own
        t = overhead + self.fixed + (np.maximum(self.t_compute / cf, self.t_memory / mf) / share).sum(axis=1)
        return np.where(self.mixed, t * mixed, t)


def _nelder_mead(f, x0: np.ndarray, step: float = 0.5, iters: int = 400) -> np.ndarray:
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = f(xr)
        if fr < values[0]:
            xe = centroid + 2 * (centroid - simplex[-1])
            fe = f(xe)
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(xc)
            if fc < values[-1]:
                simplex[-1], values[-1] = xc, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
        if max(values) - min(values) < 1e-12:
            break
    return simplex[int(np.argmin(values))]


def fit(model: ModelSpec, gpu: GPUSpec, samples: list[Sample], shape_terms: bool = True) -> dict[str, float]:
    """Least squares on log step time over compute fraction, memory fraction, per-step overhead, decode
    attention's share and the mixed-step factor. A sweep without decodes or without mixed steps leaves the
    parameter it cannot see at 1 (the least squares does not move it). `shape_terms=False` holds the last two
    at 1: the three-parameter roofline, for comparison."""
    design = _Design(model, gpu, [s.batch for s in samples])
    measured = np.array([s.seconds for s in samples])
    log_meas = np.log(measured)
    floor = 1e-7
    # Fractions stay within [1e-5, 1e3] of the nominal spec: at the top a roof never binds (e.g. weights
    # that live in a CPU's caches), and the value is reported as the bound rather than drifting to 1e7.
    lo, hi = math.log(FRACTION_FLOOR), math.log(FRACTION_CEILING)

    def params(x: np.ndarray) -> tuple[float, float, float, float, float]:
        cf, mf, af = (math.exp(min(max(v, lo), hi)) for v in x[:3])
        oh = max(math.exp(min(x[3], 0.0)) - floor, 0.0)
        mx = math.exp(min(max(x[4], 0.0), math.log(MIXED_CEILING)))
        return (cf, mf, oh, af, mx) if shape_terms else (cf, mf, oh, 1.0, 1.0)

    def loss(x: np.ndarray) -> float:
        return float(np.sum((np.log(design.predict(*params(x))) - log_meas) ** 2))

    best = None
    for lcf in np.linspace(math.log(1e-4), math.log(2.0), 12):
        for lmf in np.linspace(math.log(1e-3), math.log(2.0), 12):
            for laf in np.linspace(math.log(1e-3), 0.0, 5) if shape_terms else (0.0,):
                for oh in (0.0, 1e-5, 1e-4, 1e-3, 1e-2):
                    x = np.array([lcf, lmf, laf, math.log(oh + floor), 0.0])
                    v = loss(x)
                    if best is None or v < best[0]:
                        best = (v, x)
    x = _nelder_mead(loss, best[1])
    x = _nelder_mead(loss, x)  # a restart, cheap, and it often still improves
    cf, mf, oh, af, mx = params(x)
    if not any(s.batch.decodes for s in samples):
        af = 1.0
    if not design.mixed.any():
        mx = 1.0
    return {"compute_fraction": cf, "memory_fraction": mf, "step_overhead_s": oh,
            "decode_attention_fraction": af, "mixed_step_factor": mx}


def errors(model: ModelSpec, gpu: GPUSpec, samples: list[Sample]) -> list[dict[str, Any]]:
    cm = CostModel(model, gpu)
    out = []
    for s in samples:
        pred = cm.seconds(s.batch)
        out.append({"point": s.point.label, "measured_ms": s.seconds * 1e3, "predicted_ms": pred * 1e3,
                    "error": pred / s.seconds - 1})
    return out


def medians(samples: list[Sample]) -> list[Sample]:
    """One sample per sweep point: the median time of its repeats (a CPU's jitter stays out of the fit)."""
    by_point: dict[Point, list[Sample]] = {}
    for s in samples:
        by_point.setdefault(s.point, []).append(s)
    out = []
    for point, group in by_point.items():
        group = sorted(group, key=lambda s: s.seconds)
        out.append(group[(len(group) - 1) // 2])
    return out


def jitter(samples: list[Sample]) -> float:
    """The pooled standard deviation of log step time among each point's repeats (0 with single repeats): the
    spread of one shape's time from one step to the next, which a P99 TBT near a step's time is the tail of."""
    by_point: dict[Point, list[float]] = {}
    for s in samples:
        by_point.setdefault(s.point, []).append(math.log(s.seconds))
    squares = sum(float(np.sum((np.array(v) - np.mean(v)) ** 2)) for v in by_point.values())
    dof = len(samples) - len(by_point)
    return math.sqrt(squares / dof) if dof > 0 else 0.0


def calibrate(backend, model: ModelSpec, nominal: GPUSpec, *, quick: bool = False, repeats: int = 3,
              progress=None, extra: list[Point] = ()) -> dict[str, Any]:
    """`extra`: points beside the sweep's, such as a workload's own step shapes (workload_points)."""
    points = sweep_points(min(backend.context_length, model.max_context), quick)
    points += [p for p in extra if p not in points]
    measured = measure(backend, points, repeats, progress)
    samples = medians(measured)
    fitted = fit(model, nominal, samples)
    fitted[JITTER_KEY] = jitter(measured)
    gpu = nominal.with_calibration(fitted)
    errs = errors(model, gpu, samples)
    return document(model, gpu, nominal, fitted, errs, [e["error"] for e in errs],
                    head={"backend": backend.label, "backend_model": backend.model_name,
                          "backend_weights": backend.weights},
                    tail={"measured": calibration_measured.section(model, nominal, samples, fitted)})


def document(model: ModelSpec, gpu: GPUSpec, nominal: GPUSpec, fitted: dict, steps: list[dict],
             fit_errors: list[float], *, head: dict | None = None, tail: dict | None = None) -> dict:
    """The calibration file the sim reads, whatever was probed (a stepping backend here, a server in
    bench/server_probes.py): the fit and its errors over the steps it was fitted on (`fit_errors`), with what each
    kind of calibration adds about where it came from before (`head`) and after (`tail`) the common part."""
    return {
        "version": 1,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        **(head or {}),
        "model": asdict(model),
        "gpu": asdict(gpu),
        "nominal_gpu": nominal.name,
        "fitted": fitted,
        **error_stats(fit_errors),
        "steps": steps,
        **(tail or {}),
    }


# ---- model shapes of a real backend -------------------------------------------------------------------
def model_spec_of(backend, dtype_bytes: float | None = None) -> ModelSpec:
    """Shapes of the model a real backend runs: from its transformers config when it has one."""
    config = getattr(getattr(backend, "model", None), "config", None)
    if config is None:
        raise SimConfigError(f"cannot read the model shapes of the {backend.name} backend: pass --sim-model config.json")
    spec = model_from_config(config.to_dict(), backend.model_name)
    dtype = getattr(backend, "dtype", None)
    if dtype_bytes is None and dtype is not None and hasattr(dtype, "itemsize"):
        dtype_bytes = dtype.itemsize
    if dtype_bytes:
        spec = replace(spec, dtype_bytes=dtype_bytes, weight_bytes=dtype_bytes)
    return spec


def describe_fraction(kind: str, value: float, nominal: str) -> str:
    """A fitted fraction in words: the share of the nominal roof the backend attains, or that the roof never binds."""
    if value >= FRACTION_CEILING * 0.999:
        return (f"{kind} fraction at its ceiling ({value:.4g}): no measured step was limited by {kind} on this backend, "
                f"so the calibrated sim never lets {kind} limit a step")
    return f"{kind} fraction {value:.4g}: the backend attains {value:.1%} of {nominal}'s nominal {kind} roof"


def describe_shape_terms(fitted: dict[str, float]) -> list[str]:
    """The calibration's step-shape terms and step jitter in words (a file from before them has none of them)."""
    lines = []
    if "decode_attention_fraction" in fitted:
        af = fitted["decode_attention_fraction"]
        if af >= FRACTION_CEILING * 0.999:
            lines.append(f"decode attention's share at its ceiling ({af:.4g}): it cost next to nothing in every measured step")
        else:
            lines.append(f"decode attention attains {af:.3g}x the other operators' share of the roofs"
                         + (": as the roofline has it" if af == 1.0 else f", so it takes {1 / af:.3g}x the roofline's time"))
    if "mixed_step_factor" in fitted:
        mx = fitted["mixed_step_factor"]
        lines.append(f"mixed-step factor {mx:.3f}: a step carrying prompt chunks and decodes together costs "
                     + ("its operators' sum" if mx == 1.0 else f"{mx - 1:.1%} more than its operators' sum"))
    if fitted.get(JITTER_KEY):
        lines.append(f"step jitter {fitted[JITTER_KEY]:.3f}: one shape's time spreads by that much (log standard deviation) "
                     "from one step to the next; the calibrated sim draws each step's time from that spread")
    return lines

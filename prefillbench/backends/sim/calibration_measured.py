"""The measured pricing's terms fitted on a real device, so that a calibrated and an uncalibrated
`--sim-pricing measured` differ only in numbers.

`--sim-pricing measured` prices a step by curves fitted to public GPU profiles (measured/) and an engine's host
line (measured/overheads.py). `calibrate` fits the same curves to the step times it measures here: the GEMM curve
(floor + smooth max of compute and memory: compute and memory shares, sharpness, floor), the elementwise passes'
(bandwidth share, floor per kernel), attention's shares (prefill of peak FLOP/s, decode of bandwidth) and the host
line per step (base + per sequence, not overlapped: the step backends run host work and kernels in turn). The
profiled curves' extra terms (attention's rise with query rows, the diagonal's dearer FLOPs, the elementwise row and
cache terms, kernel launches and graphs) are left at their neutral values: a sweep of whole steps cannot tell them
apart. The fit is least squares on log step time (scipy), from the spec fit's fractions, every parameter bounded,
over the sweep's medians; the file's `measured.steps` gives each step's error.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from prefillbench.backends.sim.cost import Batch, CostModel
from prefillbench.backends.sim.fit_errors import error_stats
from prefillbench.backends.sim.pricing import MeasuredPricing
from prefillbench.backends.sim.specs import GPUSpec, ModelSpec, SimConfigError

# The curves' modules (pandas, scipy) load when a measured-form calibration is fitted or applied: a spec run of
# the sim imports nothing heavy.

#: Fitted parameters and their bounds (shares of the device's nominal peaks may exceed 1 where a roof never binds,
#: as the spec calibration's fractions may; the floors and host times are seconds).
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_compute_eff": (1e-5, 1e3),
    "gemm_memory_eff": (1e-5, 1e3),
    "gemm_sharpness": (1.0, 30.0),
    "gemm_floor_s": (1e-9, 1e-2),
    "elementwise_memory_eff": (1e-5, 1e3),
    "elementwise_floor_s": (1e-9, 1e-2),
    "prefill_attention_eff": (1e-5, 1e3),
    "decode_attention_eff": (1e-5, 1e3),
    "cpu_base_s": (1e-8, 1.0),
    "cpu_per_seq_s": (1e-9, 0.1),
}
PARAMS = tuple(BOUNDS)
SOURCE = "prefillbench calibrate on {device}: fitted to its measured step times"


def curves(fitted: dict[str, float], device: str) -> tuple:
    """The measured pricing's curves (GEMM, elementwise, attention) with a calibration's numbers."""
    from prefillbench.backends.sim.measured.attention import AttentionCurve
    from prefillbench.backends.sim.measured.linear import ElementwiseCurve, GemmCurve

    src = SOURCE.format(device=device)
    gemm = GemmCurve("calibrated", fitted["gemm_compute_eff"], fitted["gemm_memory_eff"], fitted["gemm_sharpness"],
                     fitted["gemm_floor_s"], src)
    elementwise = ElementwiseCurve("calibrated", fitted["elementwise_memory_eff"], fitted["elementwise_floor_s"], src)
    attention = AttentionCurve("calibrated", fitted["prefill_attention_eff"], fitted["decode_attention_eff"], 0.0, 0.0,
                               src)
    return gemm, elementwise, attention


def engine(fitted: dict[str, float], device: str):
    """The host line the calibration measured (an EngineOverheads): the backend's own per-step work, in turn with
    its kernels."""
    from prefillbench.backends.sim.measured.overheads import EngineOverheads

    return EngineOverheads("calibrated", fitted["cpu_base_s"], fitted["cpu_per_seq_s"], 0.0, 0.0, 0.0, 0, 0, 0,
                           SOURCE.format(device=device), version=f"the host line calibrated on {device}")


def pricing(fitted: dict[str, float], gpu: GPUSpec) -> MeasuredPricing:
    return MeasuredPricing.calibrated(gpu, curves(fitted, gpu.name))


def cost_model(model: ModelSpec, gpu: GPUSpec, fitted: dict[str, float]) -> CostModel:
    """The cost model of one device priced by a measured-form fit (its curves and host line)."""
    return CostModel(model, gpu, 1, 1, 1, pricing(fitted, gpu), engine(fitted, gpu.name))


def price(model: ModelSpec, gpu: GPUSpec, fitted: dict[str, float], batches: list[Batch]) -> np.ndarray:
    cm = cost_model(model, gpu, fitted)
    return np.array([cm.seconds(b) for b in batches])


def start(spec_fit: dict[str, float]) -> dict[str, float]:
    """Where the fit starts: the spec calibration's fractions for every share, a roofline-like sharpness."""
    cf, mf = spec_fit["compute_fraction"], spec_fit["memory_fraction"]
    x = {"gemm_compute_eff": cf, "gemm_memory_eff": mf, "gemm_sharpness": 4.0, "gemm_floor_s": 1e-6,
         "elementwise_memory_eff": mf, "elementwise_floor_s": 1e-6, "prefill_attention_eff": cf,
         "decode_attention_eff": mf * spec_fit.get("decode_attention_fraction", 1.0),
         "cpu_base_s": max(spec_fit["step_overhead_s"], 1e-6), "cpu_per_seq_s": 1e-6}
    return {k: min(max(v, BOUNDS[k][0]), BOUNDS[k][1]) for k, v in x.items()}


def fit(model: ModelSpec, gpu: GPUSpec, batches: list[Batch], seconds: list[float],
        first: dict[str, float]) -> dict[str, float]:
    """Least squares on log step time over PARAMS (in log space, bounded), from `first` (start())."""
    from scipy.optimize import least_squares

    if len(batches) < len(PARAMS):
        raise SimConfigError(f"a measured-form calibration needs at least {len(PARAMS)} step shapes, got {len(batches)}")
    log_meas = np.log(np.asarray(seconds, dtype=float))
    lo = np.log([BOUNDS[k][0] for k in PARAMS])
    hi = np.log([BOUNDS[k][1] for k in PARAMS])

    def params(x: np.ndarray) -> dict[str, float]:
        return {k: math.exp(v) for k, v in zip(PARAMS, np.clip(x, lo, hi))}

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log(price(model, gpu, params(x), batches)) - log_meas

    x0 = np.clip(np.log([first[k] for k in PARAMS]), lo + 1e-9, hi - 1e-9)
    out = least_squares(residual, x0, bounds=(lo, hi), x_scale=1.0, diff_step=1e-3, max_nfev=400)
    return params(out.x)


def errors(model: ModelSpec, gpu: GPUSpec, fitted: dict[str, float], labels: list[str], batches: list[Batch],
           seconds: list[float]) -> list[dict[str, Any]]:
    predicted = price(model, gpu, fitted, batches)
    return [{"point": label, "measured_ms": s * 1e3, "predicted_ms": p * 1e3, "error": p / s - 1}
            for label, s, p in zip(labels, seconds, predicted)]


def section(model: ModelSpec, nominal: GPUSpec, samples, spec_fit: dict[str, float], held=()) -> dict[str, Any]:
    """The calibration file's `measured` part: the fitted curves and host line, each step's error, and the error on
    `held` (samples kept out of the fit, a server's held-out probe). Too few shapes to fit: the reason instead."""
    batches, seconds = [s.batch for s in samples], [s.seconds for s in samples]
    try:
        fitted = fit(model, nominal, batches, seconds, start(spec_fit))
    except SimConfigError as e:
        return {"not_fitted": str(e)}
    steps = errors(model, nominal, fitted, [s.point.label for s in samples], batches, seconds)
    out = {"fitted": fitted, **error_stats([e["error"] for e in steps]), "steps": steps}
    if held:
        check = errors(model, nominal, fitted, [s.point.label for s in held], [s.batch for s in held],
                       [s.seconds for s in held])
        out["held_out_abs_error"] = error_stats([e["error"] for e in check])["median_abs_error"]
    return out


def applied(cal: dict[str, Any] | None, path: str | None, gpu: GPUSpec,
            pricing_name: str) -> tuple[GPUSpec, dict[str, float] | None]:
    """A calibration on the nominal device: under spec pricing its fitted fractions on the GPU; under measured the
    GPU as nominal (its step jitter only) and the measured-form fit, which prices the curves and the host line."""
    if not cal:
        return gpu, None
    fitted = cal.get("fitted", cal)
    if pricing_name != "measured":
        return gpu.with_calibration(fitted), None
    # A file's device may carry the spec fit (its "gpu"): the spec pricing's own step terms are the curves' and the
    # host line's business here, so they go back to the roofline's neutral values.
    gpu = replace(gpu, step_overhead_s=0.0, mixed_step_factor=1.0, decode_attention_fraction=1.0,
                  step_jitter=float(fitted.get("step_jitter", 0.0)))
    return gpu, loaded(cal, path)


def loaded(cal: dict[str, Any], path: str | None) -> dict[str, float]:
    """A calibration file's measured-form fit, or a one-line refusal naming why there is none."""
    part = cal.get("measured")
    fitted = part.get("fitted") if isinstance(part, dict) else None
    if isinstance(part, dict) and part.get("not_fitted"):
        raise SimConfigError(f"--calibration {path or ''} with --sim-pricing measured: the measured pricing's terms "
                             f"were not fitted ({part['not_fitted']}); calibrate without --quick")
    if not isinstance(fitted, dict) or any(not isinstance(fitted.get(k), (int, float)) for k in PARAMS):
        raise SimConfigError(f"--calibration {path or ''} with --sim-pricing measured: the file holds no fit of the "
                             "measured pricing's terms (a file from before them); run calibrate again")
    out = {k: float(fitted[k]) for k in PARAMS}
    # the fit works in log space: exp(log(bound)) may land a rounding off the bound
    bad = [k for k, v in out.items() if not BOUNDS[k][0] * (1 - 1e-9) <= v <= BOUNDS[k][1] * (1 + 1e-9)]
    if bad:
        raise SimConfigError(f"--calibration {path or ''}: measured-form {bad[0]} = {out[bad[0]]:g} is outside "
                             f"[{BOUNDS[bad[0]][0]:g}, {BOUNDS[bad[0]][1]:g}], where the fit keeps it")
    return out


__all__ = ["BOUNDS", "PARAMS", "applied", "cost_model", "curves", "engine", "errors", "fit", "loaded", "price", "pricing", "section", "start"]

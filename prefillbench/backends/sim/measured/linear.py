"""Linear-layer (GEMM) and elementwise operator times per profiled GPU, fitted to Vidur's measured medians.

A GEMM of F FLOPs moving B bytes takes floor + smoothmax_k(F / (compute_eff·peak), B / (memory_eff·bandwidth)),
smoothmax_k(a, b) = (a^k + b^k)^(1/k): k -> infinity is the roofline's max(), k = 1 the sum. Near the ridge
neither roof is reached (the issue: 61-72% of peak at 64-512 tokens against 73-80% at either end), which is what a
finite k says. The floor is a kernel's fixed device time (a tiny GEMM's ramp-up and tail), launch not included:
Vidur's times are CUDA-kernel time (torch.profiler / CUDA events).
An elementwise operator (norm, rotary, activation, residual add) is bandwidth-bound: floor + B / (eff·bandwidth).

Fit and test are apart: every constant here is fitted on profiles.FIT_MODELS only (Llama-2-7B and Llama-2-70B,
TP 1-8, 1-4,096 tokens), by least squares on log time (scipy.optimize.least_squares); the held-out models
(profiles.TEST_MODELS) only test them (benchmarks/sim/operators.py prints the table, tests/test_sim_pricing.py
asserts it). Peaks are the sim's presets' spec figures (H100-SXM and A100-SXM, copied here because measured/ may
not import presets; the test checks they are the same), and the A40's from its datasheet.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Sequence

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from prefillbench.backends.sim.measured import profiles, store
from prefillbench.backends.sim.measured.profiles import OpRow


@dataclass(frozen=True)
class Peaks:
    """A profiled GPU's spec figures: dense bf16/fp16 tensor FLOP/s, DRAM bandwidth, L2 size."""

    preset: str  # the sim's GPU_PRESETS name, where it has one
    flops: float
    mem_bw: float
    source: str
    l2_bytes: float = 0.0  # for the elementwise cache term; NVIDIA's "MB" of L2 are KiB x 1024


PEAKS: dict[str, Peaks] = {
    # Vidur's h100 and a100 profiles ran on DGX nodes (its README's "H100 DGX", "A100 DGX"): the SXM parts.
    "h100": Peaks("H100-SXM", 989e12, 3.35e12, "presets.GPU_PRESETS['H100-SXM']: NVIDIA H100 SXM datasheet, 989 "
                  "TFLOPS BF16 dense, 3.35 TB/s HBM3; 50 MB L2 (NVIDIA H100 Tensor Core GPU Architecture whitepaper, SXM5)",
                  l2_bytes=50 * 2**20),
    "a100": Peaks("A100-SXM", 312e12, 2039e9, "presets.GPU_PRESETS['A100-SXM']: NVIDIA A100 80GB SXM datasheet, 312 "
                  "TFLOPS BF16 dense, 2,039 GB/s HBM2e; 40 MB L2 (NVIDIA A100 Tensor Core GPU Architecture whitepaper)",
                  l2_bytes=40 * 2**20),
    # Not a preset: NVIDIA A40 datasheet (https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-
    # datasheet.pdf): 149.7 TFLOPS BF16/FP16 tensor dense (299.4 with sparsity; full rate with FP32 accumulate on
    # this part, unlike GeForce GA102), 48 GB GDDR6 at 696 GB/s (384-bit, 14.5 Gb/s: 695.8 GB/s).
    "a40": Peaks("A40", 149.7e12, 696e9, "NVIDIA A40 datasheet: 149.7 TFLOPS BF16 tensor dense, 696 GB/s GDDR6; "
                 "6 MB L2 (NVIDIA Ampere GA102 GPU Architecture whitepaper: 6,144 KB)", l2_bytes=6 * 2**20),
}


def smooth_max(a, b, k):
    """(a^k + b^k)^(1/k), computed as m·((a/m)^k + (b/m)^k)^(1/k) with m = max(a, b) so large k cannot overflow."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    m = np.maximum(a, b)
    safe = np.where(m > 0, m, 1.0)
    out = m * ((a / safe) ** k + (b / safe) ** k) ** (1.0 / k)
    return out if out.ndim else float(out)


@dataclass(frozen=True)
class GemmCurve:
    """One GPU's fitted linear-layer time."""

    gpu: str  # profile it was fitted on: "h100" | "a100" | "a40"
    compute_eff: float  # attained share of peak bf16 FLOP/s at large N
    memory_eff: float  # attained share of DRAM bandwidth at N=1
    sharpness: float  # k of the smooth max ((tc^k + tm^k)^(1/k)); big k -> max(), k=1 -> sum
    floor_s: float  # a kernel's fixed cost (launch-free device time of a tiny GEMM)
    source: str

    def seconds(self, flops, nbytes, peak_flops: float, mem_bw: float):
        t_c = np.asarray(flops, dtype=float) / (self.compute_eff * peak_flops)
        t_m = np.asarray(nbytes, dtype=float) / (self.memory_eff * mem_bw)
        return self.floor_s + smooth_max(t_c, t_m, self.sharpness)


@dataclass(frozen=True)
class ElementwiseCurve:
    """Norms, rotary, activation, residual add: bandwidth-bound, floor + bytes / (memory_eff·bandwidth), with two
    terms where the profiles show them (fit_elementwise says when each is fitted):
    - a row term, max(that, row_bytes / row_rate): vLLM's RMSNorm, rotary and SiLU-and-mul kernels run one thread
      block per token, so a few tokens cost one block's serial pass over its row (Vidur at 1 token: SiLU-and-mul
      6.5 us for Llama-2-7B's 66 KB row, 15 us for Llama-2-70B's 172 KB, about proportional; rotary 4 us for 64
      heads, 9 us for Qwen-72B's 128);
    - a cache term: bytes that fit in L2 stream faster than DRAM (Vidur's residual add moves 1.1-1.3x the A100's
      and H100's DRAM peak at 12-25 MB, under their 40 and 50 MB L2), the share of the peak going from cache_eff
      to memory_eff as the footprint passes cache_bytes.
    `classes` holds one curve per operator class (norm, rope, act, add); seconds(op_class=...) picks one, and
    without a class the curve's own figures (all classes pooled, no extra terms) price it."""

    gpu: str
    memory_eff: float
    floor_s: float
    source: str
    op_class: str = "all"
    row_rate: float = math.inf  # bytes/s of one token's row through its block; inf: no row term
    cache_eff: float = 0.0  # share of DRAM peak attained by a footprint well inside L2; 0: no cache term
    cache_bytes: float = 0.0  # the GPU's L2 size (spec)
    cache_sharpness: float = 1.0  # how sharply the share falls past cache_bytes
    classes: tuple["ElementwiseCurve", ...] = ()

    def for_class(self, op_class: str) -> "ElementwiseCurve":
        for c in self.classes:
            if c.op_class == op_class:
                return c
        raise KeyError(f"no {op_class!r} elementwise curve for {self.gpu}: fitted are "
                       f"{', '.join(c.op_class for c in self.classes) or 'none'}")

    def seconds(self, nbytes, mem_bw: float, op_class: str | None = None, row_bytes=None):
        """Time of an elementwise pass over nbytes; op_class picks the class's curve, whose row term needs
        row_bytes (profiles.row_bytes: one token's bytes)."""
        if op_class is not None:
            return self.for_class(op_class).seconds(nbytes, mem_bw, row_bytes=row_bytes)
        b = np.asarray(nbytes, dtype=float)
        eff = self.memory_eff
        if self.cache_eff:
            eff = eff + (self.cache_eff - eff) / (1.0 + (b / self.cache_bytes) ** self.cache_sharpness)
        t = b / (eff * mem_bw)
        if math.isfinite(self.row_rate):
            if row_bytes is None:
                raise ValueError(f"the {self.op_class} curve has a row term: give row_bytes")
            t = np.maximum(t, np.asarray(row_bytes, dtype=float) / self.row_rate)
        out = self.floor_s + t
        return out if np.ndim(out) else float(out)


def _arrays(rows: Sequence[OpRow], gemm: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pick = [r for r in rows if r.is_gemm == gemm]
    if not pick:
        raise ValueError(f"no {'GEMM' if gemm else 'elementwise'} rows to fit")
    return (np.array([r.flops for r in pick]), np.array([r.nbytes for r in pick]),
            np.array([r.median_s for r in pick]))


def _gpu_of(rows: Sequence[OpRow]) -> str:
    gpus = {r.gpu for r in rows}
    if len(gpus) != 1:
        raise ValueError(f"rows of one GPU are fitted at a time, got {sorted(gpus)}")
    return gpus.pop()


def _source(rows: Sequence[OpRow], what: str) -> str:
    models = sorted({r.model for r in rows})
    tps = sorted({r.tp for r in rows})
    ns = sorted({r.n_tokens for r in rows})
    return (f"{what} fitted (least squares on log time) to {profiles.VIDUR_REPO}@{profiles.VIDUR_COMMIT[:7]} "
            f"{profiles.VIDUR_COMPUTE}/{_gpu_of(rows)} mlp.csv medians of {', '.join(models)}, TP {tps[0]}-{tps[-1]}, "
            f"{ns[0]}-{ns[-1]} tokens")


def fit_gemm(rows: Sequence[OpRow], gpu_peak_flops: float, gpu_mem_bw: float) -> GemmCurve:
    """The GemmCurve through rows' GEMM operators (one GPU's), least squares on log time."""
    flops, nbytes, t = _arrays(rows, True)
    gpu = _gpu_of(rows)

    def curve(x) -> GemmCurve:
        return GemmCurve(gpu, x[0], x[1], x[2], x[3] * 1e-6, "")

    def residual(x):
        return np.log(curve(x).seconds(flops, nbytes, gpu_peak_flops, gpu_mem_bw) / t)

    # Bounds: shares of a peak in (0, 1]; k from the sum (1) to all but max() (64); floor under 50 us (in us, so
    # the four unknowns have like scales for the solver).
    fit = least_squares(residual, x0=[0.7, 0.7, 3.0, 3.0], bounds=([0.05, 0.05, 1.0, 0.0], [1.0, 1.0, 64.0, 50.0]))
    c = curve(fit.x)
    return GemmCurve(gpu, float(c.compute_eff), float(c.memory_eff), float(c.sharpness), float(c.floor_s),
                     _source(rows, "GEMM curve"))


def _fit_class(gpu: str, op_class: str, nbytes, rows_b, t, gpu_mem_bw: float, l2_bytes: float,
               row: bool, cache: bool) -> ElementwiseCurve:
    """One class's curve: memory_eff and floor always, the row and cache terms where asked."""

    def curve(x) -> ElementwiseCurve:
        return ElementwiseCurve(gpu, x[0], x[1] * 1e-6, "", op_class,
                                row_rate=x[2] * 1e9 if row else math.inf,
                                cache_eff=x[3] if cache else 0.0, cache_bytes=l2_bytes if cache else 0.0,
                                cache_sharpness=x[4] if cache else 1.0)

    def residual(x):
        return np.log(curve(x).seconds(nbytes, gpu_mem_bw, row_bytes=rows_b) / t)

    # memory_eff (0, 1]; floor under 50 us; row rate 0.1 GB/s to 100 TB/s (in GB/s); L2 share up to 3x the
    # DRAM peak, its cliff's sharpness 0.5-8. Unused unknowns stay at their start and change nothing.
    fit = least_squares(residual, x0=[0.6, 2.0, 10.0, 1.0, 2.0],
                        bounds=([0.02, 0.0, 0.1, 0.02, 0.5], [1.0, 50.0, 1e5, 3.0, 8.0]))
    return curve([float(v) for v in fit.x])


#: Classes whose kernels run one thread block per token (vLLM's RMSNorm, rotary, SiLU-and-mul): they get the row
#: term. The residual add is torch's vectorized elementwise add: its 1-2 us at any small token count shows none.
ROW_CLASSES = ("norm", "rope", "act")


def fit_elementwise(rows: Sequence[OpRow], gpu_mem_bw: float, l2_bytes: float = 0.0) -> ElementwiseCurve:
    """The ElementwiseCurve through rows' elementwise operators, least squares on log time: a pooled curve (one
    memory_eff and floor) and one per class present. A class gets the cache term only where some fit row moved
    its bytes faster than DRAM can (attained > 1.0 of mem_bw: only L2 explains it) and l2_bytes is known."""
    pick = [r for r in rows if not r.is_gemm]
    if not pick:
        raise ValueError("no elementwise rows to fit")
    gpu = _gpu_of(pick)
    nbytes, rows_b, t = (np.array([r.nbytes for r in pick]), np.array([r.row_bytes for r in pick]),
                         np.array([r.median_s for r in pick]))
    classes = np.array([r.op_class for r in pick])
    source = _source(pick, "elementwise curve")
    per_class = []
    for cls in dict.fromkeys(profiles.ELEMENTWISE_OPS.values()):
        m = classes == cls
        if not m.any():
            continue
        cache = bool(l2_bytes) and float(np.max(nbytes[m] / t[m])) > gpu_mem_bw
        c = _fit_class(gpu, cls, nbytes[m], rows_b[m], t[m], gpu_mem_bw, l2_bytes, cls in ROW_CLASSES, cache)
        per_class.append(replace(c, source=f"{source}; {cls} rows only"))
    pooled = _fit_class(gpu, "all", nbytes, rows_b, t, gpu_mem_bw, l2_bytes, False, False)
    return replace(pooled, source=source, classes=tuple(per_class))


@lru_cache(maxsize=None)
def fitted_curves(gpu: str) -> tuple[GemmCurve, ElementwiseCurve]:
    """gpu's curves, fitted on the shipped sample's FIT_MODELS rows (cached)."""
    peaks = PEAKS[gpu]
    rows = [r for r in profiles.load_rows(gpu) if r.fit]
    return fit_gemm(rows, peaks.flops, peaks.mem_bw), fit_elementwise(rows, peaks.mem_bw, peaks.l2_bytes)


@lru_cache(maxsize=None)
def shipped_curves(gpu: str) -> tuple[GemmCurve, ElementwiseCurve]:
    """gpu's curves as fitted_curves fitted them when data/fitted_curves.json was written (store.py: why shipped)."""
    d = store.section("linear")[gpu]
    return GemmCurve(**d["gemm"]), elementwise_from_record(d["elementwise"])


def elementwise_from_record(d: dict) -> ElementwiseCurve:
    return ElementwiseCurve(**{**d, "classes": tuple(ElementwiseCurve(**c) for c in d["classes"])})


def predict(df: pd.DataFrame, gemm: GemmCurve, elementwise: ElementwiseCurve, peaks: Peaks) -> np.ndarray:
    """Each row of a profiles.long_frame priced by the curves (seconds), elementwise rows by their class's curve."""
    out = np.asarray(gemm.seconds(df["flops"].to_numpy(), df["nbytes"].to_numpy(), peaks.flops, peaks.mem_bw),
                     dtype=float).copy()
    cls = df["op_class"].to_numpy()
    for c in elementwise.classes:
        m = cls == c.op_class
        if m.any():
            out[m] = c.seconds(df["nbytes"].to_numpy()[m], peaks.mem_bw, row_bytes=df["row_bytes"].to_numpy()[m])
    return out


def flat_roofline(df: pd.DataFrame, peaks: Peaks, compute_fraction: float = 0.8,
                  memory_fraction: float = 0.85) -> np.ndarray:
    """The sim's spec-sheet price before these curves: max(FLOPs / (0.8·peak), bytes / (0.85·bandwidth))."""
    return np.maximum(df["flops"].to_numpy() / (compute_fraction * peaks.flops),
                      df["nbytes"].to_numpy() / (memory_fraction * peaks.mem_bw))


def errors(gpu: str, df: pd.DataFrame | None = None) -> pd.DataFrame:
    """gpu's measured rows (the shipped sample unless df is given) with `pred_s`, `err` (pred / measured - 1) for the
    fitted curves and `flat_s`, `flat_err` for the flat roofline."""
    df = profiles.load_frame(gpu) if df is None else df.copy()
    gemm, elementwise = fitted_curves(gpu)
    peaks = PEAKS[gpu]
    df["pred_s"] = predict(df, gemm, elementwise, peaks)
    df["err"] = df["pred_s"] / df["median_s"] - 1.0
    df["flat_s"] = flat_roofline(df, peaks)
    df["flat_err"] = df["flat_s"] / df["median_s"] - 1.0
    return df


__all__ = ["ElementwiseCurve", "GemmCurve", "PEAKS", "Peaks", "errors", "fit_elementwise", "fit_gemm",
           "fitted_curves", "flat_roofline", "predict", "shipped_curves", "smooth_max"]

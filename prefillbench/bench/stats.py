"""Statistics a row can be trusted by: coefficient of variation and Student-t confidence intervals.

The t quantiles come from scipy.stats; the tests check them against the printed t table.

What the samples are: one value per timed repetition (the run's mean t/s, or
its throughput). Requests inside one run share batches and so are not
independent draws; repetitions are. With one repetition there is no spread to
measure, and CV and CI are NaN.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.stats

DEFAULT_CONFIDENCE = 0.95
DEFAULT_NOISY_CV = 0.10  # a row whose CV exceeds this is marked noisy


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1), two-pass so large means lose no precision."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = math.fsum(values) / n
    if n == 1:
        return mean, 0.0
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    return float(scipy.stats.t.cdf(t, df))


def t_quantile(p: float, df: float) -> float:
    """The t value below which a fraction p of Student's t(df) lies."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie strictly between 0 and 1, got {p}")
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    return float(scipy.stats.t.ppf(p, df))


def t_critical(n: int, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """Two-sided critical t for a mean of n samples; NaN below two samples."""
    if n < 2:
        return math.nan
    return t_quantile(0.5 + confidence / 2.0, n - 1)


def ci_half_width(values: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> float:
    """Half-width of the Student-t confidence interval of the mean: mean ± this."""
    n = len(values)
    if n < 2:
        return math.nan
    _, std = mean_std(values)
    return t_critical(n, confidence) * std / math.sqrt(n)


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation: sample std over mean; NaN below two samples or at mean 0."""
    if len(values) < 2:
        return math.nan
    mean, std = mean_std(values)
    return std / abs(mean) if mean else math.nan


def is_noisy(row_cvs: Sequence[float], threshold: float = DEFAULT_NOISY_CV) -> bool:
    """Noisy when any known CV of the row exceeds the threshold; NaN (one repetition) is not noisy."""
    return any(c > threshold for c in row_cvs if c is not None and not math.isnan(c))


def percentile(values: list[float] | np.ndarray, q: float, method: str = "linear") -> float:
    """The q-th percentile (numpy's linear interpolation by default) of the values that are not NaN; NaN if none is.
    `method="inverted_cdf"`: the smallest value with at least q% at or below it, the sample whose bucket a
    Prometheus histogram_quantile interpolates in (rank q x count), so the figure an engine histogram's p50 estimates.
    The two differ by half the gap between the middle samples: with four requests, by a quarter of their spread."""
    known = np.asarray(values, dtype=float)
    known = known[~np.isnan(known)]
    return float(np.percentile(known, q, method=method)) if known.size else math.nan

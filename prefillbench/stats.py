"""Statistics a row can be trusted by: coefficient of variation and Student-t confidence intervals.

No scipy: the t quantile comes from the regularized incomplete beta function
(Lentz's continued fraction), inverted by bisection. It is exact to ~1e-10,
which the tests check against the printed t table.

What the samples are: one value per timed repetition (the run's mean t/s, or
its throughput). Requests inside one run share batches and so are not
independent draws; repetitions are. With one repetition there is no spread to
measure, and CV and CI are NaN.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

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


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t value below which a fraction p of Student's t(df) lies."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie strictly between 0 and 1, got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


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

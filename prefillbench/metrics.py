"""From timestamps to the figures in a row: t/s, throughput, TTFT and TBT."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from . import stats
from .engine import RequestRecord, RunRecord
from .stats import mean_std
from .workloads import TestSpec


@dataclass
class ResultRow:
    """One line of a report; field names are the export's column names."""

    model: str
    backend: str
    strategy: str
    test: str
    n_prompt: int
    n_gen: int
    concurrency: int
    chunk_size: int | None
    requests: int
    repetitions: int
    ts_mean: float
    ts_std: float
    ms_per_token: float
    throughput: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tbt_p50_ms: float
    tbt_p99_ms: float
    # Spread across repetitions (one value per timed run); NaN with one repetition.
    ts_cv: float = math.nan  # CV of the runs' mean t/s
    ts_ci95: float = math.nan  # 95% CI half-width of ts_mean: ts_mean ± ts_ci95
    throughput_cv: float = math.nan
    throughput_ci95: float = math.nan

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def cv(self) -> float:
        """The row's worst CV (t/s or throughput); NaN when unknown."""
        known = [c for c in (self.ts_cv, self.throughput_cv) if c is not None and not math.isnan(c)]
        return max(known) if known else math.nan

    def noisy(self, threshold: float = stats.DEFAULT_NOISY_CV) -> bool:
        return stats.is_noisy([self.ts_cv, self.throughput_cv], threshold)


def request_rate(test: TestSpec, req: RequestRecord) -> float:
    """Tokens per second of one request, by the kind of test.

    pp: prompt tokens over arrival-to-first-token; tg: decode steps over
    first-to-last token; pp+tg: all its tokens over its end-to-end time.
    """
    times = req.token_times
    if test.kind == "pp":
        return test.n_prompt / (times[0] - req.arrival)
    if test.kind == "tg":
        return test.n_gen / (times[-1] - times[0])
    return test.tokens_per_request / (times[-1] - req.arrival)


def ttfts_ms(run: RunRecord) -> list[float]:
    return [1000 * (r.token_times[0] - r.arrival) for r in run.requests]


def tbts_ms(run: RunRecord) -> list[float]:
    return [1000 * float(d) for r in run.requests for d in np.diff(r.token_times)]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def summarize(
    test: TestSpec,
    runs: list[RunRecord],
    *,
    model: str,
    backend: str,
    strategy: str,
    concurrency: int,
    chunk_size: int | None,
) -> ResultRow:
    rates = [request_rate(test, r) for run in runs for r in run.requests]
    ts_mean, ts_std = mean_std(rates)
    run_rates = [mean_std([request_rate(test, r) for r in run.requests])[0] for run in runs]
    throughputs = [len(run.requests) * test.tokens_per_request / run.wall for run in runs]
    ttft = [v for run in runs for v in ttfts_ms(run)]
    tbt = [v for run in runs for v in tbts_ms(run)]
    return ResultRow(
        model=model,
        backend=backend,
        strategy=strategy,
        test=test.name,
        n_prompt=test.n_prompt,
        n_gen=test.n_gen,
        concurrency=concurrency,
        chunk_size=chunk_size,
        requests=len(runs[0].requests),
        repetitions=len(runs),
        ts_mean=ts_mean,
        ts_std=ts_std,
        ms_per_token=1000.0 / ts_mean,
        throughput=mean_std(throughputs)[0],
        ttft_p50_ms=percentile(ttft, 50),
        ttft_p99_ms=percentile(ttft, 99),
        tbt_p50_ms=percentile(tbt, 50),
        tbt_p99_ms=percentile(tbt, 99),
        ts_cv=stats.cv(run_rates),
        ts_ci95=stats.ci_half_width(run_rates),
        throughput_cv=stats.cv(throughputs),
        throughput_ci95=stats.ci_half_width(throughputs),
    )

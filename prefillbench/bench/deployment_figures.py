"""A disaggregated deployment's own figures in its rows (metrics.ResultRow): the KV's transfer per request and how
busy each pool's instances were, read on the run's record (deploy/ tags every step and request with its instance)."""
from __future__ import annotations

import math

import numpy as np

from prefillbench.bench.stalls import Timeline
from prefillbench.bench.stats import mean_std
from prefillbench.engine import RunRecord


def deployment_columns(runs: list[RunRecord]) -> dict:
    """The KV transfer per request (its prefill instance's first token to its KV's arrival at the decode instance)
    at p50 and p99, and each pool's mean busy share; {} for a colocated run."""
    handed = [r for run in runs for r in run.requests if r.kv_arrival is not None]
    if not handed:
        return {}
    transfer = [1e3 * (r.kv_arrival - r.token_times[0]) for r in handed]
    decode = [sorted({r.instance for r in run.requests if r.kv_arrival is not None}) for run in runs]
    prefill = [sorted({s.instance for s in run.steps} - set(d)) for run, d in zip(runs, decode)]
    return {"kv_transfer_p50_ms": float(np.percentile(transfer, 50)),
            "kv_transfer_p99_ms": float(np.percentile(transfer, 99)),
            "prefill_busy": _mean([pool_busy(run, p) for run, p in zip(runs, prefill)]),
            "decode_busy": _mean([pool_busy(run, d) for run, d in zip(runs, decode)])}


def _mean(values: list[float]) -> float:
    known = [v for v in values if not math.isnan(v)]
    return mean_std(known)[0] if known else math.nan


def pool_busy(run: RunRecord, instances: list[int]) -> float:
    """The mean share of the run's wall time the given instances spent in steps (overlaps counted once)."""
    if not run.wall > 0 or not instances:
        return math.nan
    shares = []
    for k in instances:
        steps = [s for s in run.steps if s.instance == k]
        starts = np.array([s.start for s in steps], dtype=float)
        ends = np.array([s.end for s in steps], dtype=float)
        busy = Timeline(starts, ends, np.zeros(len(steps), dtype=bool)).busy_s if steps else 0.0
        shares.append(busy / run.wall)
    return sum(shares) / len(shares)

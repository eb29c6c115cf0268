"""A served row's client figures: the client's CPU over the run, its worker processes, and whether it sent late,
so that a row measured the client rather than the engine says so (`client_late`, the verdict's line, `--strict`).

The bound: a request the client sends δ late distorts the TTFT it measures by δ, whichever origin it is measured
from. From the scheduled time (the default, MLPerf loadgen's rule) the TTFT grows by δ, the client's delay counted
as the engine's; from the send, the engine is fed later than the schedule asked, its queue thinner than the load
meant. A send lag p99 of LATE_SHARE of the row's TTFT p50 therefore moves the TTFT of the 1% latest requests by
that share of a typical TTFT: 10%, the spread at which the project marks a row noisy (stats.DEFAULT_NOISY_CV).
Below LATE_FLOOR_MS no client paces sends finer (an event loop's timers round sleeps to about 1 ms, AIPerf's docs),
so a lag under it is never marked, even beside a TTFT of a few ms.
"""
from __future__ import annotations

import math

from prefillbench.bench.stats import percentile
from prefillbench.engine import RunRecord

#: The send lag p99, as a share of the row's TTFT p50, past which the row measured the client.
LATE_SHARE = 0.10
#: A send lag p99 under this many ms is never late (the event loop's timer resolution).
LATE_FLOOR_MS = 1.0


def late_bound_ms(ttft_p50_ms: float) -> float:
    """The send lag p99 a row may have before it is marked late."""
    return max(LATE_SHARE * ttft_p50_ms, LATE_FLOOR_MS)


def late_reason(lag_p99_ms: float, ttft_p50_ms: float) -> str:
    """Why a row measured the client ("" where the client kept up or it is not known)."""
    if math.isnan(lag_p99_ms) or math.isnan(ttft_p50_ms) or lag_p99_ms <= late_bound_ms(ttft_p50_ms):
        return ""
    return (f"send lag p99 {lag_p99_ms:.1f} ms > {late_bound_ms(ttft_p50_ms):.1f} ms "
            f"({100 * LATE_SHARE:g}% of TTFT p50 {ttft_p50_ms:.1f} ms)")


def client_columns(runs: list[RunRecord], ttft_p50_ms: float) -> dict:
    """The client's columns of a row from its runs; {} where no client sent them (a step backend's runs)."""
    served = [r for r in runs if r.client_workers]
    if not served:
        return {}
    wall = sum(r.wall for r in served)
    cpu = sum(r.client_cpu_s for r in served)
    lag_p99 = percentile([1000 * lag for r in served for lag in r.arrival_lags], 99)
    return {"client_cpu_pct": 100 * cpu / wall if wall > 0 and not math.isnan(cpu) else math.nan,
            "client_workers": max(r.client_workers for r in served),
            "client_late": late_reason(lag_p99, ttft_p50_ms)}

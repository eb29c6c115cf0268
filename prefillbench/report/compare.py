"""Divide by a reference strategy, and compare two runs row by row.

`prefillbench compare BASE CURRENT` joins two exports (read by report.exports) on the row key
(model, backend, strategy, test, concurrency, chunk size, arrival and rate) and gives, per row
and metric, both values and a speedup (above 1 is better, whatever the metric's direction), in
the manner of llama.cpp's compare-llama-bench; a row regressed when it got worse by more than
the threshold.

`relative_to=STRATEGY` first divides each row by the same file's row for that strategy (same
model, backend, test and concurrency), so what is compared is, say, chunked/sequential
throughput: a ratio that survives a machine that is faster or slower today than when the
baseline was made.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from prefillbench.bench.metrics import HIGHER, LOWER, METRICS, noisy_rows, strategy_label
from prefillbench.bench.stats import DEFAULT_NOISY_CV
from prefillbench.report.exports import KEY_FIELDS, InputError, Results, py_value, row_key
from prefillbench.report.relative import ratio, relative_frame

DEFAULT_METRICS = ["throughput"]
DEFAULT_THRESHOLD = 10.0  # percent
METRIC_LABELS = {
    "throughput": "throughput/s",
    "ts_mean": "t/s",
    "ms_per_token": "ms/t",
    "ttft_p50_ms": "TTFT p50 ms",
    "ttft_p99_ms": "TTFT p99 ms",
    "tbt_p50_ms": "TBT p50 ms",
    "tbt_p99_ms": "TBT p99 ms",
    "tpot_p50_ms": "TPOT p50 ms",
    "tpot_p99_ms": "TPOT p99 ms",
    "e2e_p50_ms": "E2E p50 ms",
    "e2e_p99_ms": "E2E p99 ms",
    "sched_delay_p50_ms": "sched delay p50 ms",
    "sched_delay_p99_ms": "sched delay p99 ms",
    "request_throughput": "req/s",
    "goodput_rps": "goodput req/s",
    "slo_met": "SLO met",
    "capacity_rps": "capacity req/s",
}
METRIC_SHORT = {m: label.removesuffix(" ms").removesuffix("/s") for m, label in METRIC_LABELS.items()}


# ---------------------------------------------------------------- comparing


@dataclass
class Entry:
    key: tuple
    base: dict[str, float]
    current: dict[str, float]
    speedup: dict[str, float]
    regressed: list[str]
    noisy: bool

    @property
    def fields(self) -> dict[str, Any]:
        return dict(zip(KEY_FIELDS, self.key))


@dataclass
class Comparison:
    metrics: list[str]
    threshold: float  # percent
    relative_to: str | None
    entries: list[Entry]
    only_base: list[tuple]
    only_current: list[tuple]
    cross_backend: str = ""  # 'gguf CPU vs torch CPU': each file ran one backend, joined on the rest of the key

    @property
    def regressions(self) -> list[Entry]:
        return [e for e in self.entries if e.regressed]


def speedup(metric: str, base: Any, current: Any) -> Any:
    """Above 1 means better: current/base for throughputs, base/current for latencies."""
    return ratio(current, base) if METRICS[metric] == HIGHER else ratio(base, current)


def worse_by(metric: str, base: Any, current: Any) -> Any:
    """How much worse current is than base, as a fraction of base (negative: better)."""
    change = ratio(current - base, base)
    return -change if METRICS[metric] == HIGHER else change


def _values(results: Results, metrics: list[str], relative_to: str | None, noisy_cv: float) -> pd.DataFrame:
    """One file's rows to compare: the key, the metrics (or their ratios to the reference strategy) and noisy."""
    frame = results.frame
    values = frame[list(KEY_FIELDS)].assign(noisy=noisy_rows(frame, noisy_cv))
    if relative_to is None:
        values[metrics] = frame[metrics]
    else:
        if not (frame["strategy"] == relative_to).any():
            have = ", ".join(sorted(frame["strategy"].unique()))
            raise InputError(f"{results.path}: no {relative_to} rows to be relative to (strategies: {have})")
        rel = relative_frame(frame, relative_to, metrics, noisy_cv)
        values[metrics] = rel[metrics]
        values["noisy"] |= rel["ref_noisy"]
        values = values[(frame["strategy"] != relative_to) & rel["has_ref"]]
    twice = values.duplicated(list(KEY_FIELDS))
    if twice.any():
        raise InputError(f"{results.path}: two rows for {key_label(row_key(values[twice].iloc[0]))}; compare one run per file")
    return values


def key_label(key: tuple) -> str:
    f = dict(zip(KEY_FIELDS, key))
    strategy = strategy_label(f["strategy"], f["chunk_size"])
    load = "" if f["arrival"] in ("closed", "") else f" {f['arrival']}" + (f" {f['rate']:g}/s" if f["rate"] is not None else "")
    return f"{f['model']} {f['backend']} {strategy} {f['test']} c={f['concurrency']}{load}"


def _why_disjoint(base: pd.DataFrame, current: pd.DataFrame) -> str:
    reasons = []
    for name in KEY_FIELDS:
        a, b = (set(f[name].map(lambda v: str(py_value(name, v)))) for f in (base, current))
        if not a & b:
            reasons.append(f"{name} {', '.join(sorted(a))} vs {', '.join(sorted(b))}")
    return "; ".join(reasons)


def _only(left: pd.DataFrame, right: pd.DataFrame) -> list[tuple]:
    """Keys of `left` that `right` lacks."""
    keys = list(KEY_FIELDS)
    marked = left[keys].merge(right[keys], on=keys, how="left", indicator=True)
    return [row_key(r) for r in marked[marked["_merge"] == "left_only"].to_dict("records")]


def compare(
    base: Results,
    current: Results,
    metrics: list[str] | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    relative_to: str | None = None,
    noisy_cv: float = DEFAULT_NOISY_CV,
) -> Comparison:
    """Join two runs on the row key and compute, per metric, the speedup and whether it regressed."""
    metrics = metrics or list(DEFAULT_METRICS)
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise InputError(f"unknown metric {unknown[0]!r}; choose from {', '.join(METRICS)}")
    models_base, models_current = set(base.frame["model"]), set(current.frame["model"])
    if not models_base & models_current:
        raise InputError(
            f"different models: {base.path} has {', '.join(sorted(models_base))}, {current.path} has {', '.join(sorted(models_current))}"
        )
    vb = _values(base, metrics, relative_to, noisy_cv)
    vc = _values(current, metrics, relative_to, noisy_cv)
    joined = vb.merge(vc, on=list(KEY_FIELDS), suffixes=("_base", "_current"))
    backends = (set(vb["backend"]), set(vc["backend"]))
    cross = ""
    if joined.empty and all(len(b) == 1 for b in backends) and backends[0] != backends[1]:
        # "llama.cpp or torch for this model?": the same model and tests on two backends, compared as such.
        cross = f"{min(backends[0])} vs {min(backends[1])}"
        vb, vc = vb.assign(backend=cross), vc.assign(backend=cross)
        joined = vb.merge(vc, on=list(KEY_FIELDS), suffixes=("_base", "_current"))
    if joined.empty:
        why = _why_disjoint(base.frame, current.frame)
        raise InputError(f"no rows in common between {base.path} and {current.path}" + (f" ({why})" if why else ""))
    for m in metrics:
        joined[f"{m}_speedup"] = speedup(m, joined[f"{m}_base"], joined[f"{m}_current"])
        joined[f"{m}_regressed"] = worse_by(m, joined[f"{m}_base"], joined[f"{m}_current"]) > threshold / 100.0
    entries = [
        Entry(
            row_key(r),
            {m: r[f"{m}_base"] for m in metrics},
            {m: r[f"{m}_current"] for m in metrics},
            {m: r[f"{m}_speedup"] for m in metrics},
            [m for m in metrics if r[f"{m}_regressed"]],
            bool(r["noisy_base"] or r["noisy_current"]),
        )
        for r in joined.to_dict("records")
    ]
    return Comparison(metrics, threshold, relative_to, entries, _only(vb, vc), _only(vc, vb), cross)


"""`prefillbench merge`: the N exports of one run sent as `--shard I/N` from N machines (a Kubernetes Indexed Job,
docs/k8s-client-shards.yaml) joined into one report, its rows computed again from every shard's raw records.

Each shard's export is a .json or .jsonl (`run --export`), its per-request trace beside it (X.requests.jsonl): the
requests' scheduled times and token times, from that shard's start. The merged run of each case and repetition is
the union of the shards' requests, each shard's times from its own start: the shards started together (the Job
starts its pods together; pods that start apart shift their loads against each other by that much, and no
request's own figures). Every figure a request's times give (TTFT, TBT, TPOT, E2E, goodput, throughput over the
merged span) is computed again; the counts add up (requests, failed, the client's workers and CPU); the send lag is
the worst shard's p50 and p99 (per-request lags are not exported); the engine's own clock is the shard's reading
that counted the most requests (every shard read the one engine's /metrics around its own run).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from prefillbench.bench.client_columns import late_reason
from prefillbench.bench.metrics import SLO, Load, ResultRow, summarize
from prefillbench.bench.workloads import TestSpec
from prefillbench.engine import RequestRecord, RunRecord
from prefillbench.report.exports import InputError, Results, json_lines, load_results, py_value, read_text, row_key
from prefillbench.report.traces import trace_path_for

#: What names a case in both a row and a trace record (a trace's `arrival` is the request's time, not the row's kind).
CASE_FIELDS = ("model", "backend", "strategy", "test", "concurrency", "chunk_size", "rate")
#: The row's columns that come from the engine's own clock: taken whole from one shard.
ENGINE_COLUMNS = [f.name for f in dataclasses.fields(ResultRow) if f.name.startswith("engine_")]


def case_key(record: ResultRow | dict[str, Any]) -> tuple:
    get = record.get if isinstance(record, dict) else lambda f: getattr(record, f)
    return tuple(py_value(f, get(f)) for f in CASE_FIELDS)


def shard_of(results: Results) -> tuple[int, int]:
    text = str(results.meta.get("client_shard", ""))
    i, _, n = text.partition("/")
    if not (i.isdigit() and n.isdigit()):
        raise InputError(f"{results.path}: not a --shard export (its metadata has no client_shard)")
    return int(i), int(n)


def _traces(path: str) -> dict[tuple, dict[int, list[RequestRecord]]]:
    """A shard's trace: its requests by case key and repetition."""
    trace = trace_path_for(path)
    if trace is None:
        raise InputError(f"{path}: merge reads each shard's per-request trace: export the shards as .json or .jsonl")
    out: dict[tuple, dict[int, list[RequestRecord]]] = {}
    for n, r in json_lines(str(trace), read_text(str(trace))):
        try:
            key = case_key(r)
            times = [float(t) for t in r["token_times"]]
            first = r.get("first_scheduled")
            record = RequestRecord(int(r["prompt_len"]), float(r["arrival"]), times, [0] * len(times),
                                   first_scheduled=None if first is None else float(first))
            out.setdefault(key, {}).setdefault(int(r["repetition"]), []).append(record)
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{trace} line {n}: not a per-request record of prefillbench's") from None
    return out


def merge_exports(paths: list[str]) -> tuple[list[ResultRow], dict[str, Any]]:
    """The shards' exports (one each, in any order) as one report's rows and metadata."""
    shards = [load_results(p) for p in paths]
    ids = [shard_of(s) for s in shards]
    n = ids[0][1]
    if any(of != n for _, of in ids):
        raise InputError(f"merge: the exports are shards of different splits ({', '.join(f'{i}/{m}' for i, m in ids)})")
    seen = sorted(i for i, _ in ids)
    if seen != list(range(n)):
        missing = sorted(set(range(n)) - set(seen))
        twice = sorted({i for i in seen if seen.count(i) > 1})
        what = f"shard {missing[0]}/{n} is missing" if missing else f"shard {twice[0]}/{n} is given twice"
        raise InputError(f"merge: {what} (give each of the {n} shards' exports once)")
    traces = [_traces(p) for p in paths]
    rows = []
    for base in shards[0].rows:
        key = case_key(base)
        parts = [next((r for r in s.rows if row_key(r) == row_key(base)), None) for s in shards]
        if any(p is None for p in parts):
            raise InputError(f"merge: a row of {paths[0]} ({base.strategy} {base.test}) is not in every shard")
        reps = sorted({k for t in traces for k in t.get(key, {})})
        runs = []
        for rep in reps:
            requests = [r for t in traces for r in t.get(key, {}).get(rep, [])]
            end = max((r.token_times[-1] for r in requests), default=0.0)
            runs.append(RunRecord(0.0, end, requests, []))
        if not runs:
            raise InputError(f"merge: no request of {base.strategy} {base.test} finished in any shard's trace")
        rows.append(_merged_row(base, parts, runs))
    meta = {k: v for k, v in shards[0].meta.items() if k != "client_shard"}
    meta["merged_shards"] = n
    meta["merged_from"] = ", ".join(str(Path(p)) for p in paths)
    return rows, meta


def _merged_row(base: ResultRow, parts: list[ResultRow], runs: list[RunRecord]) -> ResultRow:
    row = summarize(TestSpec(base.n_prompt, base.n_gen), runs, model=base.model, backend=base.backend,
                    strategy=base.strategy, concurrency=base.concurrency, chunk_size=base.chunk_size,
                    load=Load(base.arrival, base.rate, base.burstiness), slo=SLO.parse(base.slo) if base.slo else None,
                    prefix_implied=base.prefix_hit_implied, deployment=base.deployment)
    lag_p99 = max((p.arrival_lag_p99_ms for p in parts if not math.isnan(p.arrival_lag_p99_ms)), default=math.nan)
    engine = max(parts, key=lambda p: -1 if math.isnan(p.engine_requests) else p.engine_requests)
    failed = sum(p.failed_requests for p in parts)
    merged = dataclasses.replace(
        row, test=base.test, requests=sum(p.requests for p in parts), failed_requests=failed,
        arrival_lag_p50_ms=max((p.arrival_lag_p50_ms for p in parts if not math.isnan(p.arrival_lag_p50_ms)),
                               default=math.nan),
        arrival_lag_p99_ms=lag_p99,
        client_cpu_pct=sum(p.client_cpu_pct for p in parts if not math.isnan(p.client_cpu_pct)),
        client_workers=sum(p.client_workers for p in parts),
        client_late=late_reason(lag_p99, row.ttft_p50_ms),
        **{c: getattr(engine, c) for c in ENGINE_COLUMNS})
    if merged.slo:  # a failed request misses every SLO: the shares counted over all of them
        met = row.slo_met * sum(len(r.requests) for r in runs)
        merged = dataclasses.replace(merged, slo_met=met / (sum(len(r.requests) for r in runs) + failed))
    return merged

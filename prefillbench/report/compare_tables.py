"""The tables of a comparison: `compare`'s per-row speedups and `run --relative-to`'s ratios, in every -o format."""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from prefillbench.bench.metrics import ResultRow, results_frame, strategy_label
from prefillbench.bench.stats import DEFAULT_NOISY_CV
from prefillbench.report.compare import METRIC_LABELS, METRIC_SHORT, Comparison, Entry
from prefillbench.report.relative import relative_frame
from prefillbench.report.tables import TABLE_FORMATS, fmt_number, frame_text, md_table, table_columns
from prefillbench.writers import csv_text, json_text, jsonl_text


def _num(value: float, digits: int = 3) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _digits(metric: str, relative: bool) -> int:
    return 3 if relative else (2 if metric in ("throughput", "ts_mean") else 1 if metric.endswith("_ms") else 3)


def _status(e: Entry) -> str:
    if e.regressed:
        return "REGRESSION" + (" (noisy)" if e.noisy else "")
    return "ok" + (" (noisy)" if e.noisy else "")


def render_comparison(cmp: Comparison, fmt: str = "md") -> str:
    rel = cmp.relative_to
    suffix = f"/{rel}" if rel else ""
    if fmt in ("csv", "json", "jsonl"):
        records = []
        for e in cmp.entries:
            rec: dict[str, Any] = dict(e.fields)
            for m in cmp.metrics:
                rec[f"{m}{'_rel' if rel else ''}_base"] = e.base[m]
                rec[f"{m}{'_rel' if rel else ''}_current"] = e.current[m]
                rec[f"{m}_speedup"] = e.speedup[m]
            rec["regressed"] = ",".join(e.regressed)
            rec["noisy"] = e.noisy
            records.append(rec)
        if fmt == "json":
            doc = {"relative_to": rel, "threshold_pct": cmp.threshold, "metrics": cmp.metrics, "rows": records}
            return json_text(doc)
        if fmt == "jsonl":
            return jsonl_text(records)
        return csv_text(pd.DataFrame(records).astype({"chunk_size": "Int64"})) if records else ""

    def label(e: Entry) -> str:
        return strategy_label(e.fields["strategy"], e.fields["chunk_size"])

    columns: list[tuple[str, Any, bool]] = [
        ("model", lambda e: e.fields["model"], False),
        ("backend", lambda e: e.fields["backend"], False),
        ("strategy", label, False),
        ("test", lambda e: e.fields["test"], False),
        ("concurrency", lambda e: str(e.fields["concurrency"]), True),
    ]
    for m in cmp.metrics:
        name = METRIC_SHORT[m] + suffix if rel else METRIC_LABELS[m]
        d = _digits(m, bool(rel))
        columns += [
            (f"{name} base", lambda e, m=m, d=d: _num(e.base[m], d), True),
            (f"{name} current", lambda e, m=m, d=d: _num(e.current[m], d), True),
            ("speedup" if len(cmp.metrics) == 1 else f"{METRIC_SHORT[m]} speedup", lambda e, m=m: _num(e.speedup[m], 2), True),
        ]
    columns.append(("status", _status, False))
    return md_table(columns, cmp.entries, fmt)


# The ratios `run --relative-to` shows, by the table column whose figures they divide (TPOT and E2E follow
# from TBT and TTFT, and would make the table too wide to read).
RATIO_COLUMNS: dict[str, list[str]] = {
    "t/s": ["ts_mean"],
    "throughput/s": ["throughput"],
    "TTFT p50/p99 ms": ["ttft_p50_ms", "ttft_p99_ms"],
    "TBT p50/p99 ms": ["tbt_p50_ms", "tbt_p99_ms"],
    "goodput": ["goodput_rps"],  # its header names the SLO: matched by prefix
}
RUN_RATIO_METRICS = list(dict.fromkeys(m for ms in RATIO_COLUMNS.values() for m in ms))


def _ratio_metrics(header: str) -> list[str] | None:
    return next((ms for h, ms in RATIO_COLUMNS.items() if header == h or (h == "goodput" and header.startswith(h))), None)


def render_relative(fmt: str, rows: list[ResultRow], meta: dict[str, Any], strategy: str, noisy_cv: float = DEFAULT_NOISY_CV) -> str:
    """`run --relative-to`: the run's own table (every key column it has: rate, arrival, SLO, goodput),
    each figure followed by its ratio to the reference strategy's row; a dash where a ratio does not apply."""
    frame = results_frame(rows)
    ratios = relative_frame(frame, strategy, RUN_RATIO_METRICS, noisy_cv)
    if fmt not in TABLE_FORMATS:
        return frame_text(fmt, frame.join(ratios[RUN_RATIO_METRICS].add_suffix(f"_vs_{strategy}")), meta, relative_to=strategy)
    columns = []
    for header, cell, right in table_columns(rows, noisy_cv):
        columns.append((header, lambda item, cell=cell: cell(item[0]), right))
        metrics = _ratio_metrics(header)
        if metrics:
            columns.append((f"/{strategy}", lambda item, ms=metrics: "/".join(fmt_number(item[1][m], 3) for m in ms), True))
    return md_table(columns, list(zip(rows, ratios.to_dict("records"))), fmt)

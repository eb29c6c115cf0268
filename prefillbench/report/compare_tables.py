"""The tables of a comparison: `compare`'s per-row speedups and `run --relative-to`'s ratios, in every -o format."""
from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from prefillbench.bench.metrics import ResultRow, results_frame
from prefillbench.bench.stats import DEFAULT_NOISY_CV
from prefillbench.report.compare import METRIC_LABELS, METRIC_SHORT, RUN_RATIO_METRICS, Comparison, Entry, relative_frame
from prefillbench.report.tables import MD_COLUMNS, TABLE_FORMATS, cv_cell, fmt_number, frame_text, md_table



def _num(value: float, digits: int = 3) -> str:
    return "nan" if value is None or math.isnan(value) else f"{value:.{digits}f}"


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
            return json.dumps(doc, indent=2) + "\n"
        if fmt == "jsonl":
            return "".join(json.dumps(r) + "\n" for r in records)
        return pd.DataFrame(records).astype({"chunk_size": "Int64"}).to_csv(index=False, lineterminator="\n") if records else ""

    def label(e: Entry) -> str:
        f = e.fields
        return f"{f['strategy']} ({f['chunk_size']})" if f["chunk_size"] else f["strategy"]

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


def render_relative(fmt: str, rows: list[ResultRow], meta: dict[str, Any], strategy: str, noisy_cv: float = DEFAULT_NOISY_CV) -> str:
    """`run --relative-to`: every row with its ratios to the reference strategy's row."""
    frame = results_frame(rows)
    ratios = relative_frame(frame, strategy, RUN_RATIO_METRICS)
    if fmt not in TABLE_FORMATS:
        return frame_text(fmt, frame.join(ratios[RUN_RATIO_METRICS].add_suffix(f"_vs_{strategy}")), meta, relative_to=strategy)
    head = {h: (h, cell, right) for h, cell, right in MD_COLUMNS}
    columns = [head[h] for h in ("model", "backend", "strategy", "test", "concurrency")]
    columns = [(h, (lambda item, cell=cell: cell(item[0])), right) for h, cell, right in columns]
    for m in RUN_RATIO_METRICS:
        d = 2 if m in ("throughput", "ts_mean") else 1
        columns.append((METRIC_LABELS[m], lambda item, m=m, d=d: fmt_number(getattr(item[0], m), d), True))
        columns.append((f"/{strategy}", lambda item, m=m: _num(item[1][m], 3), True))
    columns.append(("CV", lambda item: cv_cell(item[0], noisy_cv), True))
    return md_table(columns, list(zip(rows, ratios.to_dict("records"))), fmt)

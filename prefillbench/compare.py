"""Read exported results back, divide by a reference strategy, and compare two runs.

`prefillbench compare BASE CURRENT` joins two exports on model, backend,
strategy, test, concurrency and chunk size and prints, per row and metric,
both values and a speedup (above 1 is better, whatever the metric's
direction), in the manner of llama.cpp's compare-llama-bench. It exits 1 when
a row got worse by more than --threshold percent, 0 otherwise, and 2 with a
one-line reason when the input cannot be used.

`--relative-to STRATEGY` first divides each row by the same file's row for
that strategy (same model, backend, test and concurrency), so what is
compared is, say, chunked/sequential throughput: a ratio that survives a
machine that is faster or slower today than when the baseline was made.
"""
from __future__ import annotations

import csv
import io
import json
import math
import sys
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from .metrics import ResultRow
from .stats import DEFAULT_NOISY_CV

HIGHER, LOWER = "higher", "lower"
# metric -> which way is better
METRICS: dict[str, str] = {
    "throughput": HIGHER,
    "ts_mean": HIGHER,
    "ms_per_token": LOWER,
    "ttft_p50_ms": LOWER,
    "ttft_p99_ms": LOWER,
    "tbt_p50_ms": LOWER,
    "tbt_p99_ms": LOWER,
    "tpot_p50_ms": LOWER,
    "tpot_p99_ms": LOWER,
    "e2e_p50_ms": LOWER,
    "e2e_p99_ms": LOWER,
    "sched_delay_p50_ms": LOWER,
    "sched_delay_p99_ms": LOWER,
    "request_throughput": HIGHER,
    "goodput_rps": HIGHER,
    "slo_met": HIGHER,
    "capacity_rps": HIGHER,
}
DEFAULT_METRICS = ["throughput"]
DEFAULT_THRESHOLD = 10.0  # percent
# The ratios `run --relative-to` shows.
RUN_RATIO_METRICS = ["ts_mean", "throughput", "ttft_p99_ms", "tbt_p99_ms"]
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
KEY_FIELDS = ("model", "backend", "strategy", "test", "concurrency", "chunk_size", "arrival", "rate")

_INT_FIELDS = {"n_prompt", "n_gen", "concurrency", "requests", "repetitions"}
_OPTIONAL_FLOATS = {"rate", "burstiness"}  # None where they do not apply
_TEXT_FIELDS = {"arrival", "slo"}
_ALL_FIELDS = {f.name: f for f in fields(ResultRow)}
# Columns every export has had since the first version; the statistics came later.
REQUIRED = [f.name for f in fields(ResultRow) if f.default is MISSING]


class InputError(ValueError):
    """A results file that cannot be used: one line, exit 2."""


# ---------------------------------------------------------------- loading


@dataclass
class Results:
    path: str
    rows: list[ResultRow]
    meta: dict[str, Any] = field(default_factory=dict)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _parse_value(name: str, value: Any, where: str) -> Any:
    if name in _OPTIONAL_FLOATS:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null", "nan")):
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            raise InputError(f"{where}: {name} is not a number: {_one_line(value)!r}") from None
    if name in _TEXT_FIELDS:
        return "" if value is None else str(value)
    if name == "chunk_size":
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
            return None
        try:
            return int(float(value))
        except (TypeError, ValueError):
            raise InputError(f"{where}: chunk_size is not a number: {_one_line(value)!r}") from None
    if name in ("model", "backend", "strategy", "test"):
        if value is None or (isinstance(value, str) and not value.strip()):
            raise InputError(f"{where}: empty {name}")
        return str(value)
    if name in _INT_FIELDS:
        try:
            return int(float(value))
        except (TypeError, ValueError):
            raise InputError(f"{where}: {name} is not an integer: {_one_line(value)!r}") from None
    if value is None or value == "":
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {name} is not a number: {_one_line(value)!r}") from None


def row_from_record(record: Any, where: str) -> ResultRow:
    if not isinstance(record, dict):
        raise InputError(f"{where}: not a prefillbench results file (a record is not an object)")
    if "token_times" in record:
        raise InputError(f"{where}: this is a per-request trace (--export-requests), not a results export")
    missing = [c for c in REQUIRED if c not in record]
    if missing:
        raise InputError(f"{where}: not a prefillbench results file (missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''})")
    values = {name: _parse_value(name, record[name], where) for name in _ALL_FIELDS if name in record}
    return ResultRow(**values)


def _read_text(path: str) -> str:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such file")
    if p.is_dir():
        raise InputError(f"{path}: is a directory, not a results file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    if not text.strip():
        raise InputError(f"{path}: empty file")
    return text


def _sniff(path: str, text: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix in (".csv",):
        return "csv"
    if suffix in (".json",):
        return "json"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix in (".md", ".markdown"):
        raise InputError(f"{path}: a markdown table cannot be read back; export .csv or .json")
    head = text.lstrip()
    if head.startswith("{") and "\n{" in head.strip():
        return "jsonl"
    return "json" if head.startswith(("{", "[")) else "csv"


def _json_error(path: str, e: json.JSONDecodeError, line: int | None = None) -> InputError:
    where = f"{path} line {line}" if line else f"{path} line {e.lineno}"
    return InputError(f"{where}: truncated or malformed JSON ({e.msg})")


def _load_csv(path: str, text: str) -> Results:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise InputError(
            f"{path}: not a prefillbench results file (missing columns {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''})"
        )
    rows, meta = [], {}
    try:
        for record in reader:
            where = f"{path} line {reader.line_num}"
            if None in record:
                raise InputError(f"{where}: malformed row (more fields than the header)")
            absent = [k for k, v in record.items() if v is None]
            if absent:
                raise InputError(f"{where}: truncated row ({len(header) - len(absent)} of {len(header)} fields)")
            rows.append(row_from_record(record, where))
            if not meta:
                meta = {k: v for k, v in record.items() if k not in _ALL_FIELDS}
    except csv.Error as e:
        raise InputError(f"{path} line {reader.line_num}: malformed CSV ({e})") from None
    return Results(path, rows, meta)


def _load_json(path: str, text: str) -> Results:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise _json_error(path, e) from None
    if isinstance(doc, dict) and isinstance(doc.get("results"), list):
        records, meta = doc["results"], doc.get("metadata") or {}
    elif isinstance(doc, list):
        records, meta = doc, {}
    else:
        raise InputError(f"{path}: not a prefillbench results file (no \"results\" list)")
    rows = [row_from_record(r, f"{path} result {i + 1}") for i, r in enumerate(records)]
    return Results(path, rows, meta if isinstance(meta, dict) else {})


def json_lines(path: str, text: str):
    """(line number, record) for each non-blank line of a JSON-lines file."""
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                raise _json_error(path, e, n) from None


def _load_jsonl(path: str, text: str) -> Results:
    rows, meta = [], {}
    for n, record in json_lines(path, text):
        rows.append(row_from_record(record, f"{path} line {n}"))
        if not meta and isinstance(record, dict):
            meta = {k: v for k, v in record.items() if k not in _ALL_FIELDS}
    return Results(path, rows, meta)


def load_results(path: str) -> Results:
    """Rows of a CSV, JSON or JSONL export; InputError with a one-line reason otherwise."""
    text = _read_text(path)
    fmt = _sniff(path, text)
    results = {"csv": _load_csv, "json": _load_json, "jsonl": _load_jsonl}[fmt](path, text)
    if not results.rows:
        raise InputError(f"{path}: no result rows")
    return results


# ---------------------------------------------------------------- ratios


def row_key(row: ResultRow) -> tuple:
    return tuple(getattr(row, f) for f in KEY_FIELDS)


def _group_key(row: ResultRow) -> tuple:
    return (row.model, row.backend, row.test, row.concurrency, row.arrival, row.rate)


def reference_rows(rows: list[ResultRow], strategy: str) -> list[ResultRow | None]:
    """Each row's reference: the same model, backend, test, concurrency and load under `strategy`.

    Where the reference strategy ran at several chunk sizes, a row is matched
    to the one with its own chunk size, and has none if it has no chunk size.
    """
    refs: dict[tuple, list[ResultRow]] = {}
    for r in rows:
        if r.strategy == strategy:
            refs.setdefault(_group_key(r), []).append(r)
    out: list[ResultRow | None] = []
    for r in rows:
        candidates = refs.get(_group_key(r), [])
        if len(candidates) > 1:
            candidates = [c for c in candidates if c.chunk_size == r.chunk_size]
        out.append(candidates[0] if len(candidates) == 1 else None)
    return out


def ratio(value: float, ref: float) -> float:
    if ref is None or value is None or math.isnan(ref) or math.isnan(value) or ref == 0:
        return math.nan
    return value / ref


@dataclass
class RelativeRow:
    row: ResultRow
    ref: ResultRow | None
    ratios: dict[str, float]

    @property
    def noisy_rows(self) -> list[ResultRow]:
        return [self.row] + ([self.ref] if self.ref is not None and self.ref is not self.row else [])


def relative_rows(rows: list[ResultRow], strategy: str, metrics: list[str]) -> list[RelativeRow]:
    """Every row with its metrics divided by its reference row (NaN where there is none)."""
    out = []
    for r, ref in zip(rows, reference_rows(rows, strategy)):
        out.append(RelativeRow(r, ref, {m: ratio(getattr(r, m), getattr(ref, m)) if ref else math.nan for m in metrics}))
    return out


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

    @property
    def regressions(self) -> list[Entry]:
        return [e for e in self.entries if e.regressed]


def speedup(metric: str, base: float, current: float) -> float:
    """Above 1 means better: current/base for throughputs, base/current for latencies."""
    return ratio(current, base) if METRICS[metric] == HIGHER else ratio(base, current)


def worse_by(metric: str, base: float, current: float) -> float:
    """How much worse current is than base, as a fraction of base (negative: better)."""
    change = ratio(current - base, base) if not (math.isnan(base) or math.isnan(current)) else math.nan
    return -change if METRICS[metric] == HIGHER else change


def _values(results: Results, metrics: list[str], relative_to: str | None, noisy_cv: float) -> dict[tuple, tuple[dict[str, float], bool]]:
    """key -> (metric values or ratios, noisy?) for one file; duplicates are an error."""
    out: dict[tuple, tuple[dict[str, float], bool]] = {}
    if relative_to is None:
        items = [(r, {m: getattr(r, m) for m in metrics}, [r]) for r in results.rows]
    else:
        if not any(r.strategy == relative_to for r in results.rows):
            have = ", ".join(sorted({r.strategy for r in results.rows}))
            raise InputError(f"{results.path}: no {relative_to} rows to be relative to (strategies: {have})")
        items = [
            (rel.row, rel.ratios, rel.noisy_rows)
            for rel in relative_rows(results.rows, relative_to, metrics)
            if rel.row.strategy != relative_to and rel.ref is not None
        ]
    for row, values, involved in items:
        key = row_key(row)
        if key in out:
            raise InputError(f"{results.path}: two rows for {_key_label(key)}; compare one run per file")
        out[key] = (values, any(r.noisy(noisy_cv) for r in involved))
    return out


def _key_label(key: tuple) -> str:
    f = dict(zip(KEY_FIELDS, key))
    strategy = f"{f['strategy']}({f['chunk_size']})" if f["chunk_size"] else f["strategy"]
    load = "" if f["arrival"] in ("closed", "") else f" {f['arrival']}" + (f" {f['rate']:g}/s" if f["rate"] is not None else "")
    return f"{f['model']} {f['backend']} {strategy} {f['test']} c={f['concurrency']}{load}"


def _why_disjoint(base: Results, current: Results) -> str:
    reasons = []
    for name in KEY_FIELDS:
        a = {getattr(r, name) for r in base.rows}
        b = {getattr(r, name) for r in current.rows}
        if not a & b:
            fa = ", ".join(sorted(map(str, a)))
            fb = ", ".join(sorted(map(str, b)))
            reasons.append(f"{name} {fa} vs {fb}")
    return "; ".join(reasons)


def compare(
    base: Results,
    current: Results,
    metrics: list[str] | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    relative_to: str | None = None,
    noisy_cv: float = DEFAULT_NOISY_CV,
) -> Comparison:
    metrics = metrics or list(DEFAULT_METRICS)
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise InputError(f"unknown metric {unknown[0]!r}; choose from {', '.join(METRICS)}")
    models_base = {r.model for r in base.rows}
    models_current = {r.model for r in current.rows}
    if not models_base & models_current:
        raise InputError(
            f"different models: {base.path} has {', '.join(sorted(models_base))}, {current.path} has {', '.join(sorted(models_current))}"
        )
    vb = _values(base, metrics, relative_to, noisy_cv)
    vc = _values(current, metrics, relative_to, noisy_cv)
    common = [k for k in vb if k in vc]
    if not common:
        why = _why_disjoint(base, current)
        raise InputError(f"no rows in common between {base.path} and {current.path}" + (f" ({why})" if why else ""))
    entries = []
    for key in common:
        (b, nb), (c, nc) = vb[key], vc[key]
        regressed = [m for m in metrics if worse_by(m, b[m], c[m]) > threshold / 100.0]
        entries.append(Entry(key, b, c, {m: speedup(m, b[m], c[m]) for m in metrics}, regressed, nb or nc))
    return Comparison(
        metrics,
        threshold,
        relative_to,
        entries,
        [k for k in vb if k not in vc],
        [k for k in vc if k not in vb],
    )


# ---------------------------------------------------------------- printing


def _num(value: float, digits: int = 3) -> str:
    return "nan" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _digits(metric: str, relative: bool) -> int:
    return 3 if relative else (2 if metric in ("throughput", "ts_mean") else 1 if metric.endswith("_ms") else 3)


def _status(e: Entry) -> str:
    if e.regressed:
        return "REGRESSION" + (" (noisy)" if e.noisy else "")
    return "ok" + (" (noisy)" if e.noisy else "")


def render_comparison(cmp: Comparison, fmt: str = "md") -> str:
    from .reports import md_table

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
        buf = io.StringIO()
        if records:
            writer = csv.DictWriter(buf, fieldnames=list(records[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(records)
        return buf.getvalue()

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
    from .reports import MD_COLUMNS, TABLE_FORMATS, _fmt, cv_cell, md_table

    rels = relative_rows(rows, strategy, RUN_RATIO_METRICS)
    if fmt not in TABLE_FORMATS:
        records = [{**rel.row.as_dict(), **{f"{m}_vs_{strategy}": rel.ratios[m] for m in RUN_RATIO_METRICS}, **meta} for rel in rels]
        if fmt == "json":
            return json.dumps({"metadata": meta, "relative_to": strategy, "results": [{k: v for k, v in r.items() if k not in meta} for r in records]}, indent=2) + "\n"
        if fmt == "jsonl":
            return "".join(json.dumps(r) + "\n" for r in records)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(records[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
        return buf.getvalue()
    head = {h: (h, cell, right) for h, cell, right in MD_COLUMNS}
    columns = [head[h] for h in ("model", "backend", "strategy", "test", "concurrency")]
    columns = [(h, (lambda rel, cell=cell: cell(rel.row)), right) for h, cell, right in columns]
    for m in RUN_RATIO_METRICS:
        d = 2 if m in ("throughput", "ts_mean") else 1
        columns.append((METRIC_LABELS[m], lambda rel, m=m, d=d: _fmt(getattr(rel.row, m), d), True))
        columns.append((f"/{strategy}", lambda rel, m=m: _num(rel.ratios[m], 3), True))
    columns.append(("CV", lambda rel: cv_cell(rel.row, noisy_cv), True))
    return md_table(columns, rels, fmt)


# ---------------------------------------------------------------- command line


def cmd_compare(args: Any) -> int:
    metrics = args.metric or list(DEFAULT_METRICS)
    base = load_results(args.base)
    current = load_results(args.current)
    cmp = compare(base, current, metrics, args.threshold, args.relative_to, args.noisy_cv / 100.0)
    sys.stdout.write(render_comparison(cmp, args.output))
    sys.stdout.flush()
    for name, keys in ((args.base, cmp.only_base), (args.current, cmp.only_current)):
        if keys:
            print(f"prefillbench: {len(keys)} row(s) only in {name}, not compared: {_key_label(keys[0])}{' ...' if len(keys) > 1 else ''}",
                  file=sys.stderr)
    n = len(cmp.regressions)
    what = f"{'/'.join(metrics)}{' relative to ' + args.relative_to if args.relative_to else ''}"
    if n:
        print(f"prefillbench: {n} of {len(cmp.entries)} row(s) regressed beyond {args.threshold:g}% ({what})", file=sys.stderr)
        return 1
    print(f"prefillbench: {len(cmp.entries)} row(s) within {args.threshold:g}% ({what})", file=sys.stderr)
    return 0

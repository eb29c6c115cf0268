"""Read exported results back, divide by a reference strategy, and compare two runs.

`prefillbench compare BASE CURRENT` reads two exports into frames, merges them
on the row key (model, backend, strategy, test, concurrency, chunk size,
arrival and rate) and prints, per row and metric,
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

import pandas as pd

from prefillbench.bench.metrics import OPTIONAL_NUMBERS, ResultRow, noisy_rows, results_frame
from prefillbench.bench.stats import DEFAULT_NOISY_CV
from prefillbench.report.relative import ratio, relative_frame, render_relative  # noqa: F401 (compare.render_relative)

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

_INT_FIELDS = {"n_prompt", "n_gen", "concurrency", "requests", "repetitions", "capacity_probes"}
_TEXT_FIELDS = {"arrival", "slo"}
_KEY_TEXT = {"model", "backend", "strategy", "test"}
_ALL_FIELDS = {f.name: f for f in fields(ResultRow)}
# Columns every export has had since the first version; the statistics came later.
REQUIRED = [f.name for f in fields(ResultRow) if f.default is MISSING]


class InputError(ValueError):
    """A results file that cannot be used: one line, exit 2."""


# ---------------------------------------------------------------- loading


@dataclass
class Results:
    """An export read back: its rows as a frame (a list of ResultRow is turned into one) and its metadata."""

    path: str
    frame: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.frame, pd.DataFrame):
            self.frame = results_frame(self.frame)

    @property
    def rows(self) -> list[ResultRow]:
        return [_row(r) for r in self.frame.to_dict("records")]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def read_text(path: str) -> str:
    """A file's text, or InputError with a one-line reason (missing, a folder, binary, empty)."""
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


def export_format(path: str) -> str:
    """csv, json or jsonl, by the file's name (the names `run --export` writes)."""
    suffix = Path(path).suffix.lower()
    if suffix in (".md", ".markdown"):
        raise InputError(f"{path}: a markdown table cannot be read back; export .csv or .json")
    fmt = {".csv": "csv", ".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl"}.get(suffix)
    if fmt is None:
        raise InputError(f"{path}: cannot tell the format from the name; use .csv, .json or .jsonl")
    return fmt


def json_lines(path: str, text: str):
    """(line number, record) for each non-blank line of a JSON-lines file."""
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path} line {n}: truncated or malformed JSON ({e.msg})") from None


def read_frame(path: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """An export's records as read (CSV cells as text, typed later) and its metadata."""
    text = read_text(path)
    fmt = export_format(path)
    if fmt == "csv":
        try:
            frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
        except pd.errors.ParserError as e:
            raise InputError(f"{path}: malformed CSV ({_one_line(e)})") from None
        # pandas pads a short row with blanks; a row cut off mid-write must not pass for one with empty cells.
        widths = [len(r) for r in csv.reader(io.StringIO(text)) if r]
        short = next((n for n, w in enumerate(widths[1:], 2) if w < widths[0]), None)
        if short is not None:
            raise InputError(f"{path} line {short}: truncated row ({widths[short - 1]} of {widths[0]} fields)")
        meta = {k: v for k, v in frame.iloc[0].items() if k not in _ALL_FIELDS} if len(frame) else {}
        return frame, meta
    if fmt == "jsonl":
        records: Any = [record for _, record in json_lines(path, text)]
        meta: Any = records[0] if records and isinstance(records[0], dict) else {}
    else:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"{path} line {e.lineno}: truncated or malformed JSON ({e.msg})") from None
        if isinstance(doc, dict) and isinstance(doc.get("results"), list):
            records, meta = doc["results"], doc.get("metadata") or {}
        elif isinstance(doc, list):
            records, meta = doc, {}
        else:
            raise InputError(f"{path}: not a prefillbench results file (no \"results\" list)")
    if not all(isinstance(r, dict) for r in records):
        raise InputError(f"{path}: not a prefillbench results file (a record is not an object)")
    meta = {k: v for k, v in meta.items() if k not in _ALL_FIELDS} if isinstance(meta, dict) else {}
    return pd.DataFrame.from_records(records), meta


def _blank(column: pd.Series) -> pd.Series:
    return column.isna() | column.astype(str).str.strip().str.lower().isin(["", "none", "null", "nan"])


def typed_rows(frame: pd.DataFrame, path: str) -> pd.DataFrame:
    """The ResultRow columns of an export, typed; InputError naming the first cell that does not parse."""
    if "token_times" in frame.columns:
        raise InputError(f"{path}: this is a per-request trace (--export-requests), not a results export")
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise InputError(f"{path}: not a prefillbench results file (missing columns "
                         f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''})")
    out = pd.DataFrame(index=frame.index)
    for name in [c for c in _ALL_FIELDS if c in frame.columns]:
        column, blank = frame[name], _blank(frame[name])
        if name in _TEXT_FIELDS:
            out[name] = column.where(column.notna(), "").astype(str)
        elif name in _KEY_TEXT:
            if blank.any():
                raise InputError(f"{path} row {_first(blank)}: empty {name}")
            out[name] = column.astype(str)
        else:
            numbers = pd.to_numeric(column.where(~blank), errors="coerce")
            bad = (~blank & numbers.isna()) | (blank if name in _INT_FIELDS else False)
            if bad.any():
                kind = "an integer" if name in _INT_FIELDS else "a number"
                raise InputError(f"{path} row {_first(bad)}: {name} is not {kind}: {_one_line(column[bad].iloc[0])!r}")
            out[name] = numbers
    # Columns added since the file was written get their default (NaN where there is none).
    absent = {c: f.default for c, f in _ALL_FIELDS.items() if c not in out.columns}
    return out.assign(**absent).astype({c: float for c in OPTIONAL_NUMBERS})[list(_ALL_FIELDS)]


def _first(mask: pd.Series) -> int:
    return int(mask.to_numpy().argmax()) + 1


def _row(record: dict[str, Any]) -> ResultRow:
    """A frame's record as a ResultRow: ints where the field is one, None where an optional one is absent."""
    return ResultRow(**{name: _py(name, value) if name in OPTIONAL_NUMBERS or name in _INT_FIELDS else value
                        for name, value in record.items()})


def load_results(path: str) -> Results:
    """Rows of a CSV, JSON or JSONL export; InputError with a one-line reason otherwise."""
    frame, meta = read_frame(path)
    rows = typed_rows(frame, path)
    if rows.empty:
        raise InputError(f"{path}: no result rows")
    return Results(path, rows, meta)


# ---------------------------------------------------------------- ratios

def _py(name: str, value: Any) -> Any:
    """A key cell as a plain value: int chunk sizes, None where a figure does not apply."""
    if name not in OPTIONAL_NUMBERS and name not in _INT_FIELDS:
        return value
    if pd.isna(value):
        return None
    return int(value) if name in _INT_FIELDS or name == "chunk_size" else float(value)


def row_key(row: ResultRow | dict[str, Any]) -> tuple:
    get = row.get if isinstance(row, dict) else lambda f: getattr(row, f)
    return tuple(_py(f, get(f)) for f in KEY_FIELDS)


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
    strategy = f"{f['strategy']}({f['chunk_size']})" if f["chunk_size"] else f["strategy"]
    load = "" if f["arrival"] in ("closed", "") else f" {f['arrival']}" + (f" {f['rate']:g}/s" if f["rate"] is not None else "")
    return f"{f['model']} {f['backend']} {strategy} {f['test']} c={f['concurrency']}{load}"


def _why_disjoint(base: pd.DataFrame, current: pd.DataFrame) -> str:
    reasons = []
    for name in KEY_FIELDS:
        a, b = (set(f[name].map(lambda v: str(_py(name, v)))) for f in (base, current))
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


# ---------------------------------------------------------------- printing


def _num(value: float, digits: int = 3) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _digits(metric: str, relative: bool) -> int:
    return 3 if relative else (2 if metric in ("throughput", "ts_mean") else 1 if metric.endswith("_ms") else 3)


def _status(e: Entry) -> str:
    if e.regressed:
        return "REGRESSION" + (" (noisy)" if e.noisy else "")
    return "ok" + (" (noisy)" if e.noisy else "")


def render_comparison(cmp: Comparison, fmt: str = "md") -> str:
    from prefillbench.report.tables import md_table

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
            print(f"prefillbench: {len(keys)} row(s) only in {name}, not compared: {key_label(keys[0])}{' ...' if len(keys) > 1 else ''}",
                  file=sys.stderr)
    if cmp.cross_backend:
        print(f"prefillbench: cross-backend comparison, {cmp.cross_backend} on the {len(cmp.entries)} row(s) both ran "
              "(same model, test and load)", file=sys.stderr)
    from prefillbench.report.compare_verdict import comparison_lines, setup_differences  # it imports this module's types

    differ = setup_differences(base.meta, current.meta)
    if differ:
        print(f"prefillbench: the runs differ in {', '.join(differ)}: the numbers measure different setups", file=sys.stderr)
    if not getattr(args, "no_verdict", False):
        for line in comparison_lines(cmp):
            print(f"prefillbench: {line}", file=sys.stderr)
    n = len(cmp.regressions)
    what = f"{'/'.join(metrics)}{' relative to ' + args.relative_to if args.relative_to else ''}"
    if n:
        print(f"prefillbench: {n} of {len(cmp.entries)} row(s) regressed beyond {args.threshold:g}% ({what})", file=sys.stderr)
        return 1
    print(f"prefillbench: {len(cmp.entries)} row(s) with no regression beyond {args.threshold:g}% ({what})", file=sys.stderr)
    return 0

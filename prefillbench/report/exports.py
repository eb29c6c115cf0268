"""Exported results read back: CSV, JSON and JSON-lines exports of `run` and `capacity` into typed frames.

Every reader of an export (compare, ab, plot, traces) comes through here, so a truncated, foreign or
hand-edited file gets the same one-line reason wherever it is read.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd

from prefillbench.bench.metrics import OPTIONAL_NUMBERS, ResultRow, results_frame
from prefillbench.writers import SUFFIX_FORMATS

KEY_FIELDS = ("model", "backend", "strategy", "test", "concurrency", "chunk_size", "arrival", "rate")

_INT_FIELDS = {"n_prompt", "n_gen", "concurrency", "requests", "repetitions", "capacity_probes", "failed_requests",
               "client_workers"}
_KEY_TEXT = {"model", "backend", "strategy", "test"}
_ALL_FIELDS = {f.name: f for f in fields(ResultRow)}
# Every text column of the row read back as text (a list kept by hand missed the ones added later: kv_policy,
# deployment, ttft_by_class); the rest are numbers.
_TEXT_FIELDS = {name for name, f in _ALL_FIELDS.items() if f.type in ("str", str)} - _KEY_TEXT
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
    fmt = SUFFIX_FORMATS.get(Path(path).suffix.lower())
    if fmt == "md":
        raise InputError(f"{path}: a markdown table cannot be read back; export .csv or .json")
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
    return ResultRow(**{name: py_value(name, value) if name in OPTIONAL_NUMBERS or name in _INT_FIELDS else value
                        for name, value in record.items()})


def load_results(path: str) -> Results:
    """Rows of a CSV, JSON or JSONL export; InputError with a one-line reason otherwise."""
    frame, meta = read_frame(path)
    rows = typed_rows(frame, path)
    if rows.empty:
        raise InputError(f"{path}: no result rows")
    return Results(path, rows, meta)


def py_value(name: str, value: Any) -> Any:
    """A key cell as a plain value: int chunk sizes, None where a figure does not apply."""
    if name not in OPTIONAL_NUMBERS and name not in _INT_FIELDS:
        return value
    if pd.isna(value):
        return None
    return int(value) if name in _INT_FIELDS or name == "chunk_size" else float(value)


def row_key(row: ResultRow | dict[str, Any]) -> tuple:
    get = row.get if isinstance(row, dict) else lambda f: getattr(row, f)
    return tuple(py_value(f, get(f)) for f in KEY_FIELDS)


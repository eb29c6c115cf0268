"""Every file the tool writes goes through here: one writer per record format (csv, json, jsonl), one map from a
path's suffix to its format, one rule for numbers JSON has no word for, and atomic writes.

An export is metadata plus one or more named tables of records (a run's results; a tune's configurations and
probes). JSON writes one document, `{"metadata": ..., "<table>": [...], ...}`; JSON lines one record a line with
the metadata in each (and the table's name where there are several); CSV one file per table, the metadata a
column of every record, the first table at the path and each further one beside it as `<stem>.<table>.csv`.
Each file is replaced whole (written aside, renamed into place), so a reader, or a run killed between two
writes, never sees half of one.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

#: A path's suffix -> its format; md is for the screen (a table printer), the rest are record formats.
SUFFIX_FORMATS = {".md": "md", ".markdown": "md", ".csv": "csv", ".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl"}
RECORD_FORMATS = ("csv", "json", "jsonl")


def format_for_path(path: str | Path, allowed: tuple[str, ...] = ("md", *RECORD_FORMATS)) -> str:
    """The format a file's name asks for; ValueError in one line where it names none of `allowed`."""
    fmt = SUFFIX_FORMATS.get(Path(path).suffix.lower())
    if fmt not in allowed:
        names = [f".{f}" for f in allowed]
        names = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
        raise ValueError(f"cannot tell the format of {path} from its name: use a {names} name")
    return fmt


def plain(value: Any) -> Any:
    """`value` with only what strict JSON holds: NaN, infinities and pandas' NA as None (null), numpy scalars as
    Python numbers, tuples as lists, anything else unknown as its text. Strict parsers (jq, JSON.parse) reject NaN."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:  # numpy and torch scalars
        return plain(value.item())
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return str(value)


def json_text(doc: Any, indent: int | None = 2) -> str:
    """One strict JSON document and a newline."""
    return json.dumps(plain(doc), indent=indent, allow_nan=False) + "\n"


def jsonl_text(records: list[dict[str, Any]]) -> str:
    """Strict JSON lines: one record a line."""
    return "".join(json.dumps(plain(r), allow_nan=False) + "\n" for r in records)


def csv_text(records: list[dict[str, Any]] | pd.DataFrame) -> str:
    """CSV with a header; a missing figure is an empty cell; whole-number columns with gaps stay integers."""
    # object columns: a whole number stays one beside a missing value (a float column would write 256.0)
    frame = records if isinstance(records, pd.DataFrame) else pd.DataFrame(records, dtype=object)
    if frame.empty and not len(frame.columns):
        return ""
    return frame.to_csv(index=False, lineterminator="\n")


def _with_meta(records: list[dict[str, Any]], meta: Mapping[str, Any], **more: Any) -> list[dict[str, Any]]:
    """Each record with the run's metadata beside it; a column of the record's own keeps its value (tune's rows
    each name their SLO and their seeds, where the metadata lists every SLO and seed of the run)."""
    return [{**r, **more, **{k: v for k, v in meta.items() if k not in r and k not in more}} for r in records]


def render_export(fmt: str, meta: Mapping[str, Any], tables: Mapping[str, list[dict[str, Any]]]) -> dict[str, str]:
    """The text of each file an export in `fmt` is made of, by table name ("" for the file at the path itself)."""
    names = list(tables)
    if fmt == "json":
        return {"": json_text({"metadata": meta, **tables})}
    if fmt == "jsonl":
        many = len(names) > 1
        return {"": "".join(jsonl_text(_with_meta(tables[n], meta, **({"table": n} if many else {}))) for n in names)}
    if fmt == "csv":
        return {("" if i == 0 else n): csv_text(_with_meta(tables[n], meta)) for i, n in enumerate(names)}
    raise ValueError(f"{fmt} is not a record format ({', '.join(RECORD_FORMATS)})")


def export_paths(path: str | Path, fmt: str, table_names: list[str]) -> list[Path]:
    """The files an export at `path` is made of, the path's own first."""
    path = Path(path)
    if fmt != "csv":
        return [path]
    return [path] + [path.with_suffix(f".{n}.csv") for n in table_names[1:]]


def write_export(path: str | Path, meta: Mapping[str, Any], tables: Mapping[str, list[dict[str, Any]]],
                 fmt: str | None = None) -> list[Path]:
    """Write an export (each of its files replaced whole); the files written."""
    fmt = fmt or format_for_path(path, RECORD_FORMATS)
    written = export_paths(path, fmt, list(tables))
    for target, text in zip(written, render_export(fmt, meta, tables).values()):
        write_atomic(target, text)
    return written


def check_writable(path: str | Path) -> None:
    """ValueError with a one-line reason, now rather than after the run, when `path` cannot be written."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the folder {path.parent}: {e.strerror or e}") from None
    if path.is_dir():
        raise ValueError(f"cannot write {path}: it is a folder")
    try:
        # Permission bits do not tell (root, read-only mounts, /proc): try it.
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as e:
        raise ValueError(f"cannot write into {path.parent}: {e.strerror or e}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write text (or bytes: a PNG) via a temporary file renamed into place, so no reader sees half a file.

    An OSError names `path`, not the temporary file.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        # mkstemp makes the file private (0600); the result gets the mode any new file would.
        os.fchmod(fd, 0o666 & ~_umask())
        with (os.fdopen(fd, "wb") if isinstance(text, bytes) else os.fdopen(fd, "w", newline="")) as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from None
    except BaseException:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise

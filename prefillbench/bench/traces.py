"""Workload files: request traces, read by their own columns.

Three formats, told apart by their columns (or named with `--trace-format`):
- prefillbench's own, CSV or JSON lines: `prompt_len`, `gen_len`, optional `arrival_s` (seconds) and `class` (a
  name per request, e.g. short or long: the rows' TTFT is reported per class);
- Mooncake's (kvcache-ai/Mooncake, FAST25-release/traces), JSON lines: `timestamp` (ms from the trace's start),
  `input_length`, `output_length`, `hash_ids` (remapped hashes of the prompt's 512-token blocks: requests that
  share a prefix share its leading ids);
- Azure's LLM inference traces (Azure/AzurePublicDataset, the Splitwise paper's), CSV: `TIMESTAMP`
  (`2023-11-16 18:15:46.6805900`), `ContextTokens`, `GeneratedTokens`.

`TraceReading` says how to read one: a time scale for the arrivals, a token scale for the lengths (and the blocks,
so a prefix shared in the trace is shared after scaling), a window (the first N requests, the first S seconds of
the trace) and a length cap, whose drops are counted and said.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

#: Mooncake's traces hash 512-token blocks (its README; FAST'25 paper, appendix).
MOONCAKE_BLOCK = 512
FORMATS = ("auto", "prefillbench", "mooncake", "azure")
#: Each format's columns: prompt length, generation length, arrival (None: none).
COLUMNS = {"prefillbench": ("prompt_len", "gen_len", "arrival_s"),
           "mooncake": ("input_length", "output_length", "timestamp"),
           "azure": ("ContextTokens", "GeneratedTokens", "TIMESTAMP")}


#: The optional column naming each request's class (prefillbench's format; read from any file that has it).
CLASS_COLUMN = "class"


#: Samples shipped with the package (samples/README.md: their sources and licences), named instead of a path.
SAMPLES = {"mooncake-sample": "mooncake-synthetic-sample.jsonl", "azure-conv-sample": "azure-conv-sample.csv"}


def workload_path(name: str | Path) -> Path:
    """A path as given, or a shipped sample's file for its name (where no file of that name exists)."""
    p = Path(name)
    if not p.exists() and str(name) in SAMPLES:
        return Path(__file__).parent / "samples" / SAMPLES[str(name)]
    return p


class WorkloadError(ValueError):
    """A workload file that cannot be used: one line for the user."""


@dataclass(frozen=True)
class WorkloadFile:
    """A replayed trace: each request's prompt and generation length, its arrival if the file has one, and where
    the trace says which prompt blocks requests share (Mooncake's hash_ids), those block ids."""

    name: str
    prompt_lens: tuple[int, ...]
    gen_lens: tuple[int, ...]
    arrivals: tuple[float, ...] | None = None  # seconds from the first request
    #: Per request, the ids of its prompt's blocks of `block_size` tokens, in order; None: prompts share nothing.
    blocks: tuple[tuple[int, ...], ...] | None = None
    block_size: int = 0
    source: str = "prefillbench"  # the format it was read as
    dropped: int = 0  # requests the length cap left out
    #: Per request, its class (the `class` column, or a `mix:` workload's); None: the file names none.
    classes: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return len(self.prompt_lens)


@dataclass(frozen=True)
class TraceReading:
    """How to read a trace: its format, the scales applied, the window kept, the cap on a request's length."""

    format: str = "auto"
    time_scale: float = 1.0  # arrivals multiplied by this: 0.5 replays the trace twice as fast
    token_scale: float = 1.0  # every length (and the trace's block size) multiplied by this, at least 1 token
    first: int | None = None  # keep the first N requests (after the span, before the cap)
    span: float | None = None  # keep the requests arriving within the trace's first S seconds (its own time)
    max_len: int | None = None  # drop requests whose prompt plus generation (scaled) is longer

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"unknown trace format {self.format!r}; choose from {', '.join(FORMATS)}")
        for name in ("time_scale", "token_scale"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"--{name.replace('_', '-')} must be a number above 0, got {value:g}")
        if self.first is not None and self.first < 1:
            raise ValueError(f"--trace-first must be at least 1 request, got {self.first}")
        if self.span is not None and not self.span > 0:
            raise ValueError(f"--trace-span must be above 0 seconds, got {self.span:g}")
        if self.max_len is not None and self.max_len < 2:
            raise ValueError(f"--trace-max-len must be at least 2 tokens (a prompt token and a generated one), got {self.max_len}")

    def scaled(self, n: int) -> int:
        return max(1, round(n * self.token_scale))


def _records(path: Path, text: str) -> list[tuple[str, dict]]:
    stripped = text.lstrip()
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json") or stripped.startswith("{"):
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise WorkloadError(f"{path} line {n}: malformed JSON ({e.msg})") from None
                if not isinstance(record, dict):
                    raise WorkloadError(f"{path} line {n}: not a JSON object")
                out.append((f"{path} line {n}", record))
        return out
    reader = csv.DictReader(io.StringIO(text, newline=""))
    return [(f"{path} line {reader.line_num}", dict(record)) for record in reader]


def _detect(path: Path, where: str, record: dict) -> str:
    for name, (prompt, gen, _) in COLUMNS.items():
        if prompt in record and gen in record:
            return name
    raise WorkloadError(f"{where}: no prompt_len (a workload needs prompt_len and gen_len, Mooncake's input_length "
                        "and output_length, or Azure's ContextTokens and GeneratedTokens)")


def _count(where: str, record: dict, name: str) -> int:
    try:
        value = record[name]
    except KeyError:
        raise WorkloadError(f"{where}: no {name}") from None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise WorkloadError(f"{where}: {name} is not a number: {value!r}") from None
    if not number.is_integer() or number < 1:
        raise WorkloadError(f"{where}: {name} must be a whole number of tokens, at least 1, got {value!r}")
    return int(number)


def _seconds(where: str, fmt: str, value: object) -> float:
    """An arrival in seconds: arrival_s as is, Mooncake's ms, Azure's wall-clock timestamp (from its epoch)."""
    if fmt == "azure":
        from datetime import datetime
        text = str(value).strip()
        # Azure writes 7 fractional digits (100 ns); datetime reads at most 6.
        head, _, frac = text.partition(".")
        try:
            stamp = datetime.fromisoformat(head)
        except ValueError:
            raise WorkloadError(f"{where}: TIMESTAMP is not a date and time: {value!r}") from None
        if frac and not frac.isdigit():
            raise WorkloadError(f"{where}: TIMESTAMP is not a date and time: {value!r}")
        return stamp.timestamp() + (float(f"0.{frac}") if frac else 0.0)
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        name = COLUMNS[fmt][2]
        raise WorkloadError(f"{where}: {name} is not a number: {value!r}") from None
    if not (number >= 0 and math.isfinite(number)):
        raise WorkloadError(f"{where}: {COLUMNS[fmt][2]} cannot be negative")
    return number / 1000 if fmt == "mooncake" else number


def _hash_ids(where: str, record: dict, prompt_len: int) -> tuple[int, ...]:
    ids = record.get("hash_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise WorkloadError(f"{where}: hash_ids must be a list of whole numbers, 0 or more")
    if len(ids) < math.ceil(prompt_len / MOONCAKE_BLOCK):
        raise WorkloadError(f"{where}: {len(ids)} hash_ids cover {len(ids) * MOONCAKE_BLOCK} tokens, "
                            f"fewer than input_length {prompt_len}")
    return tuple(ids)


def _class(where: str, record: dict) -> str | None:
    """The request's class: a name (text, or a number read as its text); None where the cell is empty or absent."""
    value = record.get(CLASS_COLUMN)
    if value is None or isinstance(value, bool) or not isinstance(value, (str, int, float)):
        if value is not None:
            raise WorkloadError(f"{where}: {CLASS_COLUMN} must be a name, got {value!r}")
        return None
    name = str(value).strip()
    return name or None


def load_workload(path: str | Path, reading: TraceReading = TraceReading()) -> WorkloadFile:
    """Read a workload or trace file as `reading` says."""
    p = workload_path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"cannot read workload {path}: {getattr(e, 'strerror', None) or e}") from None
    records = _records(p, text)
    if not records:
        raise WorkloadError(f"{path}: no requests")
    fmt = reading.format if reading.format != "auto" else _detect(p, *records[0])
    prompt_col, gen_col, time_col = COLUMNS[fmt]
    rows = []
    for where, record in records:
        prompt, gen = _count(where, record, prompt_col), _count(where, record, gen_col)
        arrival = record.get(time_col)
        arrival = None if arrival in (None, "") else _seconds(where, fmt, arrival)
        ids = _hash_ids(where, record, prompt) if fmt == "mooncake" and "hash_ids" in record else None
        rows.append((prompt, gen, arrival, ids, _class(where, record)))
    timed = [r[2] is not None for r in rows]
    if any(timed) and not all(timed):
        raise WorkloadError(f"{path}: {time_col} is given for {sum(timed)} of {len(rows)} requests (all or none)")
    named = [r[4] is not None for r in rows]
    if any(named) and not all(named):
        raise WorkloadError(f"{path}: {CLASS_COLUMN} is given for {sum(named)} of {len(rows)} requests (all or none)")
    if all(timed):
        first = min(r[2] for r in rows)
        rows = [(pl, g, a - first, ids, c) for pl, g, a, ids, c in rows]
        rows.sort(key=lambda r: r[2])  # stable: a trace's ties keep their order
        if reading.span is not None:
            rows = [r for r in rows if r[2] < reading.span]
    elif reading.span is not None:
        raise WorkloadError(f"{path}: --trace-span needs arrival times, and this file has no {time_col}")
    if reading.first is not None:
        rows = rows[:reading.first]
    scaled = [(reading.scaled(pl), reading.scaled(g), a, ids, c) for pl, g, a, ids, c in rows]
    kept = [r for r in scaled if reading.max_len is None or r[0] + r[1] <= reading.max_len]
    if not kept:
        raise WorkloadError(f"{path}: no request is within --trace-max-len {reading.max_len} tokens")
    with_blocks = any(r[3] is not None for r in kept)
    if with_blocks and not all(r[3] is not None for r in kept):
        raise WorkloadError(f"{path}: hash_ids are given for some requests and not others (all or none)")
    return WorkloadFile(
        p.stem, tuple(r[0] for r in kept), tuple(r[1] for r in kept),
        tuple(r[2] * reading.time_scale for r in kept) if all(timed) else None,
        tuple(r[3] for r in kept) if with_blocks else None,
        reading.scaled(MOONCAKE_BLOCK) if with_blocks else 0,
        fmt, len(scaled) - len(kept), tuple(r[4] for r in kept) if all(named) else None)

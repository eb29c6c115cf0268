"""Per-request traces: when each request arrived and when each of its tokens appeared.

`run --export-requests FILE.jsonl` writes one JSON object per request and
repetition (and `run --export X.json[l]` writes X.requests.jsonl beside it),
so `plot` can draw TTFT and TBT distributions from the raw timings rather
than from the percentiles in the results.

Each line: the case (model, backend, strategy, test, n_prompt, n_gen,
concurrency, chunk_size, rate: the open loop's requests/s or null), `repetition`
and `request` (0-based), `prompt_len`, and `arrival`, `token_times` and
`first_scheduled` (the start of the first step that carried it) in seconds from
the start of that repetition. Where the run's steps are known (not a served
run), each gap between two tokens is traced to the steps it spanned
(bench/stalls.py): `gap_prompt_tokens`, the prompt tokens computed while it
lasted, and `gap_behind_prefill_ms`, its time in steps that computed them. Where the strategy recorded its own
state with its steps (Step.policy_values), `step_<name>` holds, for each token, the value of the step that made it
(`step_new_token_ratio` for the SGLang strategies, `step_budget` for slo-budget).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefillbench.bench.stalls import request_gaps
from prefillbench.bench.step_values import token_policy_values
from prefillbench.report.exports import InputError, json_lines, read_text
from prefillbench.writers import SUFFIX_FORMATS, jsonl_text, write_atomic

TRACE_FIELDS = ("model", "backend", "strategy", "test", "concurrency", "chunk_size", "arrival", "token_times")


def trace_path_for(export: str | Path) -> Path | None:
    """Where the per-request file goes beside a JSON/JSONL export; None for other formats."""
    p = Path(export)
    if SUFFIX_FORMATS.get(p.suffix.lower()) not in ("json", "jsonl"):
        return None
    return p.with_name(f"{p.stem}.requests.jsonl")


def trace_records(results) -> list[dict[str, Any]]:
    """One record per request per repetition of every bench.CaseResult."""
    records = []
    for result in results:
        row = result.row
        case = {
            "model": row.model,
            "backend": row.backend,
            "strategy": row.strategy,
            "test": row.test,
            "n_prompt": row.n_prompt,
            "n_gen": row.n_gen,
            "concurrency": row.concurrency,
            "chunk_size": row.chunk_size,
            "rate": row.rate,
        }
        for rep, run in enumerate(result.runs):
            stalls = request_gaps(run)
            values = token_policy_values(run)
            for i, req in enumerate(run.requests):
                records.append(
                    {
                        **case,
                        "repetition": rep,
                        "request": i,
                        "prompt_len": req.prompt_len,
                        "arrival": round(req.arrival - run.start, 7),
                        "token_times": [round(t - run.start, 7) for t in req.token_times],
                        "first_scheduled": None if req.first_scheduled is None else round(req.first_scheduled - run.start, 7),
                    }
                )
                if stalls is not None:
                    records[-1]["gap_prompt_tokens"] = [int(n) for n in stalls[i].prompt_tokens]
                    records[-1]["gap_behind_prefill_ms"] = [round(float(v), 4) for v in stalls[i].behind_ms]
                if values is not None:  # the strategy's state at each token, by the step that made it
                    records[-1].update({f"step_{name}": v for name, v in values[i].items()})
    return records


def render_traces(results) -> str:
    return jsonl_text(trace_records(results))


def export_traces(path: str | Path, results) -> None:
    write_atomic(path, render_traces(results))


@dataclass
class Trace:
    """One request's timings, in seconds from the start of its repetition."""

    model: str
    backend: str
    strategy: str
    test: str
    concurrency: int
    chunk_size: int | None
    arrival: float
    token_times: list[float]
    rate: float | None = None  # the open loop's requests/s; None: closed loop
    gap_prompt_tokens: list[float] | None = None  # per gap, the prompt tokens computed while it lasted; None: unknown

    @property
    def ttft_ms(self) -> float:
        return 1000.0 * (self.token_times[0] - self.arrival)

    @property
    def tbts_ms(self) -> list[float]:
        t = self.token_times
        return [1000.0 * (b - a) for a, b in zip(t, t[1:])]


def is_trace_record(record: Any) -> bool:
    return isinstance(record, dict) and "token_times" in record


def _trace(record: Any, where: str) -> Trace:
    if not is_trace_record(record):
        raise InputError(f"{where}: not a per-request trace (no token_times)")
    missing = [f for f in TRACE_FIELDS if f not in record]
    if missing:
        raise InputError(f"{where}: not a per-request trace (missing {', '.join(missing)})")
    try:
        times = [float(t) for t in record["token_times"]]
        chunk = record["chunk_size"]
        rate = record.get("rate")
        trace = Trace(
            str(record["model"]), str(record["backend"]), str(record["strategy"]), str(record["test"]),
            int(record["concurrency"]), None if chunk in (None, "") else int(chunk), float(record["arrival"]), times,
            None if rate in (None, "") else float(rate),
            _numbers(record.get("gap_prompt_tokens")),
        )
    except (TypeError, ValueError):
        raise InputError(f"{where}: malformed per-request record") from None
    if not times:
        raise InputError(f"{where}: a request without tokens")
    if trace.gap_prompt_tokens is not None and len(trace.gap_prompt_tokens) != len(times) - 1:
        raise InputError(f"{where}: {len(trace.gap_prompt_tokens)} gap_prompt_tokens for {len(times) - 1} gaps")
    return trace


def _numbers(values: Any) -> list[float] | None:
    return None if values is None else [float(v) for v in values]


def parse_traces(path: str, text: str) -> list[Trace]:
    traces = [_trace(record, f"{path} line {n}") for n, record in json_lines(path, text)]
    if not traces:
        raise InputError(f"{path}: no requests")
    return traces


def load_traces(path: str) -> list[Trace]:
    return parse_traces(path, read_text(path))

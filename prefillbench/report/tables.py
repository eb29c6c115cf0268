"""Printers: one per output format, all behind `render(fmt, rows, meta)`.

Reports only format; every number was computed before it got here.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from tabulate import tabulate

from prefillbench.bench.class_columns import parse_ttft_by_class
from prefillbench.bench.engine_columns import MEMORY_BINDS_PCT
from prefillbench.bench.metrics import ResultRow, host_label, results_frame, strategy_label
from strategies.compose import parse as parse_parts
from prefillbench.bench.stats import DEFAULT_NOISY_CV
from prefillbench.writers import csv_text, format_for_path, json_text, jsonl_text, write_atomic



def fmt_number(value: float, digits: int) -> str:
    # "-" where a figure does not apply, e.g. time between tokens in a pp test (one token each).
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def row_strategy_label(row: ResultRow) -> str:
    return strategy_label(row.strategy, row.chunk_size) + host_label(row.kv_host_gib)


MD_COLUMNS: list[tuple[str, Callable[[ResultRow], str], bool]] = [
    # (header, cell, right-aligned)
    ("model", lambda r: r.model, False),
    ("backend", lambda r: r.backend, False),
    ("strategy", row_strategy_label, False),
    ("test", lambda r: r.test, False),
    ("t/s", lambda r: f"{fmt_number(r.ts_mean, 3)}±{fmt_number(r.ts_std, 3)}", True),
    ("ms/t", lambda r: fmt_number(r.ms_per_token, 3), True),
    ("concurrency", lambda r: str(r.concurrency), True),
    ("throughput/s", lambda r: fmt_number(r.throughput, 2), True),
    ("TTFT p50/p99 ms", lambda r: f"{fmt_number(r.ttft_p50_ms, 1)}/{fmt_number(r.ttft_p99_ms, 1)}", True),
    ("TBT p50/p99 ms", lambda r: f"{fmt_number(r.tbt_p50_ms, 1)}/{fmt_number(r.tbt_p99_ms, 1)}", True),
]


def _rate_label(row: ResultRow) -> str:
    if row.rate is not None:
        return f"{row.arrival} {row.rate:g}" + (f" b={row.burstiness:g}" if row.burstiness is not None else "")
    return row.arrival


# An open loop's table: the load and the latencies a serving team reads; token rates stay in the exports.
OPEN_LOOP_MD_COLUMNS: list[tuple[str, Callable[[ResultRow], str], bool]] = [
    ("model", lambda r: r.model, False),
    ("backend", lambda r: r.backend, False),
    ("strategy", row_strategy_label, False),
    ("test", lambda r: r.test, False),
    ("arrival req/s", _rate_label, False),
    ("max c", lambda r: str(r.concurrency) if r.concurrency else "-", True),
    ("offered/achieved req/s", lambda r: f"{fmt_number(r.offered_rps, 2)}/{fmt_number(r.achieved_rps, 2)}", True),
    ("TTFT p50/p99 ms", lambda r: f"{fmt_number(r.ttft_p50_ms, 1)}/{fmt_number(r.ttft_p99_ms, 1)}", True),
    ("TBT p50/p99 ms", lambda r: f"{fmt_number(r.tbt_p50_ms, 1)}/{fmt_number(r.tbt_p99_ms, 1)}", True),
    ("TPOT p50 ms", lambda r: fmt_number(r.tpot_p50_ms, 1), True),
    ("E2E p50/p99 ms", lambda r: f"{fmt_number(r.e2e_p50_ms, 0)}/{fmt_number(r.e2e_p99_ms, 0)}", True),
    ("sched p50 ms", lambda r: fmt_number(r.sched_delay_p50_ms, 1), True),
]


def goodput_cell(row: ResultRow) -> str:
    if math.isnan(row.goodput_rps):
        return "-"
    return f"{row.goodput_rps:.2f} ({100 * row.slo_met:.0f}%)"


def engine_cell(row: ResultRow) -> str:
    """The engine's TTFT and inter-token p50 by its own clock; "~" where a histogram's bucket gives it."""
    if not row.engine_clock:
        return "-"
    cells = []
    for name in ("ttft", "itl"):
        p50, low, high = (getattr(row, f"engine_{name}_p50{s}_ms") for s in ("", "_low", "_high"))
        approx = "~" if not math.isnan(low) and low != high else ""
        cells.append(approx + fmt_number(p50, 1))
    return "/".join(cells)


def cv_cell(row: ResultRow, noisy_cv: float = DEFAULT_NOISY_CV) -> str:
    """The row's worst CV across repetitions, in percent, marked noisy above the threshold."""
    cv = row.cv
    if math.isnan(cv):
        return "-"
    return f"{100 * cv:.1f}%" + (" noisy" if row.noisy(noisy_cv) else "")


#: The table printers, for reading in a terminal, by -o name: tabulate's table format for each.
TABLE_FORMATS = {"md": "pipe", "grid": "rounded_outline"}
#: What -o accepts: the table printers and the record printers (below).
OUTPUT_FORMATS = (*TABLE_FORMATS, "csv", "json", "jsonl")


def md_table(columns: list[tuple[str, Callable[[Any], str], bool]], items: list[Any], fmt: str = "md") -> str:
    """A table (markdown by default) aligned for reading in a terminal: numbers right, names left."""
    return tabulate(
        [[cell(r) for _, cell, _ in columns] for r in items],
        headers=[h for h, _, _ in columns],
        tablefmt=TABLE_FORMATS[fmt],
        colalign=["right" if right else "left" for _, _, right in columns],
        disable_numparse=True,  # the cells are formatted already ("12.5±0.3", "-")
    ) + "\n"


def table_columns(rows: list[ResultRow], noisy_cv: float = DEFAULT_NOISY_CV) -> list[tuple[str, Callable[[ResultRow], str], bool]]:
    """The table's columns for these rows: the open loop's where any row has one, goodput where an SLO was given."""
    columns = OPEN_LOOP_MD_COLUMNS if any(r.arrival not in ("closed", "") for r in rows) else MD_COLUMNS
    slos = sorted({r.slo for r in rows if r.slo})
    if slos:
        columns = columns + [(f"goodput req/s (met {' | '.join(slos)})", goodput_cell, True)]
    if any(r.engine_clock for r in rows):  # a server's own clock, beside the client's
        columns = columns + [("engine TTFT/ITL p50 ms", engine_cell, True)]
        if any(not math.isnan(r.engine_queue_mean_ms) for r in rows):
            columns = columns + [("engine queue+prefill mean ms", lambda r: f"{fmt_number(r.engine_queue_mean_ms, 1)}+"
                                  f"{fmt_number(r.engine_prefill_mean_ms, 1)}", True)]
    if any(not math.isnan(r.ttft_later_turns_p50_ms) for r in rows):  # sessions: what resending the history costs
        columns = columns + [("TTFT turns 2+ p50 ms", lambda r: fmt_number(r.ttft_later_turns_p50_ms, 1), True)]
    if any(parse_ttft_by_class(r.ttft_by_class) for r in rows):  # request classes: short ones behind long?
        columns = columns + [("TTFT p99 ms by class", class_cell, True)]
    if any(not math.isnan(r.prefix_hit_rate) for r in rows):  # prefix caching: measured beside what the workload implies
        columns = columns + [("prefix hits % (implied)", prefix_cell, True)]
    if any(r.tbt_p99_behind_prefill_ms > 0 for r in rows):  # which prefill made the decodes wait (NaN: unknown)
        columns = columns + [("TBT p99 behind prefill ms (prompt t)", stall_cell, True)]
    if any(r.preemptions > 0 or r.kv_peak_pct >= MEMORY_BINDS_PCT for r in rows):  # where memory bound
        columns = columns + [("KV peak % / preempted (recomputed t)", memory_cell, True)]
    if any(r.deployment for r in rows):  # prefill apart from decode: the layout, the KV's transfer, the pools' use
        at = next(i for i, c in enumerate(columns) if c[0] == "strategy") + 1
        columns = columns[:at] + [("deployment", lambda r: r.deployment or "colocated", False)] + columns[at:]
        columns = columns + [("KV transfer p50 ms", lambda r: fmt_number(r.kv_transfer_p50_ms, 2), True),
                             ("busy P/D", busy_cell, True)]
    if any(r.client_late for r in rows):  # a row that measured its client, not the engine (bench/client_columns.py)
        columns = columns + [("send lag p99 ms", lambda r: fmt_number(r.arrival_lag_p99_ms, 1) + (" late" if r.client_late else ""),
                              True)]
    if any(getattr(r, "spec", "") for r in rows):  # speculative decoding: how much of the drafting held
        columns = columns + [("spec accept % / len / t/step", spec_cell, True)]
    if any(r.failed_requests for r in rows):  # a server's failed requests: counted, in no figure
        columns = columns + [("failed", lambda r: f"{r.failed_requests}/{r.requests * r.repetitions}", True)]
    return columns + [("CV", lambda r: cv_cell(r, noisy_cv), True)]


def spec_cell(row: ResultRow) -> str:
    """'62 / 2.9 / 2.4': the share of draft tokens accepted, the mean tokens a verify step gave a request, output
    tokens per decode step per request; '-' where nothing was drafted here (speculation off, a served run)."""
    if math.isnan(row.spec_acceptance):
        return "-"
    return (f"{100 * row.spec_acceptance:.0f} / {fmt_number(row.spec_accepted_len, 2)} / "
            f"{fmt_number(row.spec_tokens_per_step, 2)}")


def memory_cell(row: ResultRow) -> str:
    """'97 / 12 (40960)': the KV memory's peak use in %, the requests preempted (or retracted) per repetition and
    the tokens computed again for them; a server's as its engine reported them, with its capacity ('97 of 2176 t /
    6': its sampled peak, its /metrics' count); '-' where nothing was reported."""
    if not row.kv_policy and math.isnan(row.preemptions):
        return "-"
    capacity = f" of {row.kv_capacity_tokens:.0f} t" if not math.isnan(row.kv_capacity_tokens) else ""
    out = f"{fmt_number(row.kv_peak_pct, 0)}{capacity} / {fmt_number(row.preemptions, 0)}"
    return out + (f" ({row.recomputed_tokens:.0f})" if row.preemptions and not math.isnan(row.recomputed_tokens) else "")


def class_cell(row: ResultRow) -> str:
    """'short 640 / long 1403': each request class's TTFT p99 in ms, shortest prompts first; '-' where none."""
    figures = parse_ttft_by_class(row.ttft_by_class)
    if not figures:
        return "-"
    cells = []
    for name, f in figures.items():
        p99 = f.get("ttft_p99_ms") if isinstance(f, dict) else None
        p99 = float(p99) if isinstance(p99, (int, float)) else math.nan
        cells.append(f"{name} {fmt_number(p99, 0 if p99 >= 100 else 1)}")
    return " / ".join(cells)


def stall_cell(row: ResultRow) -> str:
    """'61.2 (256)': of the TBT p99, the ms spent in steps that computed prompt tokens, and how many they computed."""
    if math.isnan(row.tbt_p99_behind_prefill_ms):
        return "-"
    return f"{row.tbt_p99_behind_prefill_ms:.1f} ({row.tbt_p99_prefill_tokens:.0f})"


def busy_cell(row: ResultRow) -> str:
    """'22%/97%': the share of the run the prefill and the decode instances spent in steps."""
    if math.isnan(row.prefill_busy):
        return "-"
    return f"{100 * row.prefill_busy:.0f}%/{100 * row.decode_busy:.0f}%"


def prefix_cell(row: ResultRow) -> str:
    """'39.8 (40.0)': the share of prompt tokens the backend found cached, and the share the workload implies."""
    if math.isnan(row.prefix_hit_rate):
        return "-"
    implied = "" if math.isnan(row.prefix_hit_implied) else f" ({100 * row.prefix_hit_implied:.1f})"
    return f"{100 * row.prefix_hit_rate:.1f}{implied}"


def render_md(rows: list[ResultRow], meta: dict[str, Any], noisy_cv: float = DEFAULT_NOISY_CV, fmt: str = "md") -> str:
    return md_table(table_columns(rows, noisy_cv), rows, fmt)


def _flat(frame: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """The frame with the run's metadata as columns of every record; chunk sizes as integers."""
    flat = frame.astype({"chunk_size": "Int64"})
    # One concat, not a column at a time: a frame grown by a hundred inserts is fragmented (pandas warns).
    columns = {name: pd.Series([value] * len(flat), index=flat.index, dtype=object) for name, value in meta.items()
               if name not in flat.columns}
    flat = flat.assign(**{name: pd.Series([value] * len(flat), index=flat.index, dtype=object)
                          for name, value in meta.items() if name in flat.columns})
    return pd.concat([flat, pd.DataFrame(columns, index=flat.index)], axis=1)


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Plain Python records for json: NaN and NA as None (null)."""
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def _csv(frame: pd.DataFrame, meta: dict[str, Any], doc: dict[str, Any]) -> str:
    """CSV: the metadata a column of every record (`doc` is for the JSON document alone)."""
    return csv_text(_flat(frame, meta))


def _json(frame: pd.DataFrame, meta: dict[str, Any], doc: dict[str, Any]) -> str:
    """One JSON document: the metadata (and `doc`) beside the records."""
    return json_text({"metadata": meta, **doc, "results": _records(_flat(frame, {}))})


def _jsonl(frame: pd.DataFrame, meta: dict[str, Any], doc: dict[str, Any]) -> str:
    """JSON lines: one record a line, the metadata in each."""
    return jsonl_text(_records(_flat(frame, meta)))


#: The machine-readable printers, one per format, each given the whole frame (every field) and the metadata.
RECORD_PRINTERS: dict[str, Callable[[pd.DataFrame, dict[str, Any], dict[str, Any]], str]] = {
    "csv": _csv, "json": _json, "jsonl": _jsonl,
}


def frame_text(fmt: str, frame: pd.DataFrame, meta: dict[str, Any], **doc: Any) -> str:
    """A results frame in a record format (csv, json, jsonl); `doc`: more top-level keys of a JSON document."""
    return RECORD_PRINTERS[fmt](frame, meta, doc)


def render(fmt: str, rows: list[ResultRow], meta: dict[str, Any], noisy_cv: float = DEFAULT_NOISY_CV) -> str:
    """The rows in format `fmt`: a table printer (md, grid) shows the formatted columns, a record printer every field."""
    if fmt in TABLE_FORMATS:
        return render_md(rows, meta, noisy_cv, fmt)
    return frame_text(fmt, with_parts(results_frame(rows)), meta)


def with_parts(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with each row's scheduler parts in columns of their own, after ResultRow's (strategies/compose.py:
    rules with their settings, budget_kind fixed or slo, cadence every, interval:N or decode-rounds:N); a file read
    back keeps only ResultRow's columns, so these are for the reader."""
    parts = [parse_parts(s) for s in frame["strategy"]]
    return frame.assign(rules=[p.rules for p in parts], budget_kind=[p.budget for p in parts],
                        cadence=[p.cadence for p in parts])


def export(path: str | Path, rows: list[ResultRow], meta: dict[str, Any]) -> None:
    write_atomic(path, render(format_for_path(path), rows, meta))


VERIFY_COLUMNS: list[tuple[str, Callable[[Any], str], bool]] = [
    ("test", lambda a: a.test, False),
    ("c", lambda a: str(a.concurrency), True),
    ("strategy", lambda a: a.strategy, False),
    ("reference", lambda a: a.reference, False),
    ("positions", lambda a: str(a.positions), True),
    ("max |Δlogit|", lambda a: f"{a.max_abs_diff:.3g}", True),
    ("tolerance", lambda a: f"{a.tolerance.max_abs:g}", True),
    ("top-1 agree", lambda a: f"{a.top1_agree}/{a.confident}", True),
    ("near-tie flips", lambda a: str(a.near_ties), True),
    ("verdict", lambda a: "ok" if a.passed else "FAIL", False),
]


def render_verify(agreements: list) -> str:
    """The teacher-forced comparison (bench.LogitAgreement), one row per strategy, and what it held them to."""
    if not agreements:
        return "verify: only one strategy per test and concurrency: nothing to compare\n"
    tol = agreements[0].tolerance
    head = (f"verify: teacher-forced logits against the first strategy ({tol.basis}); top-1 must agree where "
            f"the reference's top-2 margin exceeds {tol.margin:g}\n")
    return head + md_table(VERIFY_COLUMNS, agreements)

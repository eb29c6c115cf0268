"""The capacity table: one row per strategy, its capacity and the latencies measured there."""
from __future__ import annotations

import math

from prefillbench.bench.capacity import CapacityResult, relative_capacities
from prefillbench.report.tables import fmt_number, md_table, row_strategy_label


def render_md(results: list[CapacityResult], relative_to: str | None = None) -> str:
    """One row per strategy: its capacity, the latencies measured there, and its ratio to the baseline."""
    ratios = relative_capacities(results, relative_to) if relative_to else [math.nan] * len(results)
    items = list(zip([r.row for r in results], ratios))
    columns = [
        ("model", lambda i: i[0].model, False),
        ("backend", lambda i: i[0].backend, False),
        ("strategy", lambda i: row_strategy_label(i[0]), False),
        ("test", lambda i: i[0].test, False),
        ("capacity req/s", lambda i: fmt_number(i[0].capacity_rps, 3) if i[0].capacity_rps else "0 (none passed)", True),
    ]
    if relative_to:
        columns.append((f"vs {relative_to}", lambda i: "-" if math.isnan(i[1]) else f"{i[1]:.2f}x", True))
    columns += [
        ("P99 TBT ms", lambda i: fmt_number(i[0].tbt_p99_ms, 1), True),
        ("P99 TTFT ms", lambda i: fmt_number(i[0].ttft_p99_ms, 0), True),
        ("median sched delay ms", lambda i: fmt_number(i[0].sched_delay_p50_ms, 1), True),
        ("probes", lambda i: str(i[0].capacity_probes), True),
    ]
    return md_table(columns, items)

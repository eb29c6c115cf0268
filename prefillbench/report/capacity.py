"""The capacity table: one row per strategy, its capacity and the latencies measured there, and the best choice."""
from __future__ import annotations

import math

from prefillbench.bench.capacity import CapacityResult, relative_capacities
from prefillbench.report.tables import fmt_number, md_table, row_strategy_label


def capacity_text(capacity: float, hit_bound: bool, digits: int = 3, interrupted: bool = False) -> str:
    """'5.000', '0 (none passed)', or 'at least 1048576' when every rate tried passed; '(interrupted)' after
    a search that did not finish."""
    tail = " (interrupted)" if interrupted else ""
    if not capacity:
        return "0 (none passed)" + tail
    return (f"at least {fmt_number(capacity, digits)}" if hit_bound else fmt_number(capacity, digits)) + tail


def render_md(results: list[CapacityResult], relative_to: str | None = None) -> str:
    """One row per strategy: its capacity, what limits it, the latencies measured there, and its ratio to the baseline."""
    ratios = relative_capacities(results, relative_to) if relative_to else [math.nan] * len(results)
    items = list(zip(results, ratios))
    columns = [
        ("model", lambda i: i[0].row.model, False),
        ("backend", lambda i: i[0].row.backend, False),
        ("strategy", lambda i: row_strategy_label(i[0].row), False),
        *([("deployment", lambda i: i[0].row.deployment, False)] if any(r.row.deployment for r in results) else []),
        ("test", lambda i: i[0].row.test, False),
        ("capacity req/s", lambda i: capacity_text(i[0].capacity_rps, i[0].search.hit_bound,
                                                                  interrupted=i[0].search.interrupted), True),
    ]
    if any(r.case.test.sessions is not None for r in results):  # what was searched: the rate sessions start at
        columns.insert(len(columns) - 1, ("capacity sessions/s", lambda i: capacity_text(
            i[0].capacity, i[0].search.hit_bound, interrupted=i[0].search.interrupted), True))
    if relative_to:
        columns.append((f"vs {relative_to}", lambda i: "-" if math.isnan(i[1]) else f"{i[1]:.2f}x", True))
    columns += [
        ("limited by", lambda i: i[0].search.limited_by or ("search bound" if i[0].search.hit_bound else "-"), False),
        ("P99 TBT ms", lambda i: fmt_number(i[0].row.tbt_p99_ms, 1), True),
        ("P99 TTFT ms", lambda i: fmt_number(i[0].row.ttft_p99_ms, 0), True),
        ("median sched delay ms", lambda i: fmt_number(i[0].row.sched_delay_p50_ms, 1), True),
        ("probes", lambda i: str(i[0].row.capacity_probes), True),
    ]
    return md_table(columns, items)


def best_line(results: list[CapacityResult], slo: str, precision: float, baseline: str | None = "sequential") -> str:
    """One sentence naming the best strategy, its ratio to the baseline, and those within the search's precision of it."""
    if not results:
        return "capacity: nothing finished"
    best = max(results, key=lambda r: r.capacity)
    label = lambda r: row_strategy_label(r.row)  # noqa: E731 - the row's: "as served" at a --url
    if not best.capacity:
        return f"capacity: no strategy met {slo} at any rate tried"
    text = f"best within {slo}: {label(best)}, {capacity_text(best.capacity_rps, best.search.hit_bound)} req/s"
    if best.case.test.sessions is not None:
        text += f" ({capacity_text(best.capacity, best.search.hit_bound)} sessions/s)"
    refs = [r for r in results if r.case.strategy == baseline and r is not best]
    if refs and refs[0].capacity:
        text += f", {best.capacity / refs[0].capacity:.2f}x {baseline}"
    # Within one precision step of the best, the search cannot tell them apart.
    ties = [label(r) for r in results if r is not best and r.capacity >= best.capacity / (1 + precision)]
    if ties:
        text += f"; tied within the search's {precision:.0%} precision with {', '.join(ties)}"
    if best.search.hit_bound:
        text += " (the search hit its bound: every rate tried passed)"
    return text

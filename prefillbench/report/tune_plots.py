"""tune's charts, built as `plots.Chart`s and drawn by `plots.save`:

- tune_capacity_per_budget.png: capacity against the token budget, one line per strategy that takes one,
  the others as flat reference lines;
- tune_latency_vs_load.png: the P99 TBT and P99 TTFT of every probe of the top configurations against its
  offered rate (first seed), with the SLO as a dashed line.
"""
from __future__ import annotations

from pathlib import Path

from prefillbench.bench.capacity import Criteria
from prefillbench.bench.tune import ConfigResult, by_criteria, ranked
from prefillbench.report.plots import Chart, Panel, Series, save


def capacity_chart(results: list[ConfigResult], criteria: Criteria) -> Chart:
    chosen = by_criteria(results, criteria)
    panel = Panel("capacity", "token budget (tokens per step)", "capacity (requests/s)", xlog2=True)
    budgets = sorted({r.config.budget for r in chosen if r.config.budget})
    for strategy in dict.fromkeys(r.config.strategy for r in chosen):
        rows = sorted((r for r in chosen if r.config.strategy == strategy), key=lambda r: r.config.budget or 0)
        if rows[0].config.budget is None:
            if budgets:
                panel.series.append(Series(strategy, [budgets[0], budgets[-1]], [rows[0].capacity] * 2, style="reference"))
        else:
            panel.series.append(Series(strategy, [r.config.budget for r in rows], [r.capacity for r in rows]))
    return Chart("tune_capacity_per_budget", f"Capacity per token budget within {criteria.describe()}", [panel])


def load_chart(results: list[ConfigResult], criteria: Criteria, top: int = 3) -> Chart:
    chosen = ranked(by_criteria(results, criteria))[:top]
    panels = []
    for metric, key, title in (("tbt_p99_ms", "tbt", "P99 TBT"), ("ttft_p99_ms", "ttft", "P99 TTFT")):
        panel = Panel(title, "offered load (requests/s)", f"{title} (ms)")
        rates: list[float] = []
        for r in chosen:
            first = r.searches[0].probes if r.searches else []
            points = sorted({p.rate: getattr(p.row, metric) for p in first}.items())
            rates += [x for x, _ in points]
            panel.series.append(Series(r.config.label, [x for x, _ in points], [y for _, y in points]))
        limit = criteria.limit(key)
        if limit is not None and rates:
            panel.series.append(Series(f"SLO {limit:g} ms", [min(rates), max(rates)], [limit, limit], style="reference"))
        panel.xlog = bool(rates) and max(rates) / min(rates) > 20
        panels.append(panel)
    return Chart("tune_latency_vs_load", f"Latency vs offered load, top {len(chosen)} configurations", panels)


def write(results: list[ConfigResult], criteria: Criteria, out_dir: str | Path) -> list[Path]:
    charts = [load_chart(results, criteria)]
    if any(r.config.budget for r in results):
        charts.insert(0, capacity_chart(results, criteria))
    return [save(chart, out_dir) for chart in charts]

"""The search of both designs (bench/designs.py), formatted: the best designs of each kind by goodput per GPU at the
SLO as given, the crossover as it tightens, one sentence on it, a record per design and tightness, and a chart."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from prefillbench.bench.designs import COLOCATED, DISAGGREGATED, DesignResult, best, scaled
from prefillbench.bench.metrics import SLO
from prefillbench.report.plots import Chart, Panel, Series, save
from prefillbench.report.tables import fmt_number, md_table
from prefillbench.writers import csv_text, format_for_path, json_text, jsonl_text, write_atomic

SHOWN_PER_KIND = 5


def records(results: list[DesignResult]) -> list[dict[str, Any]]:
    """One record per design and SLO scale: what it is and the goodput it sustained."""
    out = []
    for r in results:
        d = r.design
        base = {"test": r.test, "design": d.kind, "label": d.label, "strategy": d.strategy, "budget": d.budget, "gpus": d.gpus,
                "tp": d.tp if d.split is None else None, "replicas": d.replicas if d.split is None else None,
                "prefill": d.split.prefill if d.split else None, "decode": d.split.decode if d.split else None,
                "prefill_tp": d.split.prefill_tp if d.split else None,
                "decode_tp": d.split.decode_tp if d.split else None, "probes": r.probes, "error": r.error}
        for scale, goodput in (r.goodput.items() if not r.error else [(math.nan, math.nan)]):
            out.append({**base, "slo_scale": scale, "goodput_rps": goodput, "goodput_per_gpu": goodput / d.gpus})
    return out


def ranking_table(results: list[DesignResult], scale: float = 1.0) -> str:
    """Each design kind's best SHOWN_PER_KIND at the SLO as given."""
    ran = [r for r in results if not r.error]
    shown = []
    for kind in (COLOCATED, DISAGGREGATED):
        mine = sorted((r for r in ran if r.design.kind == kind), key=lambda r: -r.per_gpu(scale))
        shown += mine[:SHOWN_PER_KIND]
    columns = [("design", lambda r: r.design.kind, False), ("layout and strategy", lambda r: r.design.label, False),
               ("GPUs", lambda r: str(r.design.gpus), True),
               ("goodput req/s", lambda r: fmt_number(r.goodput.get(scale, math.nan), 2), True),
               ("per GPU", lambda r: fmt_number(r.per_gpu(scale), 3), True)]
    return md_table(columns, shown)


def crossover_rows(results: list[DesignResult], slo: SLO) -> list[dict[str, Any]]:
    scales = sorted({s for r in results for s in r.goodput})
    rows = []
    for scale in scales:
        co, dis = best(results, COLOCATED, scale), best(results, DISAGGREGATED, scale)
        a = co.per_gpu(scale) if co else math.nan
        b = dis.per_gpu(scale) if dis else math.nan
        rows.append({"scale": scale, "slo": str(scaled(slo, scale)), "colocated": co.design.label if co else "-",
                     "colocated_per_gpu": a, "disaggregated": dis.design.label if dis else "-",
                     "disaggregated_per_gpu": b,
                     # only the split meets the SLO at any rate tried: it wins without a ratio
                     "ratio": b / a if a > 0 else (math.inf if b > 0 else math.nan)})
    return rows


def _ratio_cell(row: dict[str, Any]) -> str:
    """The split's goodput per GPU over colocated's; 'split only' where no colocated design met the SLO."""
    return "split only" if math.isinf(row["ratio"]) else fmt_number(row["ratio"], 2)


def crossover_table(rows: list[dict[str, Any]]) -> str:
    columns = [("SLO x", lambda r: f"{r['scale']:g}", True), ("SLO", lambda r: r["slo"], False),
               ("best colocated", lambda r: r["colocated"], False),
               ("req/s/GPU", lambda r: fmt_number(r["colocated_per_gpu"], 3), True),
               ("best disaggregated", lambda r: r["disaggregated"], False),
               ("req/s/GPU ", lambda r: fmt_number(r["disaggregated_per_gpu"], 3), True),
               ("disagg/coloc", _ratio_cell, True)]
    return md_table(columns, rows)


def crossover_line(rows: list[dict[str, Any]]) -> str:
    """Which design wins where: 'disaggregated leads at SLO x0.5-0.75 (up to 1.31x); colocated from x1 on'."""
    def wins(r):
        return "disaggregated" if r["ratio"] > 1 else "colocated"

    known = [r for r in rows if not math.isnan(r["ratio"])]
    if not known:
        return "Crossover: no design met the SLO at any tightness tried\n"
    spans, start = [], 0
    for i in range(1, len(known) + 1):
        if i == len(known) or wins(known[i]) != wins(known[start]):
            group = known[start:i]
            lo, hi = group[0]["scale"], group[-1]["scale"]
            # how far ahead: the largest finite lead; the tightnesses where only the split met the SLO named apart
            leads = [r["ratio"] if wins(r) == "disaggregated" else 1 / r["ratio"] for r in group]
            alone = [r["scale"] for r, by in zip(group, leads) if math.isinf(by)]
            finite = [by for by in leads if not math.isinf(by)]
            where = f"x{lo:g}" if lo == hi else f"x{lo:g}-{hi:g}"
            parts = [f"alone meeting it at x{','.join(f'{a:g}' for a in alone)}"] if alone else []
            if finite:
                top = max(finite)
                parts.append("a tie within 1%" if top < 1.01 else f"up to {top:.2f}x per GPU")
            how = "; ".join(parts)
            spans.append(f"{wins(group[0])} leads at SLO {where} ({how})")
            start = i
    return "Crossover: " + "; ".join(spans) + "\n"


def by_test(results: list[DesignResult]) -> dict[str, list[DesignResult]]:
    out: dict[str, list[DesignResult]] = {}
    for r in results:
        out.setdefault(r.test, []).append(r)
    return out


def render_all(results: list[DesignResult], slo: SLO, gpus: int) -> str:
    """Each workload's tables; with several (--pg a list: prompt:output ratios), each one's crossover line last."""
    groups = by_test(results)
    text = "\n".join(render(group, slo, gpus, test if len(groups) > 1 else "") for test, group in groups.items())
    if len(groups) > 1:
        text += "\nBy workload:\n" + "".join(f"- {test}: {crossover_line(crossover_rows(group, slo))}"
                                            for test, group in groups.items())
    return text


def render(results: list[DesignResult], slo: SLO, gpus: int, test: str = "") -> str:
    rows = crossover_rows(results, slo)
    skipped = [r for r in results if r.error]
    on = f" on {test}" if test else ""
    text = f"Designs on {gpus} GPUs{on} at SLO {slo} (goodput: requests/s with the attainment met):\n\n"
    text += ranking_table(results) + "\nAs the SLO tightens (every limit times x):\n\n" + crossover_table(rows)
    text += "\n" + crossover_line(rows)
    if skipped:
        text += f"({len(skipped)} design(s) left out: {skipped[0].error.split(';')[0]})\n"
    return text


def export(path: str | Path, results: list[DesignResult], meta: dict[str, Any]) -> None:
    """csv: a record per design and scale, the metadata in each; json: the metadata beside the records; jsonl."""
    fmt, rows = format_for_path(path), records(results)
    if fmt == "csv":
        text = csv_text(pd.DataFrame([{**r, **meta} for r in rows]))
    elif fmt == "json":
        text = json_text({"metadata": meta, "designs": rows})
    else:
        text = jsonl_text([{**r, **meta} for r in rows])
    write_atomic(path, text)


def chart(results: list[DesignResult], slo: SLO, gpus: int) -> Chart:
    rows = crossover_rows(results, slo)
    panel = Panel("crossover", "SLO scale (every limit times x; lower is tighter)", "goodput per GPU (req/s)",
                  xlog=True, ymin0=True)
    for kind, key in (("best colocated", "colocated_per_gpu"), ("best disaggregated", "disaggregated_per_gpu")):
        panel.series.append(Series(kind, [r["scale"] for r in rows], [r[key] for r in rows]))
    return Chart("designs_crossover", f"Colocated against disaggregated on {gpus} GPUs, SLO {slo}", [panel])


def write_plots(results: list[DesignResult], slo: SLO, gpus: int, out_dir: str | Path) -> list[Path]:
    """One crossover chart per workload (designs_crossover.png; with several, designs_crossover_<test>.png)."""
    groups = by_test(results)
    paths = []
    for test, group in groups.items():
        c = chart(group, slo, gpus)
        if len(groups) > 1:
            c.name, c.title = f"{c.name}_{test}", f"{c.title}, {test}"
        paths.append(save(c, out_dir))
    return paths

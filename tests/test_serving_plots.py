"""plot for serving runs: latency against offered load with the SLO line, and capacity bars."""
from __future__ import annotations

import math

from prefillbench.report import plots
from prefillbench.report import tables
from prefillbench.report.exports import load_results
from prefillbench.bench.metrics import ResultRow
from rows import make_row


def row(strategy, rate=None, capacity=math.nan, chunk=None, **kw) -> ResultRow:
    base = dict(backend="sim A100", strategy=strategy, test="pp1024+tg128±90%", n_prompt=1024, n_gen=128, concurrency=0,
                chunk_size=chunk, requests=50, repetitions=1, ts_mean=1.0, ts_std=0.0, ms_per_token=1.0, throughput=1.0,
                ttft_p50_ms=1.0, ttft_p99_ms=100.0 * (rate or 1), tbt_p50_ms=1.0,
                tbt_p99_ms=(10.0 if chunk else 40.0) * (rate or 1), arrival="poisson", rate=rate, slo="tbt=100",
                capacity_rps=capacity)
    return make_row(**{**base, **kw})


def test_latency_vs_load_has_a_line_per_strategy_and_the_slo(tmp_path):
    rows = [row(s, r, chunk=c) for s, c in (("sequential", None), ("chunked", 512)) for r in (4.0, 1.0, 2.0)]
    rows.append(row("sequential", None, concurrency=4, arrival="closed", slo=""))  # a closed-loop row: not on this chart
    path = tmp_path / "sweep.csv"
    tables.export(path, rows, {})
    charts = plots.make_charts([load_results(str(path))], [])
    (chart,) = [c for c in charts if c.name.startswith("latency_vs_load")]
    tbt, ttft = chart.panels
    assert tbt.get("sequential").x == [1.0, 2.0, 4.0] and tbt.get("sequential").y == [40.0, 80.0, 160.0]
    assert tbt.get("chunked (512)").y == [10.0, 20.0, 40.0]
    slo = tbt.get("SLO 100 ms")
    assert slo.style == "reference" and slo.y == [100.0, 100.0] and slo.x == [1.0, 4.0]
    assert "SLO 100 ms" not in ttft.labels  # no TTFT SLO was given
    plots.save(chart, tmp_path)
    assert (tmp_path / f"{chart.name}.png").stat().st_size > 1000


def test_capacity_bars(tmp_path):
    rows = [row("sequential", capacity=0.8), row("chunked", capacity=2.1, chunk=512)]
    path = tmp_path / "capacity.json"
    tables.export(path, rows, {})
    charts = plots.make_charts([load_results(str(path))], [])
    assert [c.name for c in charts] == ["capacity_pp1024+tg128_90"]
    (panel,) = charts[0].panels
    assert [(s.label, s.y, s.style) for s in panel.series] == [("sequential", [0.8], "bar"), ("chunked (512)", [2.1], "bar")]
    assert "P99 TBT <= 100 ms" in charts[0].title
    plots.save(charts[0], tmp_path)
    assert (tmp_path / "capacity_pp1024+tg128_90.png").stat().st_size > 1000

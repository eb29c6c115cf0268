"""Statistics in a row: two-pass std, CV and Student-t CI across repetitions, noisy rows."""
from __future__ import annotations

import math
import statistics
from functools import partial

import pytest

from prefillbench.report import tables
from prefillbench.bench import stats
from prefillbench.report.exports import load_results
from prefillbench.engine import RequestRecord, RunRecord
from prefillbench.bench.metrics import summarize
from prefillbench.bench.workloads import TestSpec
from rows import make_row

# Two-sided 95% critical values, from any printed t table.
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
           10: 2.228, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


@pytest.mark.parametrize("df,expected", sorted(T_TABLE.items()))
def test_t_quantile_matches_the_table(df, expected):
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=6e-4)
    assert stats.t_critical(df + 1) == pytest.approx(expected, abs=6e-4)


def test_t_quantile_other_levels_and_limits():
    assert stats.t_quantile(0.95, 10) == pytest.approx(1.812, abs=6e-4)  # one-sided 95%, df 10
    assert stats.t_quantile(0.995, 5) == pytest.approx(4.032, abs=6e-4)
    assert stats.t_quantile(0.025, 4) == pytest.approx(-2.776, abs=6e-4)
    assert stats.t_quantile(0.975, 1e6) == pytest.approx(statistics.NormalDist().inv_cdf(0.975), abs=1e-4)
    assert stats.t_cdf(0.0, 3) == pytest.approx(0.5)
    assert stats.t_cdf(2.776445, 4) == pytest.approx(0.975, abs=1e-6)
    assert math.isnan(stats.t_critical(1))
    with pytest.raises(ValueError):
        stats.t_quantile(1.0, 3)


def test_two_pass_std_keeps_precision_on_large_means():
    values = [1e9 + 4, 1e9 + 7, 1e9 + 13, 1e9 + 16]
    mean, std = stats.mean_std(values)
    assert mean == 1e9 + 10
    assert std == pytest.approx(math.sqrt(30), rel=1e-12)  # a one-pass sum of squares loses this


def test_ci_and_cv():
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert stats.ci_half_width(values) == pytest.approx(2.776445 * math.sqrt(2.5) / math.sqrt(5), rel=1e-6)
    assert stats.cv(values) == pytest.approx(math.sqrt(2.5) / 3)
    assert math.isnan(stats.ci_half_width([3.0]))
    assert math.isnan(stats.cv([3.0]))
    assert stats.ci_half_width([2.0, 2.0, 2.0]) == 0.0


def test_is_noisy():
    assert stats.is_noisy([0.11, math.nan])
    assert not stats.is_noisy([0.10, 0.05])  # at the threshold is not above it
    assert not stats.is_noisy([math.nan, math.nan])
    assert stats.is_noisy([0.06], threshold=0.05)


def _run(start: float, gaps: list[float], wall_extra: float = 0.0) -> RunRecord:
    """One tg request whose tokens arrive after the given gaps."""
    times, t = [], start
    for g in gaps:
        t += g
        times.append(t)
    req = RequestRecord(prompt_len=1, arrival=start, token_times=times, tokens=[0] * len(times))
    return RunRecord(start, times[-1] + wall_extra, [req], [])


def test_summarize_cv_and_ci_come_from_the_repetitions():
    test = TestSpec(0, 4)  # tg4: 4 decode steps after the first token
    # decode time per repetition: 4 steps of 0.1, 0.2, 0.4 s -> t/s of 10, 5, 2.5
    runs = [_run(0.0, [0.01] + [d] * 4) for d in (0.1, 0.2, 0.4)]
    row = summarize(test, runs, model="m", backend="b", strategy="sequential", concurrency=1, chunk_size=None)
    rates = [10.0, 5.0, 2.5]
    assert row.repetitions == 3
    assert row.ts_mean == pytest.approx(statistics.fmean(rates))
    assert row.ts_std == pytest.approx(statistics.stdev(rates))
    assert row.ts_cv == pytest.approx(statistics.stdev(rates) / statistics.fmean(rates))
    assert row.ts_ci95 == pytest.approx(4.302653 * statistics.stdev(rates) / math.sqrt(3), rel=1e-6)
    throughputs = [4 / r.wall for r in runs]
    assert row.throughput == pytest.approx(statistics.fmean(throughputs))
    assert row.throughput_cv == pytest.approx(statistics.stdev(throughputs) / statistics.fmean(throughputs))
    assert row.throughput_ci95 == pytest.approx(4.302653 * statistics.stdev(throughputs) / math.sqrt(3), rel=1e-6)
    assert row.noisy()


def test_summarize_one_repetition_has_no_spread():
    row = summarize(TestSpec(0, 4), [_run(0.0, [0.01, 0.1, 0.1, 0.1, 0.1])], model="m", backend="b",
                    strategy="sequential", concurrency=1, chunk_size=None)
    assert row.repetitions == 1
    assert math.isnan(row.ts_cv) and math.isnan(row.ts_ci95) and math.isnan(row.throughput_ci95)
    assert not row.noisy()
    assert tables.cv_cell(row) == "-"


_row = partial(make_row, backend="b", concurrency=1, requests=1, ts_mean=100.0, ms_per_token=10.0, ttft_p50_ms=1.0,
               ttft_p99_ms=2.0, ts_cv=0.01, ts_ci95=2.0, throughput_cv=0.02, throughput_ci95=3.0)


def test_md_table_marks_noisy_rows_by_the_threshold():
    rows = [_row(strategy="sequential", throughput_cv=0.25), _row(strategy="padded", ts_cv=0.05, throughput_cv=0.04)]
    lines = tables.render("md", rows, {}).splitlines()
    assert "CV" in lines[0]
    assert lines[2].rstrip(" |").endswith("25.0% noisy")
    assert lines[3].rstrip(" |").endswith("5.0%") and "noisy" not in lines[3]
    lines = tables.render("md", rows, {}, noisy_cv=0.03).splitlines()
    assert "noisy" in lines[3]
    lines = tables.render("md", rows, {}, noisy_cv=0.30).splitlines()
    assert "noisy" not in "".join(lines)


@pytest.mark.parametrize("suffix", ["csv", "json", "jsonl"])
def test_exports_carry_the_statistics_and_read_back(tmp_path, suffix):
    rows = [_row(ts_cv=0.123, ts_ci95=4.5, throughput_cv=0.0625, throughput_ci95=7.25, repetitions=5),
            _row(strategy="chunked", chunk_size=128, ts_cv=math.nan, ts_ci95=math.nan)]
    path = tmp_path / f"r.{suffix}"
    tables.export(path, rows, {"cpu": "x"})
    text = path.read_text()
    for column in ("ts_cv", "ts_ci95", "throughput_cv", "throughput_ci95", "repetitions"):
        assert column in text
    back = load_results(str(path)).rows
    assert back[0].ts_cv == 0.123 and back[0].ts_ci95 == 4.5 and back[0].throughput_ci95 == 7.25
    assert back[0].repetitions == 5 and back[0].chunk_size is None
    assert back[1].chunk_size == 128 and math.isnan(back[1].ts_cv)

"""The verdict under a table comparing strategies, and `--relative-to`'s table (issue 28, findings 1 and 2)."""
from __future__ import annotations

import csv
import io
from functools import partial

from prefillbench import cli
from prefillbench.report import compare_tables, verdict
from rows import make_row

SIM = ["run", "--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "a100", "--no-progress", "--no-results-file"]


row = partial(make_row, ts_cv=0.01, ts_ci95=1.0, throughput_cv=0.01, throughput_ci95=1.0)


def test_batching_that_costs_latency_is_named_even_where_p99_hides_it():
    # Finding 1: at pp64 c=4 the p99 ratio is 0.98 while p50 is 1.52x; a ratio column of p99 alone hides it.
    rows = [row(), row(strategy="padded", throughput=101.0, ttft_p50_ms=152.0, ttft_p99_ms=196.0)]
    (line,) = verdict.verdict_lines(rows, "sequential")
    assert line.startswith("padded: throughput a tie")
    assert "TTFT p50 worse (1.52x)" in line
    assert "TTFT p99" not in line  # 0.98x: a tie, no claim


def test_a_ratio_whose_interval_includes_one_is_a_tie_not_a_win():
    # 1.08x is beyond 5%, but with wide intervals (CI half-widths of 10% on each row) it is no gain.
    wide = dict(throughput_ci95=10.0)
    rows = [row(**wide), row(strategy="padded", throughput=108.0, **wide)]
    ratios = verdict.case_ratios(rows, "sequential")[0].ratios
    assert ratios["throughput"].low < 1 < ratios["throughput"].high and ratios["throughput"].tie
    assert "throughput a tie (1.08x)" in verdict.verdict_lines(rows, "sequential")[0]
    # Tight intervals: the same 1.08x is a gain.
    tight = [row(), row(strategy="padded", throughput=108.0)]
    assert "throughput higher (1.08x)" in verdict.verdict_lines(tight, "sequential")[0]


def test_one_repetition_is_called_unreplicated():
    rows = [row(repetitions=1, throughput_ci95=float("nan")),
            row(strategy="chunked", chunk_size=256, repetitions=1, throughput_ci95=float("nan"), throughput=300.0)]
    text = verdict.render_verdict(rows)
    assert "unreplicated" in text and "- chunked (256): throughput higher (3.00x)" in text


def test_claims_name_where_they_hold_across_tests_and_loads():
    gains = {("pp64", 2): 1.6, ("pp64", 4): 2.0, ("pp512", 4): 1.01}
    rows = []
    for test in ("pp64", "pp512"):
        for c in (1, 2, 4):
            rows += [row(test=test, concurrency=c),
                     row(strategy="padded", test=test, concurrency=c, throughput=100.0 * gains.get((test, c), 1.0))]
    (line,) = verdict.verdict_lines(rows, "sequential")
    assert "throughput higher at pp64 c=2,4 (up to 2.00x at pp64 c=4)" in line
    assert "a tie elsewhere (1.00-1.01x)" in line and "latency a tie" in line


def test_verdict_follows_the_table_on_stdout_and_keeps_csv_clean(capsys):
    args = [*SIM, "-p", "64", "-n", "0", "-c", "4", "-s", "sequential,padded", "-r", "2"]
    assert cli.main(args) == 0
    out, _ = capsys.readouterr()
    assert out.index("Verdict against sequential at pp64 c=4") > out.index("| padded")
    assert "- padded: throughput higher" in out  # the sim batches 4 prompts of 64 tokens into one faster step
    assert cli.main([*args, "-o", "csv"]) == 0
    out, err = capsys.readouterr()
    assert len(list(csv.DictReader(io.StringIO(out)))) == 2 and "Verdict" not in out and "Verdict against" in err
    assert cli.main([*args, "--no-verdict"]) == 0
    out, err = capsys.readouterr()
    assert "Verdict" not in out + err


def test_relative_to_keeps_the_open_loop_keys_and_p50(capsys):
    # Finding 2: rate, arrival and goodput were dropped and rows read 'sequential | pp64+tg8 | 0'.
    code = cli.main([*SIM, "-p", "0", "-n", "0", "--pg", "64,8", "--arrival", "poisson", "--rate", "1,2",
                     "--slo", "tbt=50", "--requests", "8", "-s", "sequential,chunked", "--relative-to", "sequential",
                     "--no-verdict"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    header = [h.strip() for h in lines[0].strip("|").split("|")]
    assert "arrival req/s" in header and "TTFT p50/p99 ms" in header and any(h.startswith("goodput") for h in header)
    assert header[header.index("TTFT p50/p99 ms") + 1] == "/sequential"
    body = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    keys = [tuple(cells[:header.index("arrival req/s") + 1]) for cells in body]
    assert len(set(keys)) == len(keys) == 4  # every row told apart by its rate
    assert {cells[header.index("arrival req/s")] for cells in body} == {"poisson 1", "poisson 2"}
    ratio_cell = body[0][header.index("TTFT p50/p99 ms") + 1]
    assert ratio_cell == "1.000/1.000"
    assert "nan" not in out


def test_relative_to_shows_a_dash_where_a_ratio_does_not_apply():
    rows = [row(), row(strategy="padded", throughput=120.0)]
    out = compare_tables.render_relative("md", rows, {}, "sequential")
    padded = next(line for line in out.splitlines() if "padded" in line)
    assert "-/-" in padded and "1.200" in padded and "nan" not in out


def test_compare_shows_a_dash_for_a_metric_that_does_not_apply(tmp_path, capsys):
    # `compare --metric throughput,tbt_p99_ms` on prompt-only rows printed 'nan' cells.
    from prefillbench.report import tables

    rows = [row(), row(strategy="padded", throughput=120.0)]
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    tables.export(a, rows, {})
    tables.export(b, rows, {})
    assert cli.main(["compare", str(a), str(b), "--metric", "throughput,tbt_p99_ms"]) == 0
    out, err = capsys.readouterr()
    assert "nan" not in out, out[out.find("nan") - 80:out.find("nan") + 20]
    assert "| - |" in " ".join(out.split())
    assert "TBT p99: does not apply to these rows" in err

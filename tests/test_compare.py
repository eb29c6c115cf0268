"""compare: joining two exports, speedups, the regression gate, --relative-to, and bad input."""
from __future__ import annotations

import json
import math
from functools import partial

import pytest

from prefillbench import cli
from prefillbench.report import compare, compare_tables, exports
from prefillbench.report import tables
from prefillbench.bench.metrics import results_frame
from rows import make_row


row = partial(make_row, backend="gguf CPU", test="pp256+tg16", n_prompt=256, n_gen=16, tbt_p50_ms=10.0, tbt_p99_ms=20.0,
              ts_cv=0.01, ts_ci95=1.0, throughput_cv=0.01, throughput_ci95=1.0)


def write(tmp_path, name, rows, meta=None):
    path = tmp_path / name
    tables.export(path, rows, meta or {"cpu": "test"})
    return str(path)


def three(seq=100.0, pad=120.0, chunk=150.0, **kw):
    return [row(strategy="sequential", throughput=seq, **kw), row(strategy="padded", throughput=pad, **kw),
            row(strategy="chunked", chunk_size=128, throughput=chunk, **kw)]


# ---------------------------------------------------------------- the gate


@pytest.mark.parametrize("fmt", ["csv", "json", "jsonl"])
def test_same_results_pass(tmp_path, run_cli, fmt):
    a = write(tmp_path, f"a.{fmt}", three())
    b = write(tmp_path, f"b.{fmt}", three())
    code, out, err = run_cli("compare", a, b)
    assert code == 0
    lines = out.splitlines()
    assert "speedup" in lines[0] and len(lines) == 2 + 3
    assert all("1.00" in line and "| ok" in line for line in lines[2:])
    assert "throughput over 3 rows: 3 within 10% (1.00-1.00x)" in err and "3 row(s) with no regression beyond 10%" in err


def test_throughput_drop_beyond_threshold_fails(tmp_path, run_cli):
    a = write(tmp_path, "a.csv", three())
    b = write(tmp_path, "b.json", three(chunk=130.0))  # chunked: -13.3%
    code, out, err = run_cli("compare", a, b)
    assert code == 1
    chunked = next(line for line in out.splitlines() if "chunked" in line)
    assert "REGRESSION" in chunked and "0.87" in chunked
    assert sum("REGRESSION" in line for line in out.splitlines()) == 1
    assert "1 of 3 row(s) regressed beyond 10%" in err
    assert run_cli("compare", a, b, "--threshold", "15")[0] == 0
    assert run_cli("compare", a, b, "--threshold", "15%")[0] == 0


def test_threshold_is_strict_and_improvements_pass(tmp_path, run_cli):
    a = write(tmp_path, "a.csv", three())
    assert run_cli("compare", a, write(tmp_path, "b.csv", three(seq=90.0)))[0] == 0  # exactly 10% is not beyond
    assert run_cli("compare", a, write(tmp_path, "c.csv", three(seq=89.0)))[0] == 1
    assert run_cli("compare", a, write(tmp_path, "d.csv", three(seq=500.0, pad=500.0, chunk=500.0)))[0] == 0


def test_latency_metrics_are_worse_when_higher():
    base = exports.Results("a", [row(tbt_p99_ms=20.0, ttft_p99_ms=200.0)])
    worse = exports.Results("b", [row(tbt_p99_ms=23.0, ttft_p99_ms=150.0)])
    cmp = compare.compare(base, worse, ["tbt_p99_ms", "ttft_p99_ms", "throughput"], threshold=10)
    (entry,) = cmp.entries
    assert entry.regressed == ["tbt_p99_ms"]
    assert entry.speedup["tbt_p99_ms"] == pytest.approx(20 / 23)
    assert entry.speedup["ttft_p99_ms"] == pytest.approx(200 / 150)
    assert entry.speedup["throughput"] == pytest.approx(1.0)


def test_metric_option_selects_what_is_gated(tmp_path, run_cli):
    a = write(tmp_path, "a.csv", [row()])
    b = write(tmp_path, "b.csv", [row(tbt_p99_ms=40.0)])
    assert run_cli("compare", a, b)[0] == 0  # default: throughput only
    code, out, _ = run_cli("compare", a, b, "--metric", "throughput,tbt_p99_ms")
    assert code == 1
    assert "TBT p99 ms base" in out.splitlines()[0] and "throughput/s base" in out.splitlines()[0]
    assert run_cli("compare", a, b, "--metric", "throughput", "--metric", "tbt_p99_ms")[0] == 1


def test_join_is_on_chunk_size_and_concurrency(tmp_path, run_cli):
    base = [row(strategy="chunked", chunk_size=64, throughput=100.0), row(strategy="chunked", chunk_size=256, throughput=200.0),
            row(concurrency=1, throughput=10.0)]
    cur = [row(strategy="chunked", chunk_size=256, throughput=200.0), row(strategy="chunked", chunk_size=64, throughput=100.0),
           row(concurrency=2, throughput=1.0)]
    cmp = compare.compare(exports.Results("a", base), exports.Results("b", cur))
    assert sorted(e.fields["chunk_size"] for e in cmp.entries) == [64, 256]
    assert all(e.speedup["throughput"] == 1.0 for e in cmp.entries)
    assert len(cmp.only_base) == 1 and len(cmp.only_current) == 1
    code, _, err = run_cli("compare", write(tmp_path, "a.csv", base), write(tmp_path, "b.csv", cur))
    assert code == 0
    assert "1 row(s) only in" in err


def test_noisy_rows_are_marked(tmp_path, run_cli):
    a = write(tmp_path, "a.csv", [row(throughput_cv=0.3)])
    b = write(tmp_path, "b.csv", [row()])
    code, out, _ = run_cli("compare", a, b)
    assert code == 0 and "ok (noisy)" in out
    assert "noisy" not in run_cli("compare", a, b, "--noisy-cv", "50")[1]


def test_machine_readable_output(tmp_path, run_cli):
    a = write(tmp_path, "a.csv", three())
    b = write(tmp_path, "b.csv", three(chunk=100.0))
    code, out, _ = run_cli("compare", a, b, "-o", "json")
    assert code == 1
    doc = json.loads(out)
    chunked = next(r for r in doc["rows"] if r["strategy"] == "chunked")
    assert chunked["throughput_base"] == 150.0 and chunked["throughput_current"] == 100.0
    assert chunked["regressed"] == "throughput"


# ---------------------------------------------------------------- relative


def test_relative_ratios_survive_a_slower_machine(tmp_path, run_cli):
    a = write(tmp_path, "a.csv", three(seq=100.0, pad=120.0, chunk=150.0))
    b = write(tmp_path, "b.csv", three(seq=50.0, pad=60.0, chunk=75.0))  # everything twice as slow
    assert run_cli("compare", a, b)[0] == 1  # absolute: a regression everywhere
    code, out, _ = run_cli("compare", a, b, "--relative-to", "sequential")
    assert code == 0
    lines = out.splitlines()
    assert "throughput/sequential base" in lines[0]
    assert len(lines) == 2 + 2  # the reference rows themselves are not compared
    assert not any("| sequential" in line for line in lines[2:])
    chunked = next(line for line in lines if "chunked" in line)
    assert "1.500" in chunked and "1.00" in chunked


def test_relative_regression_is_caught(tmp_path, run_cli):
    a = write(tmp_path, "a.csv", three(seq=100.0, chunk=150.0))
    b = write(tmp_path, "b.csv", three(seq=100.0, chunk=120.0))  # chunked/sequential 1.5 -> 1.2: 20% worse
    code, out, _ = run_cli("compare", a, b, "--relative-to", "sequential")
    assert code == 1
    assert "REGRESSION" in next(line for line in out.splitlines() if "chunked" in line)
    assert "REGRESSION" not in next(line for line in out.splitlines() if "padded" in line)


def test_relative_ratios_are_per_test_and_concurrency():
    rows = [row(strategy="sequential", concurrency=1, throughput=10.0), row(strategy="sequential", concurrency=4, throughput=40.0),
            row(strategy="chunked", chunk_size=64, concurrency=1, throughput=20.0),
            row(strategy="chunked", chunk_size=64, concurrency=4, throughput=60.0),
            row(strategy="chunked", chunk_size=64, concurrency=4, test="tg16", throughput=5.0)]
    rels = compare.relative_frame(results_frame(rows), "sequential", ["throughput"])
    assert list(rels["throughput"][:4]) == [1.0, 1.0, 2.0, 1.5]
    assert not rels["has_ref"][4] and math.isnan(rels["throughput"][4])


def test_relative_to_a_swept_strategy_matches_chunk_size():
    rows = [row(strategy="chunked", chunk_size=64, throughput=10.0), row(strategy="chunked", chunk_size=128, throughput=20.0),
            row(strategy="sequential", throughput=5.0)]
    rels = compare.relative_frame(results_frame(rows), "chunked", ["throughput"])
    assert rels["throughput"][0] == 1.0 and rels["throughput"][1] == 1.0
    assert not rels["has_ref"][2]  # ambiguous: which chunk size?


def test_relative_to_a_missing_strategy_is_unusable(tmp_path, run_cli):
    a = write(tmp_path, "a.csv", three())
    code, _, err = run_cli("compare", a, a, "--relative-to", "nosuch")
    assert code == 2 and "no nosuch rows" in err and err.count("\n") == 1


def test_run_table_relative_to(capsys):
    rows = three(seq=100.0, pad=120.0, chunk=150.0)
    out = compare_tables.render_relative("md", rows, {}, "sequential")
    lines = out.splitlines()
    assert "/sequential" in lines[0]
    assert "1.500" in next(line for line in lines if "chunked" in line)
    assert "1.200" in next(line for line in lines if "padded" in line)
    records = [json.loads(line) for line in compare_tables.render_relative("jsonl", rows, {"cpu": "x"}, "sequential").splitlines()]
    assert [r["throughput_vs_sequential"] for r in records] == [1.0, 1.2, 1.5]
    assert records[0]["cpu"] == "x"


def test_run_relative_to_needs_a_strategy_that_runs(capsys):
    assert cli.main(["run", "-s", "chunked,padded", "--relative-to", "sequential", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--relative-to sequential" in err and err.count("\n") == 1


# ---------------------------------------------------------------- unusable input


def _bad_files(tmp_path):
    good_csv = tables.render("csv", three(), {"cpu": "x"})
    good_json = tables.render("json", three(), {"cpu": "x"})
    files = {
        "empty.csv": "",
        "blank.json": "\n  \n",
        "truncated.json": good_json[: len(good_json) // 2],
        "truncated.csv": good_csv[: good_csv.rindex(",") - 3],
        "truncated.jsonl": tables.render("jsonl", three(), {})[:-40],
        "header-only.csv": good_csv.splitlines()[0] + "\n",
        "foreign.csv": "name,age\nann,3\n",
        "foreign.json": json.dumps({"hello": [1, 2]}),
        "foreign-results.json": json.dumps({"results": [{"a": 1}]}),
        "nonnumeric.csv": good_csv.replace(",100.0,", ",fast,", 1),
        "table.md": tables.render("md", three(), {}),
        "trace.requests.jsonl": json.dumps({"model": "m", "arrival": 0.0, "token_times": [0.1]}) + "\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "binary.csv").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    (tmp_path / "adir.csv").mkdir()
    return [str(tmp_path / n) for n in [*files, "binary.csv", "adir.csv", "missing.csv"]]


def test_unusable_files_exit_2_with_one_line(tmp_path, run_cli):
    good = write(tmp_path, "good.csv", three())
    for bad in _bad_files(tmp_path):
        for argv in ([bad, good], [good, bad]):
            code, out, err = run_cli("compare", *argv)
            assert code == 2, (bad, err)
            assert err.startswith("prefillbench: error: ") and err.count("\n") == 1, (bad, err)
            assert bad.rsplit("/", 1)[1] in err, (bad, err)
            assert out == ""


def test_some_reasons_are_specific(tmp_path):
    paths = {p.rsplit("/", 1)[1]: p for p in _bad_files(tmp_path)}
    reasons = {
        "empty.csv": "empty",
        "truncated.json": "truncated or malformed JSON",
        "truncated.csv": "truncated row",
        "header-only.csv": "no result rows",
        "foreign.csv": "not a prefillbench results file",
        "nonnumeric.csv": "not a number",
        "table.md": "markdown",
        "trace.requests.jsonl": "per-request trace",
        "binary.csv": "not a text file",
        "missing.csv": "no such file",
    }
    for name, reason in reasons.items():
        with pytest.raises(exports.InputError, match=reason):
            exports.load_results(paths[name])


def test_no_rows_in_common_exit_2(tmp_path, run_cli):
    a = write(tmp_path, "a.csv", three())
    b = write(tmp_path, "b.csv", three(test="tg16", concurrency=1))
    code, _, err = run_cli("compare", a, b)
    assert code == 2 and "no rows in common" in err and "test pp256+tg16 vs tg16" in err
    assert err.count("\n") == 1


def test_different_models_exit_2(tmp_path, run_cli):
    a = write(tmp_path, "a.csv", three(model="SmolLM2"))
    b = write(tmp_path, "b.csv", three(model="Qwen"))
    code, _, err = run_cli("compare", a, b)
    assert code == 2 and "different models" in err and "SmolLM2" in err and "Qwen" in err


def test_duplicate_rows_in_one_file_exit_2(tmp_path, run_cli):
    a = write(tmp_path, "a.csv", three() + three())
    code, _, err = run_cli("compare", a, write(tmp_path, "b.csv", three()))
    assert code == 2 and "two rows" in err


def test_older_exports_without_statistics_still_load(tmp_path):
    text = tables.render("csv", three(), {})
    header, *lines = text.splitlines()
    keep = [i for i, c in enumerate(header.split(",")) if c not in ("ts_cv", "ts_ci95", "throughput_cv", "throughput_ci95")]
    old = "\n".join(",".join(l.split(",")[i] for i in keep) for l in [header, *lines]) + "\n"
    (tmp_path / "old.csv").write_text(old)
    rows = exports.load_results(str(tmp_path / "old.csv")).rows
    assert len(rows) == 3 and math.isnan(rows[0].ts_cv) and rows[2].chunk_size == 128


FIXTURE = __import__("pathlib").Path(__file__).parent / "fixtures" / "baseline-ci-v0.1.csv"


def test_a_csv_written_by_the_previous_version_still_loads_and_compares(tmp_path, run_cli):
    # results/baseline-ci.csv as `make bench-ci-baseline` wrote it before the pandas loader (no serving columns).
    old = exports.load_results(str(FIXTURE))
    assert len(old.rows) == 6 and {r.strategy for r in old.rows} == {"sequential", "padded", "chunked"}
    assert all(r.arrival == "closed" and r.rate is None and math.isnan(r.goodput_rps) for r in old.rows)
    assert old.meta["backend_name"] == "gguf"
    code, out, err = run_cli("compare", str(FIXTURE), str(FIXTURE), "--relative-to", "sequential")
    assert code == 0 and "row(s) with no regression beyond 10%" in err
    current = write(tmp_path, "now.json", old.rows)  # the current writer, read back beside the old file
    assert run_cli("compare", str(FIXTURE), current)[0] == 0


# ---------------------------------------------------------------- words, setups, backends (issue 28, finding 9)


def test_words_match_the_numbers(tmp_path, run_cli):
    # A 1.68x change was reported as "1 row(s) within 10%".
    a = write(tmp_path, "a.csv", [row(throughput=100.0)])
    b = write(tmp_path, "b.csv", [row(throughput=168.0)])
    code, _, err = run_cli("compare", a, b)
    assert code == 0
    assert "throughput 1.68x faster: improvement beyond the 10% threshold" in err and "within 10%" not in err
    code, _, err = run_cli("compare", b, a)
    assert code == 1 and "throughput 1.68x slower: regression beyond the 10% threshold" in err
    code, _, err = run_cli("compare", a, b, "--metric", "ttft_p99_ms", "--no-verdict")
    assert code == 0 and "TTFT p99" not in err


def test_many_rows_are_counted_by_what_they_did(tmp_path, run_cli):
    a = write(tmp_path, "a.csv", three())
    b = write(tmp_path, "b.csv", three(seq=100.0, pad=240.0, chunk=120.0))  # padded 2x, chunked 0.8x
    code, _, err = run_cli("compare", a, b)
    assert code == 1
    assert ("throughput over 3 rows: 1 improved beyond 10% (most: 2.00x faster, m gguf CPU padded pp256+tg16 c=4), "
            "1 regressed beyond 10% (most: 1.25x slower, m gguf CPU chunked (128) pp256+tg16 c=4), 1 within 10% (1.00-1.00x)") in err


def test_a_difference_in_dtype_or_threads_is_named(tmp_path, run_cli):
    a = write(tmp_path, "a.json", three(backend="torch CPU"), {"dtype": "float32", "threads": 2})
    b = write(tmp_path, "b.json", three(backend="torch CPU"), {"dtype": "bfloat16", "threads": 2})
    _, _, err = run_cli("compare", a, b)
    assert "the runs differ in dtype float32 vs bfloat16" in err and "threads" not in err
    c = write(tmp_path, "c.csv", three(backend="torch CPU"), {"dtype": "float32", "threads": 1})
    assert "threads 2 vs 1" in run_cli("compare", a, c)[2]


def test_two_backends_on_the_same_model_and_tests_are_compared_as_such(tmp_path, run_cli):
    # gguf against torch was refused with "no rows in common".
    a = write(tmp_path, "a.csv", three())
    b = write(tmp_path, "b.csv", three(backend="torch CPU", seq=50.0, pad=60.0, chunk=75.0)
              + [row(strategy="sequential", test="tg16", backend="torch CPU")])
    code, out, err = run_cli("compare", a, b, "--relative-to", "sequential")
    assert code == 0, err
    assert "cross-backend comparison, gguf CPU vs torch CPU on the 2 row(s) both ran" in err
    assert sum("gguf CPU vs torch CPU" in line for line in out.splitlines()) == 2

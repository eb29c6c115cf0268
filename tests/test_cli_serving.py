"""run's arrival, workload and SLO flags and the capacity command, end to end on the sim and a tiny checkpoint."""
from __future__ import annotations

import csv
import io
import json

import pytest


SIM = ["--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "a100", "--no-progress"]
RUN = ["run", *SIM, "--no-results-file"]
CAPACITY = ["capacity", *SIM]


def test_a_rate_sweep_gives_a_row_per_strategy_and_rate(run_cli, tmp_path):
    export = tmp_path / "sweep.csv"
    code, out, err = run_cli(*RUN, "--arrival", "poisson", "--rate", "0.5,1", "--rate", "2", "--pg", "256,32",
                             "--slo", "tbt=200", "--requests", "12", "-s", "sequential,padded,chunked", "-o", "csv",
                             "--export", str(export))
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    # --pg alone in an open loop: no pp512 and tg128 tests; one repetition, no concurrency cap by default.
    assert {r["test"] for r in rows} == {"pp256+tg32"}
    assert [(r["strategy"], float(r["rate"])) for r in rows] == [
        (s, rate) for s in ("sequential", "padded", "chunked") for rate in (0.5, 1.0, 2.0)]
    assert all(r["arrival"] == "poisson" and r["slo"] == "tbt=200" and r["concurrency"] == "0" for r in rows)
    assert all(r["repetitions"] == "1" and r["requests"] == "12" for r in rows)
    assert all(0 <= float(r["slo_met"]) <= 1 and float(r["goodput_rps"]) > 0 for r in rows)
    saved = list(csv.DictReader(export.open()))
    assert saved[0]["seed"] == "42" and saved[0]["len_spread"] == "0.0"


def test_the_open_loop_table_is_readable(run_cli):
    code, out, err = run_cli(*RUN, "--arrival", "gamma", "--burstiness", "0.5", "--rate", "2", "--pg", "256,32",
                             "--slo", "tbt=200,ttft=500", "--requests", "8", "-s", "chunked", "-c", "4")
    assert code == 0, err
    header, _, line = out.strip().splitlines()
    for column in ("arrival req/s", "max c", "offered/achieved req/s", "TPOT p50 ms", "sched p50 ms",
                   "goodput req/s (met ttft=500,tbt=200)"):
        assert column in header
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[4] == "gamma 2 b=0.5" and cells[5] == "4"


def test_a_workload_file_replays_lengths_and_arrivals(run_cli, tmp_path):
    trace = tmp_path / "chat.jsonl"
    trace.write_text("".join(json.dumps({"prompt_len": p, "gen_len": g, "arrival_s": t}) + "\n"
                             for p, g, t in [(300, 20, 10.0), (900, 5, 10.2), (120, 40, 13.0)]))
    code, out, err = run_cli(*RUN, "--workload", str(trace), "-s", "sequential,chunked", "-o", "json")
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert [(r["test"], r["arrival"], r["requests"]) for r in rows] == [("chat", "trace", 3)] * 2
    assert rows[0]["offered_rps"] == pytest.approx(2 / 3.0)


def test_len_spread_names_the_test(run_cli):
    code, out, err = run_cli(*RUN, "--pg", "256,32", "--len-spread", "0.5", "-c", "2", "-s", "chunked", "-o", "csv")
    assert code == 0, err
    assert {r["test"] for r in csv.DictReader(io.StringIO(out))} >= {"pp256+tg32±50%", "pp512±50%"}


@pytest.mark.parametrize("argv, message", [
    (["--rate", "1"], "--rate needs --arrival poisson or gamma"),
    (["--arrival", "poisson"], "needs --rate"),
    (["--arrival", "uniform", "--rate", "1"], "choose from closed, poisson, gamma"),
    (["--arrival", "poisson", "--rate", "1,fast"], "comma-separated list of numbers"),
    (["--arrival", "gamma", "--rate", "1", "--burstiness", "0"], "burstiness"),
    (["--slo", "tbt=soon"], "not a number"),
    (["--slo", "p99=3"], "KEY=MS"),
    (["--len-spread", "1.5"], "spread"),
    (["--workload", "/no/such/file.csv"], "cannot read workload"),
    (["--workload", "w.csv", "--pg", "8,2"], "drop -p, -n, --pg"),
])
def test_bad_serving_flags_are_one_line_and_exit_2(run_cli, argv, message):
    code, out, err = run_cli(*RUN, *argv)
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1].startswith("prefillbench: error:") and message in err, err


def test_capacity_prints_a_row_per_strategy_with_its_ratio(run_cli, tmp_path):
    export = tmp_path / "cap.json"
    code, out, err = run_cli(*CAPACITY, "--pg", "1024,64", "--len-spread", "0.9", "--slo", "tbt=100", "--chunk-size", "512",
                             "-s", "sequential,chunked", "--relative-to", "sequential", "--requests", "40",
                             "--precision", "20", "--export", str(export))
    assert code == 0, err
    lines = out.strip().splitlines()
    assert "capacity req/s" in lines[0] and "vs sequential" in lines[0] and "probes" in lines[0]
    assert "sequential" in lines[2] and "1.00x" in lines[2] and "chunked (512)" in lines[3]
    assert "capacity: sequential at 1 req/s: P99 TBT" in err and "capacity: chunked (512) at 1 req/s" in err  # every probe
    doc = json.loads(export.read_text())
    seq, chunked = doc["results"]
    assert chunked["capacity_rps"] > seq["capacity_rps"] > 0 and seq["rate"] is None
    assert seq["capacity_probes"] >= 3 and seq["tbt_p99_ms"] <= 100
    assert doc["metadata"]["capacity_tbt_p99_ms"] == 100 and doc["metadata"]["capacity_requests_per_probe"] == 40
    assert doc["metadata"]["seed"] == 42


def test_a_ttft_limit_beside_the_tbt_one_binds_capacitys_search(run_cli, tmp_path):
    """--slo tbt=100,ttft=T: the capacity is a rate whose TTFT p99 is within T too (the search read the TTFT limit
    for goodput alone and passed rates that broke it)."""
    found = {}
    for slo in ("tbt=100", "tbt=100,ttft=400"):
        export = tmp_path / f"{slo.replace(',', '_').replace('=', '')}.json"
        code, out, err = run_cli(*CAPACITY, "--pg", "1024,64", "--len-spread", "0.9", "--slo", slo, "--chunk-size",
                                 "512", "-s", "chunked", "--requests", "40", "--precision", "20", "--export", str(export))
        assert code == 0, err
        found[slo] = json.loads(export.read_text())["results"][0]
    tbt_only, both = found["tbt=100"], found["tbt=100,ttft=400"]
    assert tbt_only["ttft_p99_ms"] > 400  # the premise: the TBT limit alone lets the TTFT p99 past 400 ms
    assert both["ttft_p99_ms"] <= 400 and both["tbt_p99_ms"] <= 100
    assert both["capacity_rps"] < tbt_only["capacity_rps"]


@pytest.mark.parametrize("argv, message", [
    ([], "needs --slo tbt=MS"),
    (["--slo", "ttft=100"], "needs --slo tbt=MS"),
    (["--slo", "tbt=100", "--relative-to", "padded", "-s", "chunked"], "not among the strategies"),
    (["--slo", "tbt=100", "--requests", "1"], "at least 2"),
    (["--slo", "tbt=100", "--pg", "8,2", "--pg", "16,2"], "one --pg"),
    (["--slo", "tbt=100", "--max-queue-growth", "0"], "--max-queue-growth is a percentage above 0"),
])
def test_bad_capacity_flags_are_one_line_and_exit_2(run_cli, argv, message):
    code, out, err = run_cli(*CAPACITY, *argv)
    assert code == 2 and out == ""
    assert message in err and err.strip().splitlines()[-1].startswith("prefillbench: error:"), err

"""tune and capacity end to end on the sim: the ranked table, the verdict, exports and plots; capacity's bound,
limit column, best line and Ctrl-C; bad input in one line with exit 2."""
from __future__ import annotations

import json

import pytest

from prefillbench.bench import capacity

SIM = ["--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "a100", "--no-progress"]
SMALL = ["--pg", "1024,64", "--len-spread", "0.9", "--requests", "40", "--repeats", "1", "--precision", "20"]


def test_tune_on_the_sim_ranks_chunked_above_sequential_and_exports_every_probe(run_cli, tmp_path):
    export, plots = tmp_path / "tune.json", tmp_path / "plots"
    code, out, err = run_cli("tune", *SIM, *SMALL, "--slo", "tbt=100", "-s", "sequential,chunked",
                             "--chunk-size", "256:512:x2", "--export", str(export), "--plot", str(plots))
    assert code == 0, err
    lines = out.strip().splitlines()
    assert "capacity req/s" in lines[0] and "limited by" in lines[0] and "vs sequential" in lines[0]
    table = [line for line in lines if line.startswith("|")][2:]
    assert len(table) == 3 and "chunked" in table[0] and "sequential" in table[-1]
    assert lines[-1].startswith("best within TBT p99 <= 100 ms: chunked, budget ") and "x sequential" in lines[-1]
    doc = json.loads(export.read_text())
    configs, probes = doc["configurations"], doc["probes"]
    assert len(configs) == 3 and sum(c["probes"] for c in configs) == len(probes)
    for c in configs:
        # The reported latencies are those of a probe at exactly the capacity.
        at = [p for p in probes if p["strategy"] == c["strategy"] and p["budget"] == c["budget"]
              and p["rate"] == c["capacity_rps"] and p["passed"]]
        assert at and at[0]["tbt_p99_ms"] == c["tbt_p99_ms"]
    assert {p.name for p in plots.iterdir()} == {"tune_capacity_per_budget.png", "tune_latency_vs_load.png"}
    assert f"wrote {export}" in err


def test_a_sim_grid_of_eight_or_more_halves_and_its_export_keeps_what_was_dropped(run_cli, tmp_path):
    """Successive halving (bench/halving.py) on a plain grid: the budget of 128 is far under the best on short probes
    (a chunk too small to keep up), so it is dropped, named on stderr with its short capacity, left out of the table
    and kept in the export as stage "short"; --full-grid searches all nine; the baseline is kept however low."""
    argv = ["--backend", "sim", "--sim-model", "llama-3.1-8b", "--sim-gpu", "h100", "--no-progress", "--pg", "512,64",
            "--slo", "tbt=50", "-s", "sequential,chunked,vllm-v1", "--chunk-size", "128,512,2048,4096", "--requests", "80",
            "--repeats", "1", "--precision", "20"]
    export = tmp_path / "t.json"
    code, out, err = run_cli("tune", *argv, "--export", str(export))
    assert code == 0, err
    said = next(line for line in err.splitlines() if "successive halving" in line)
    assert "2 of 9 configurations dropped" in said and "chunked (128)" in said and "vllm-v1 (128)" in said
    table = [line for line in out.splitlines() if line.startswith("|")][2:]
    assert len(table) == 7 and "(128)" not in out and "sequential" in table[-1]
    stages = {(c["strategy"], c["budget"]): c["stage"] for c in json.loads(export.read_text())["configurations"]}
    assert len(stages) == 9 and {k for k, v in stages.items() if v == "short"} == {("chunked", 128), ("vllm-v1", 128)}
    code, out, err = run_cli("tune", *argv, "--full-grid")
    assert code == 0 and "successive halving" not in err
    assert len([line for line in out.splitlines() if line.startswith("|")][2:]) == 9


def test_tune_with_a_list_of_slos_prints_capacity_against_the_slo(run_cli):
    code, out, err = run_cli("tune", *SIM, *SMALL, "--slo", "tbt=50,200", "-s", "sequential,chunked",
                             "--chunk-size", "512")
    assert code == 0, err
    assert "TBT p99 <= 50 ms:" in out and "TBT p99 <= 200 ms:" in out
    vs = out[out.index("capacity (req/s) against the SLO"):].splitlines()
    assert "TBT p99 <= 50 ms" in vs[1] and "TBT p99 <= 200 ms" in vs[1]
    seq = [line for line in vs if line.startswith("| sequential")][0]
    strict, loose = (float(v) for v in seq.strip("|").split("|")[1:3])
    assert loose >= strict > 0


@pytest.mark.parametrize("argv, message", [
    ([], "needs --slo"),
    (["--slo", "tbt=50,100,ttft=1,2"], "only one SLO key"),
    (["--slo", "tbt=100", "--chunk-size", "512:64:x2"], "bad budget range"),
    (["--slo", "tbt=100", "--precision", "100"], "percentage"),
    (["--slo", "tbt=100", "-s", "fifo"], "unknown strategy"),
    (["--slo", "tbt=100", "--repeats", "0"], "--repeats"),
    (["--slo", "tbt=100", "--export", "x.xml"], "use a .csv, .json or .jsonl name"),
    (["--slo", "tbt=100", "--no-sim", "--sim-only"], "exclude each other"),
    (["--slo", "tbt=100", "--max-queue-growth", "0"], "--max-queue-growth"),
])
def test_bad_tune_input_is_one_line_and_exit_2(run_cli, argv, message):
    code, out, err = run_cli("tune", *SIM, *argv)
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1].startswith("prefillbench: error:") and message in err, err


def test_capacity_says_when_the_search_hit_its_bound_and_names_the_limit_and_the_best(run_cli):
    code, out, err = run_cli("capacity", *SIM, "--pg", "64,4", "--slo", "tbt=1e9", "-s", "sequential",
                             "--requests", "4", "--max-sched-delay", "1e12", "--max-queue-growth", "1e12")
    assert code == 0, err
    assert "at least 1048576" in out and "search bound" in out
    assert "(the search hit its bound" in out.strip().splitlines()[-1]
    code, out, err = run_cli("capacity", *SIM, "--pg", "1024,64", "--len-spread", "0.9", "--slo", "tbt=100",
                             "-s", "sequential,chunked", "--chunk-size", "512", "--requests", "40", "--precision", "20")
    assert code == 0, err
    assert "limited by" in out.splitlines()[0]
    seq = [line for line in out.splitlines() if line.startswith("| mistral-7b") and "| sequential " in line][0]
    assert "| TBT " in seq
    assert out.strip().splitlines()[-1].startswith("best within TBT p99 <= 100 ms: chunked (512)")


def test_capacity_precision_is_a_percentage(run_cli):
    code, out, err = run_cli("capacity", *SIM, "--slo", "tbt=100", "--precision", "100")
    assert code == 2 and "a percentage of the capacity between 0 and 100 (5 means 5%), got 100" in err


def test_capacity_relative_to_help_is_whole(run_cli):
    code, out, err = run_cli("capacity", "--help")
    text = " ".join(out.replace("│", " ").split())  # rich wraps the help inside a box
    assert "show each capacity's ratio to this strategy's capacity" in text


def test_ctrl_c_during_capacity_keeps_the_finished_probes(run_cli, monkeypatch):
    real = capacity.probe_case
    calls = []

    def probe_then_interrupt(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(capacity, "probe_case", probe_then_interrupt)
    code, out, err = run_cli("capacity", *SIM, "--pg", "256,16", "--slo", "tbt=100", "-s", "sequential",
                             "--requests", "20")
    assert code == 130
    assert "(interrupted)" in out and "interrupted; kept 1 capacity row(s)" in err
    row = [line for line in out.splitlines() if "| sequential " in line][0]
    assert row.rstrip("|").split("|")[-1].strip() == "2"  # both finished probes


def test_run_tune_on_a_real_backend_predicts_on_the_calibrated_sim_then_measures_its_top_k(tmp_path, use_backend):
    """The command's sim-first path: a calibration file, the sim's grid, then the top K and sequential measured."""
    import dataclasses
    import io

    from prefillbench.backends.fake import FakeBackend
    from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
    from prefillbench.commands.tune import TuneOptions, run_tune

    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"fitted": {"compute_fraction": 1.0, "memory_fraction": 1.0, "step_overhead_s": 0.0},
                               "model": dataclasses.asdict(load_model_spec("mistral-7b")),
                               "gpu": dataclasses.asdict(load_gpu_spec("a100"))}))
    out, err = io.StringIO(), io.StringIO()
    # A real backend's flags, loading the fake one in its place.
    use_backend(lambda *args, **kwargs: FakeBackend(0.0005, 0.01))
    options = TuneOptions.from_flags(backend="torch", pg=[(256, 8)], strategy=["sequential", "chunked"], chunk_size=[64, 128],
                                     slo="tbt=100", requests=20, precision=20.0, top_k=1, calibration=str(cal),
                                     no_progress=True, no_warmup=True, export=str(tmp_path / "t.json"), out=out, err=err,
                                     verbose=True)
    assert run_tune(options) == 0, err.getvalue()
    text, log = out.getvalue(), err.getvalue()
    assert "measuring the sim's top 1 and sequential on fake CPU" in log
    assert "sim req/s" in text and "sim error" in text and "sim against measurement:" in text
    assert "sim 10% slower" in text  # how sure: the picks again on the sim with every step 10% longer
    assert "their steps by kind against the calibration's price: chunked (" in text and "prompt + decodes" in text
    doc = json.loads((tmp_path / "t.json").read_text())
    priced = [p for p in doc["probes"] if p["stage"] == "measured"]
    assert priced and all(p["busy_prompt_s"] + p["busy_mixed_s"] + p["busy_decode_s"] == pytest.approx(p["busy_s"])
                          for p in priced)
    stages = {(c["stage"], c["strategy"], c["budget"]) for c in doc["configurations"]}
    grid = {("sequential", None), ("chunked", 64), ("chunked", 128)}
    assert {s[1:] for s in stages if s[0] == "sim"} == grid
    assert {s[1:] for s in stages if s[0] == "sim 10% slower"} == grid  # the whole grid again, slowed
    measured = {s[1:] for s in stages if s[0] == "measured"}
    assert len(measured) == 2 and ("sequential", None) in measured  # the sim's pick and the baseline
    slowed = {(c["strategy"], c["budget"]): c["capacity_rps"] for c in doc["configurations"] if c["stage"] == "sim 10% slower"}
    pick = (measured - {("sequential", None)}).pop()
    assert slowed[pick] == max(v for k, v in slowed.items() if k[0] == "chunked")  # the pick keeps the most slowed


@pytest.mark.parametrize("command", ["capacity", "tune"])
def test_capacity_and_tune_search_a_workload_without_pg(run_cli, tmp_path, command):
    trace = tmp_path / "trace.csv"
    trace.write_text("prompt_len,gen_len\n200,20\n300,30\n250,10\n")
    extra = ["--repeats", "1", "--chunk-size", "256"] if command == "tune" else []
    code, out, err = run_cli(command, *SIM, "--workload", str(trace), "--slo", "tbt=100", "-s", "sequential",
                             "--requests", "3", *extra)
    assert code == 0, err
    assert "best within TBT p99 <= 100 ms: sequential" in out


def test_a_csv_export_of_several_slos_names_each_rows_own(run_cli, tmp_path):
    """The run's metadata (every SLO, every seed) goes beside each record; a record's own column keeps its value."""
    import pandas as pd

    export = tmp_path / "tune.csv"
    code, out, err = run_cli("tune", *SIM, *SMALL, "--slo", "tbt=100,200", "-s", "chunked", "--chunk-size", "512",
                             "--export", str(export))
    assert code == 0, err
    frame = pd.read_csv(export)
    assert sorted(frame["slo"]) == ["TBT p99 <= 100 ms", "TBT p99 <= 200 ms"]
    assert list(frame["seeds"]) == [1, 1]  # this record's searches, not the run's list of seeds

"""The measuring session shared by run, capacity and tune: every export is written as results finish (a run killed
with SIGKILL leaves what it finished, parseable), carries the same provenance, and is strict JSON; a failing
backend in tune's measured stage keeps the sim's grid and the finished probes. All through the real command
line, on the hidden `--backend fake`."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from prefillbench.backends.fake import FAIL_AT_VARIABLE, KILL_AT_VARIABLE, FakeBackend
from prefillbench.writers import json_text, jsonl_text, plain

ROOT = Path(__file__).resolve().parents[1]
RUN = ["run", "--backend", "fake", "-p", "0", "-n", "0", "--pg", "32,4", "-c", "2", "-r", "1", "-s",
       "sequential,chunked,padded", "--chunk-size", "8", "--no-progress", "--no-results-file", "--no-verdict"]
CAPACITY = ["capacity", "--backend", "fake", "--pg", "32,4", "--slo", "tbt=100", "-s", "sequential,chunked",
            "--chunk-size", "16", "--requests", "10", "--precision", "30", "--no-progress"]
PROVENANCE = ("git_commit", "git_dirty", "command", "cpu", "timestamp", "prefillbench_version", "backend_name")


def strict_json(text: str):
    """json.loads that refuses NaN and infinities, as jq and JSON.parse do."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def strict_jsonl(text: str) -> list:
    return [strict_json(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def calibration(tmp_path) -> Path:
    """A calibration that prices the sim at the nominal A100 speed for mistral-7b: enough for tune's sim stage
    to pick configurations for the fake backend to measure."""
    from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec

    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"fitted": {"compute_fraction": 1.0, "memory_fraction": 1.0, "step_overhead_s": 0.0},
                               "model": dataclasses.asdict(load_model_spec("mistral-7b")),
                               "gpu": dataclasses.asdict(load_gpu_spec("a100"))}))
    return cal


def tune_args(calibration: Path, export: Path) -> list[str]:
    return ["tune", "--backend", "fake", "--calibration", str(calibration), "--pg", "256,8", "-s",
            "sequential,chunked", "--chunk-size", "64,128", "--slo", "tbt=100", "--requests", "20", "--precision",
            "20", "--top-k", "1", "--no-warmup", "--no-progress", "--export", str(export)]


def count_steps(monkeypatch, run_cli, *argv: str) -> int:
    """How many steps the fake backend executes for this command line (it is deterministic)."""
    counted = []
    real = FakeBackend.execute
    monkeypatch.setattr(FakeBackend, "execute", lambda self, *a, **k: counted.append(1) or real(self, *a, **k))
    code, out, err = run_cli(*argv)
    assert code == 0, err
    monkeypatch.setattr(FakeBackend, "execute", real)
    return len(counted)


def killed_at(step: int, argv: list[str]) -> subprocess.CompletedProcess:
    """The command in a process of its own, SIGKILLed by the fake backend at its `step`th step."""
    env = {**os.environ, KILL_AT_VARIABLE: str(step), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "prefillbench", *argv], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    return done


# ---------------------------------------------------------------- killed midway


def test_a_run_killed_in_its_last_case_leaves_every_finished_case_in_each_file(monkeypatch, run_cli, tmp_path):
    full = tmp_path / "full.json"
    total = count_steps(monkeypatch, run_cli, *RUN, "--export", str(full))
    expected = strict_json(full.read_text())["results"]
    assert len(expected) == 3
    for suffix in ("json", "csv", "jsonl"):
        export = tmp_path / f"killed.{suffix}"
        killed_at(total, [*RUN, "--export", str(export)])
        if suffix == "csv":
            kept = pd.read_csv(export).to_dict("records")
        elif suffix == "json":
            kept = strict_json(export.read_text())["results"]
        else:
            kept = strict_jsonl(export.read_text())
        # the first two cases, whole, as the full run measured them (the fake's clock is virtual)
        assert [r["strategy"] for r in kept] == ["sequential", "chunked"]
        assert [r["throughput"] for r in kept] == pytest.approx([r["throughput"] for r in expected[:2]])
    traces = strict_jsonl((tmp_path / "killed.requests.jsonl").read_text())
    assert {t["strategy"] for t in traces} == {"sequential", "chunked"}  # the request traces too
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left beside them


def test_capacity_killed_midway_keeps_the_finished_search_and_the_probes_so_far(monkeypatch, run_cli, tmp_path):
    full = tmp_path / "full.json"
    total = count_steps(monkeypatch, run_cli, *CAPACITY, "--export", str(full))
    finished = strict_json(full.read_text())["results"]
    export = tmp_path / "killed.json"
    killed_at(total, [*CAPACITY, "--export", str(export)])
    kept = strict_json(export.read_text())["results"]
    assert [r["strategy"] for r in kept] == ["sequential", "chunked"]
    assert kept[0] == finished[0]  # the finished search, as the full run found it
    assert kept[1]["capacity_probes"] < finished[1]["capacity_probes"]  # the one under way: its probes so far


def test_tune_killed_while_measuring_keeps_the_sim_grid_and_the_measured_probes(monkeypatch, run_cli, tmp_path, calibration):
    full = tmp_path / "full.json"
    total = count_steps(monkeypatch, run_cli, *tune_args(calibration, full))
    export = tmp_path / "killed.json"
    killed_at(total, tune_args(calibration, export))
    doc = strict_json(export.read_text())
    assert all(doc["metadata"].get(k) is not None for k in PROVENANCE if k != "git_dirty")
    stages = [c["stage"] for c in doc["configurations"]]
    assert stages.count("sim") == 3 and stages.count("sim 10% slower") == 3  # the whole grid, both sim stages
    measured = [p for p in doc["probes"] if p["stage"] == "measured"]
    everything = [p for p in strict_json(full.read_text())["probes"] if p["stage"] == "measured"]
    assert 0 < len(measured) < len(everything)  # every probe that finished, none that did not
    key = ("strategy", "budget", "seed", "rate", "passed", "tbt_p99_ms")
    assert {tuple(p[k] for k in key) for p in measured} < {tuple(p[k] for k in key) for p in everything}


# ---------------------------------------------------------------- a failing backend


def test_a_failing_backend_in_tunes_measured_stage_exits_2_in_one_line_and_keeps_what_finished(
        monkeypatch, run_cli, tmp_path, calibration):
    full = tmp_path / "full.json"
    total = count_steps(monkeypatch, run_cli, *tune_args(calibration, full))
    monkeypatch.setenv(FAIL_AT_VARIABLE, str(total - 1))
    export = tmp_path / "failed.json"
    code, out, err = run_cli(*tune_args(calibration, export))
    assert code == 2
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and "fake failure at step" in errors[0] and "kept" in errors[0]
    assert "Traceback" not in err
    assert "rank | configuration" in out and "best within" in out  # the table of what is known
    doc = strict_json(export.read_text())
    stages = [c["stage"] for c in doc["configurations"]]
    assert stages.count("sim") == 3 and "measured" in stages
    assert [p for p in doc["probes"] if p["stage"] == "measured"]


def test_a_failing_step_in_run_keeps_the_finished_cases_and_exits_2(monkeypatch, run_cli, tmp_path):
    export = tmp_path / "r.csv"
    total = count_steps(monkeypatch, run_cli, *RUN, "--export", str(export))
    monkeypatch.setenv(FAIL_AT_VARIABLE, str(total))
    code, out, err = run_cli(*RUN, "--export", str(export))
    assert code == 2 and "fake failure" in err and "kept 2 measured row(s)" in err
    assert list(pd.read_csv(export)["strategy"]) == ["sequential", "chunked"]
    assert "sequential" in out and "chunked" in out  # the table of what finished


# ---------------------------------------------------------------- provenance and strict JSON


@pytest.mark.parametrize("command", ["run", "capacity", "tune"])
def test_every_measuring_commands_export_carries_the_same_provenance(run_cli, tmp_path, calibration, command):
    export = tmp_path / "e.json"
    argv = {"run": [*RUN, "--export", str(export)], "capacity": [*CAPACITY, "--export", str(export)],
            "tune": tune_args(calibration, export)}[command]
    code, out, err = run_cli(*argv)
    assert code == 0, err
    meta = strict_json(export.read_text())["metadata"]
    from prefillbench.meta import git_commit
    assert meta["git_commit"] == git_commit() and meta["backend_name"] == "fake"
    assert meta["command"].startswith("prefillbench") and isinstance(meta["git_dirty"], (bool, type(None)))
    assert all(k in meta for k in PROVENANCE)


def test_the_json_rule_turns_nan_and_infinities_into_null_everywhere():
    doc = {"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": {"d": float("nan")}, "e": (1, 2), "f": pd.NA}
    assert strict_json(json_text(doc)) == {"a": None, "b": [None, None, 1.5], "c": {"d": None}, "e": [1, 2], "f": None}
    assert strict_jsonl(jsonl_text([doc, {"x": 1}]))[1] == {"x": 1}
    import numpy as np
    assert plain(np.float32(np.nan)) is None and plain(np.int64(3)) == 3


def test_tune_and_compare_json_on_the_sim_are_strict_json(run_cli, tmp_path):
    # The example: sequential never meets TBT 50 ms, so its capacity's figures are NaN.
    export = tmp_path / "t.json"
    code, out, err = run_cli("tune", "--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "h100", "--pg",
                             "2000,200", "--slo", "tbt=50", "-s", "sequential,sarathi-serve", "--chunk-size", "256",
                             "--requests", "40", "--repeats", "1", "--no-progress", "--export", str(export), "-o", "json")
    assert code == 0, err
    doc = strict_json(export.read_text())
    assert any(v is None for c in doc["configurations"] for v in c.values())  # the NaN figures, as null
    strict_json(out[out.index("["):])  # -o json on stdout too
    trace = tmp_path / "sim-trace.jsonl"
    runs = []
    for name in ("a", "b"):
        runs.append(tmp_path / f"{name}.json")
        code, _, err = run_cli("run", "--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "h100", "-p", "0",
                               "-n", "0", "--pg", "512,16", "-c", "2", "-s", "sequential,chunked", "--no-progress",
                               "--no-results-file", "--export", str(runs[-1]), "--trace", str(trace))
        assert code == 0, err
    strict_jsonl(trace.read_text())
    strict_jsonl((tmp_path / "a.requests.jsonl").read_text())
    code, out, err = run_cli("compare", str(runs[0]), str(runs[1]), "-o", "json")
    assert code == 0, err
    strict_json(out)

"""The sim through the command line: tables, traces, pipelines and calibration."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


from prefillbench.cli import main
from strategies import STRATEGIES

ROOT = Path(__file__).resolve().parent.parent


def test_run_sim_prints_a_table():
    out = subprocess.run(
        [sys.executable, "-m", "prefillbench", "run", "--backend", "sim", "--sim-model", "llama-13b", "--sim-gpu", "a6000",
         "-p", "1024", "-n", "0", "-c", "1,2", "-r", "1", "--no-results-file"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| llama-13b")]
    # every strategy by default but slo-budget (it needs --slo), x 2 concurrencies
    assert len(rows) == sum(not c.needs_price for c in STRATEGIES.values()) * 2
    assert all("sim A6000" in r for r in rows)
    assert "roofline model of" in out.stderr and "measured curves)" in out.stderr  # the default on an A6000


def test_trace_has_a_breakdown_per_step(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    assert main(["run", "--backend", "sim", "--pg", "300,4", "-p", "0", "-n", "0", "-c", "2", "-r", "1", "-s", "chunked",
                 "--no-warmup", "--no-results-file", "--no-progress", "--trace", str(trace)]) == 0
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    assert steps and all(abs(sum(op["ms"] for op in s["ops"].values()) - 1e3 * s["seconds"]) < 1e-6 for s in steps)
    assert any(s["decode_contexts"] and s["prefill_chunks"] for s in steps)


def test_pipeline_run_reports_bubbles(tmp_path, capsys):
    export = tmp_path / "out.json"
    assert main(["run", "--backend", "sim", "--sim-model", "gpt3-175b", "--sim-gpu", "a100", "--tp", "8", "--pp", "8",
                 "--pg", "512,8", "-p", "0", "-n", "0", "-c", "16", "-r", "1", "-s", "chunked", "--no-results-file",
                 "--no-progress", "--export", str(export)]) == 0
    captured = capsys.readouterr()
    assert "sim 64xA100-SXM TP8 PP8" in captured.out
    assert "median bubble" in captured.err and "stage busy" in captured.err
    meta = json.loads(export.read_text())["metadata"]
    assert meta["sim_pp"] == 8 and len(meta["sim_stage_busy"].split(",")) == 8


def test_kv_capacity_clamps_concurrency(capsys):
    assert main(["run", "--backend", "sim", "-p", "1024", "-n", "0", "-c", "64", "-r", "1", "-s", "chunked",
                 "--no-results-file", "--no-progress"]) == 0
    assert "only 29 of 64 sequences fit in A6000's KV cache" in capsys.readouterr().err

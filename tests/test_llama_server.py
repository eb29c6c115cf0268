"""llama.cpp's own server (`--backend llama-server`), built from the installed llama-cpp-python's llama.cpp (`make
server`, which `make test` runs first), on the shipped model: rows with TTFT and TBT, the same tokens a greedy
gguf run makes, the metadata, and no server left."""
from __future__ import annotations

import json
import subprocess

import pytest
from processes import session_processes

from prefillbench.backends.server.build import llama_tool

TARGET = ["run", "--backend", "llama-server", "--pg", "64,8", "-p", "0", "-n", "0", "-c", "1,4", "-s", "sarathi-serve",
          "--chunk-size", "16,64", "-r", "1", "--no-progress", "--no-results-file", "--no-verdict"]


def servers() -> list[str]:
    return session_processes(lambda args: args.split(" ")[0].endswith("llama-server"))


def test_the_server_binary_is_built_from_the_installed_llama_cpp():
    binary = llama_tool("llama-server")
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    assert "version" in (out.stdout + out.stderr).lower()


def test_llama_server_runs_the_issue_workload_and_leaves_no_server(run_cli, tmp_path):
    export = tmp_path / "s.json"
    code, out, err = run_cli(*TARGET, "--export", str(export))
    assert code == 0, err
    doc = json.loads(export.read_text())
    rows = doc["results"]
    assert [(r["chunk_size"], r["concurrency"]) for r in rows] == [(16, 1), (64, 1), (16, 4), (64, 4)]
    for r in rows:
        assert r["failed_requests"] == 0 and r["ttft_p50_ms"] > 0 and r["tbt_p50_ms"] > 0
    meta = doc["metadata"]
    assert meta["server_engine"] == "llama-server" and "-b 64" in meta["server_command"]
    assert "--poll 0" in meta["server_command"] and meta["server_version"]
    # the same llama.cpp kernels as the gguf backend on this CPU: extra buffer types off where it keeps them off
    from prefillbench.backends.llama_kernels import extra_buffers

    on, why = extra_buffers()
    assert meta["llama_extra_buffers"] == why and ("--no-repack" in meta["server_command"]) is (not on)
    assert not servers()


def test_sequential_on_llama_server_is_refused_in_one_line(run_cli):
    code, out, err = run_cli("run", "--backend", "llama-server", "-s", "sequential", "--pg", "64,8", "-p", "0", "-n", "0")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "llama-server cannot run sequential" in err


def test_a_budget_below_the_requests_in_flight_launches_as_many_slots_as_the_budget(run_cli, tmp_path):
    # llama.cpp asserts at load when -np is above -b (one output row a slot in every batch): 6 requests in flight at
    # budget 4 launch 4 slots, every request is served (the rest wait in the server's queue), and the row says so.
    export = tmp_path / "s.json"
    code, out, err = run_cli("run", "--backend", "llama-server", "-s", "sarathi-serve", "--chunk-size", "4",
                             "--pg", "16,4", "-p", "0", "-n", "0", "-c", "6", "-r", "1", "--export", str(export))
    assert code == 0, err
    doc = json.loads(export.read_text())
    (row,) = doc["results"]
    assert row["failed_requests"] == 0 and row["concurrency"] == 6
    meta = doc["metadata"]
    assert "-np 4 " in meta["server_command"] and "-b 4" in meta["server_command"] and meta["server_slots"] == 4
    assert "4 slots for 6 requests in flight" in meta["server_slots_capped"] and "4 slots for 6" in err
    assert not servers()


def test_url_on_a_llama_server_started_by_hand_without_metrics_keeps_its_rows(run_cli, tmp_path):
    """The new user's report (issue 57): llama-server started by hand, no --metrics (its /metrics answers 501), then
    --url. Rows come back with the client's clock, the engine's /metrics columns empty, llama-server's own per-token
    timings still beside them, and one line saying why; exit 0, no traceback."""
    from prefillbench.backends.server.process import ServerProcess, free_port
    from prefillbench.models import default_model_path

    port = free_port()
    argv = [str(llama_tool("llama-server")), "-m", default_model_path(), "--port", str(port), "-np", "4", "-c",
            "4096", "-t", "2"]
    server = ServerProcess(argv, f"http://127.0.0.1:{port}/health")
    server.start()
    try:
        export = tmp_path / "u.json"
        code, out, err = run_cli("run", "--backend", "server", "--url", f"http://127.0.0.1:{port}", "-p", "0", "-n",
                                 "0", "--pg", "64,8", "-c", "1,2", "-r", "1", "--no-progress", "--no-results-file",
                                 "--export", str(export))
    finally:
        server.stop()
    assert code == 0, err
    assert "Traceback" not in err
    rows = json.loads(export.read_text())["results"]
    assert [r["concurrency"] for r in rows] == [1, 2] and all(r["ttft_p50_ms"] > 0 for r in rows)
    for r in rows:  # no /metrics: its columns stay empty; the per-token timings llama-server streams remain
        assert r["engine_clock"] == "per-token timings" and r["engine_net_ms"] is None  # NaN, exported as null
    notes = [line for line in err.splitlines() if "/metrics" in line]
    assert len(notes) == 1 and "answered HTTP 501" in notes[0] and "no engine clock" in notes[0]
    assert not servers()

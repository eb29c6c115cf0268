"""The host tier's size as a grid dimension (--kv-host-cache A,B,...; 0: none): run, capacity and tune run one
configuration per size, each row and export naming its size; bad sizes refused in one line."""
from __future__ import annotations

import json
import math

import pytest

from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.specs import SimConfigError

SIM = ["--backend", "sim", "--sim-model", "llama-3.1-8b", "--sim-gpu", "h100", "--no-progress"]
MOONCAKE = ["--workload", "mooncake-sample", "--trace-max-len", "131000", "--trace-first", "60"]
SLO = ["--slo", "tbt=200,ttft=10000"]


def test_a_sized_copy_leaves_the_loaded_backend_as_it_was():
    loaded = SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h100", prefix_cache="on")
    sized = loaded.with_kv_host_cache(128)
    assert sized is not loaded and sized.kv_host_gib == 128 and loaded.kv_host_gib is None
    assert sized.host_tier(16)[0] == loaded.with_kv_host_cache(128).host_tier(16)[0] > 0
    assert loaded.host_tier(16) is None
    assert loaded.with_kv_host_cache(0) is loaded  # 0: none, as loaded
    assert sized.with_kv_host_cache(0).kv_host_gib is None
    with pytest.raises(SimConfigError, match="--dp 1"):
        SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h100", dp=2).with_kv_host_cache(64)


def test_capacity_searches_each_host_tier_size_and_each_row_names_its_own(run_cli, tmp_path):
    export = tmp_path / "cap.json"
    code, out, err = run_cli("capacity", *SIM, *MOONCAKE, "-s", "vllm-v1", "--chunk-size", "2048", *SLO,
                             "--kv-host-cache", "0,128", "--export", str(export))
    assert code == 0, err
    table = [line for line in out.splitlines() if line.startswith("| llama")]
    assert len(table) == 2 and "vllm-v1 (2048), no host tier" in table[0] and "vllm-v1 (2048), host 128 GiB" in table[1]
    assert "capacity: vllm-v1 (2048), host 128 GiB at " in err  # the progress lines name the size too
    rows = json.loads(export.read_text())["results"]
    none, hosted = sorted(rows, key=lambda r: r["kv_host_gib"])
    assert none["kv_host_gib"] == 0 and hosted["kv_host_gib"] == 128
    # the size reached the engine's memory: only the hosted search loaded blocks from the host
    assert none["host_hit_tokens"] is None or math.isnan(none["host_hit_tokens"])
    assert hosted["host_hit_tokens"] > 0 and hosted["host_load_s"] > 0


def test_tune_puts_the_host_tier_beside_the_budget_and_the_verdict_names_the_size(run_cli, tmp_path):
    export = tmp_path / "tune.csv"
    code, out, err = run_cli("tune", *SIM, *MOONCAKE, "-s", "vllm-v1", "--chunk-size", "1024,2048", *SLO,
                             "--kv-host-cache", "0,128", "--repeats", "1", "--precision", "10", "--export", str(export))
    assert code == 0, err
    lines = out.strip().splitlines()
    assert "host tier GiB" in lines[0]
    table = [line for line in lines if line.startswith("|")][2:]
    assert len(table) == 4
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    assert sorted(c[2] for c in cells) == ["-", "-", "128", "128"]
    best = lines[-1]
    assert best.startswith("best within TBT p99 <= 200 ms, TTFT p99 <= 10000 ms: vllm-v1, budget ")
    assert (", host 128 GiB:" in best) == (cells[0][2] == "128")
    import pandas as pd

    frame = pd.read_csv(export)
    assert sorted(frame["kv_host_gib"]) == [0, 0, 128, 128]
    assert sorted(zip(frame["budget"], frame["kv_host_gib"])) == [(1024, 0), (1024, 128), (2048, 0), (2048, 128)]


def test_run_runs_one_row_per_host_tier_size(run_cli):
    code, out, err = run_cli("run", "--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "a100", "--no-progress",
                             "--workload", "sessions:n=16,turns=3,system=1024,message=256,answer=32,think=1",
                             "--arrival", "poisson", "--rate", "4", "-s", "vllm-v1", "--chunk-size", "512",
                             "--prefix-cache", "on", "--kv-cache-tokens", "6000", "-r", "1", "--kv-host-cache", "0,4",
                             "-o", "json")
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert [r["kv_host_gib"] for r in rows] == [0, 4]
    assert rows[1]["host_hit_tokens"] > 0 and rows[1]["prefix_hit_rate"] > rows[0]["prefix_hit_rate"]


@pytest.mark.parametrize("flags, message", [
    (["--kv-host-cache", "-1"], "a host tier's size is 0 (none) or more GiB, got -1"),
    (["--kv-host-cache", "64,64"], "a size is listed twice: 64,64"),
    (["--kv-host-cache", "64,x"], "expected a comma-separated list of sizes in GiB"),
    (["--kv-host-cache", "0,64", "--dp", "2"], "--kv-host-cache: the sim prices a host tier with one pipeline stage"),
])
def test_a_bad_host_tier_size_is_one_line_and_exit_2(run_cli, flags, message):
    code, out, err = run_cli("capacity", *SIM, "--pg", "512,64", "--slo", "tbt=100", *flags)
    assert code == 2 and message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error" in line.lower()]) == 1


def test_a_grid_of_sizes_on_a_backend_without_a_host_tier_is_refused(run_cli):
    code, out, err = run_cli("run", "--backend", "gguf", "-p", "16", "-n", "0", "--kv-host-cache", "0,64")
    assert code == 2 and "a grid of host-tier sizes runs on the sim; the gguf backend has no host tier" in err


def test_a_halved_grid_on_a_trace_replays_the_whole_trace_in_its_short_round(run_cli):
    """Successive halving's short round on a trace: its rows are the workload (a short round of fewer requests gave
    the trace's prompts too few arrival times and failed), only the precision and the seeds shrink."""
    code, out, err = run_cli("tune", *SIM, *MOONCAKE, "-s", "vllm-v1", "--chunk-size", "512,1024,2048,4096", *SLO,
                             "--kv-host-cache", "0,128", "--repeats", "1")
    assert code == 0, err
    assert "successive halving" in err and "on short probes (60 requests each" in err


def test_the_hicache_write_policy_reaches_sglangs_tier_and_vllm_names_it_ignored(run_cli):
    """--hicache-write-policy: SGLang's HiCache writes as the flag says (write-back writes only what the GPU evicts,
    so a small tier keeps more histories than write-through's copies of what is still on the GPU); vllm-v1's
    connector stores every block, and says it ignores the flag."""
    base = ["run", "--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "a100", "--no-progress",
            "--workload", "sessions:n=16,turns=3,system=1024,message=256,answer=32,think=1", "--arrival", "poisson",
            "--rate", "4", "--chunk-size", "512", "--prefix-cache", "on", "--kv-cache-tokens", "6000", "-r", "1",
            "--kv-host-cache", "1", "-o", "json"]
    hits = {}
    for policy in ("write_through", "write_back"):
        code, out, err = run_cli(*base, "-s", "sglang", "--hicache-write-policy", policy)
        assert code == 0, err
        hits[policy] = json.loads(out)["results"][0]["host_hit_tokens"]
    assert hits["write_back"] > hits["write_through"] > 0
    code, out, err = run_cli(*base, "-s", "vllm-v1", "--hicache-write-policy", "write_back")
    assert code == 0 and "--hicache-write-policy write_back ignored by vllm-v1" in err

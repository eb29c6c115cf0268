"""Tensor parallelism under torchrun: 2 CPU processes on gloo compute what one process computes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from prefillbench.backends import load_backend
from prefillbench.backends.base import BackendError
from prefillbench.backends.distributed import check_heads_divide, launch_hint
from prefillbench.backends.torch.backend import TorchBackend
from tiny_models import tiny_config, tiny_model
from tp_worker import CASES, run_cases

TESTS = Path(__file__).parent
ROOT = TESTS.parent
#: A tiny model's 2-process run takes seconds; the bound only stops a hung collective.
TORCHRUN_TIMEOUT_S = 300


def torchrun(nproc: int, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node nproc argv...`, bounded in time.

    The rendezvous binds 127.0.0.1 at port 0, so the OS hands each run its own free port:
    test runs side by side never collide.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT_S, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def tp2_ranks(tiny_folder, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("tp2")
    done = torchrun(2, str(TESTS / "tp_worker.py"), tiny_folder, str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def single_process(tiny_folder) -> list[dict]:
    return run_cases(TorchBackend.load(tiny_folder, device="cpu"))


@pytest.mark.parametrize("case", range(len(CASES)),
                         ids=[f"{s}({c}) c={k} n={n}" + (" open loop" if gap else "") for s, c, k, n, gap in CASES])
def test_tp2_logits_equal_single_process(tp2_ranks, single_process, case):
    expected = single_process[case]
    for rank in tp2_ranks:
        got = rank["cases"][case]
        assert len(got["requests"]) == len(expected["requests"]) == CASES[case][3]
        for (tokens, logits), (ref_tokens, ref_logits) in zip(got["requests"], expected["requests"]):
            torch.testing.assert_close(torch.from_numpy(logits), torch.from_numpy(ref_logits), atol=2e-4, rtol=1e-4)
            assert tokens == ref_tokens
        if CASES[case][4] is None:
            # The same steps as one process: the strategies schedule a sharded model unchanged.
            assert got["steps"] == expected["steps"]
    # Every rank made the same decisions at the same (rank 0's) times, arrivals included.
    assert tp2_ranks[0]["cases"][case]["steps"] == tp2_ranks[1]["cases"][case]["steps"]
    assert tp2_ranks[0]["cases"][case]["token_times"] == tp2_ranks[1]["cases"][case]["token_times"]


def test_tp2_runs_mixed_steps_and_a_closed_loop(tp2_ranks):
    steps = {s: tp2_ranks[0]["cases"][i]["steps"] for i, s in enumerate(CASES)}
    chunked = steps[("chunked", 4, 4, 4, None)]
    assert any(chunks and decodes for chunks, decodes in chunked), "no decode rode along with a prefill chunk"
    closed = steps[("chunked", 5, 3, 7, None)]
    assert max(len(chunks) + len(decodes) for chunks, decodes in closed) <= 3
    assert len(tp2_ranks[0]["cases"][5]["requests"]) == 7


def test_each_rank_caches_only_its_kv_heads(tp2_ranks, tiny_folder):
    kv_heads = tiny_config().num_key_value_heads
    for rank in tp2_ranks:
        slots, heads, _, head_dim = rank["kv_cache_shape"]
        assert heads == kv_heads // 2
        assert head_dim == tiny_config().hidden_size // tiny_config().num_attention_heads


def test_metadata_records_the_process_group(tp2_ranks):
    meta = tp2_ranks[0]["metadata"]
    assert meta["world_size"] == 2 and meta["tp"] == 2
    assert meta["process_group_backend"] == "gloo"
    assert meta["devices"].count("cpu CPU") == 2
    assert tp2_ranks[0]["label"] == "torch 2xCPU TP2"


def test_tp_that_does_not_divide_the_heads_is_refused():
    config = tiny_config(hidden_size=96, num_attention_heads=6, num_key_value_heads=3)
    with pytest.raises(BackendError, match=r"--tp 2 does not divide the model's 6 attention heads and 3 KV heads; --tp 3 would"):
        check_heads_divide(config, 2)
    check_heads_divide(config, 3)


def test_tp_without_torchrun_says_how_to_launch(monkeypatch, tiny_folder):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(BackendError, match="launch it as: torchrun --nproc-per-node 2 -m prefillbench run --backend torch --tp 2"):
        load_backend("torch", tiny_folder, device="cpu", tp=2)
    assert launch_hint(4).startswith("torchrun --nproc-per-node 4 ")


def _fake_torchrun_env(monkeypatch, world: int) -> None:
    for var, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", str(world)),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "1")):
        monkeypatch.setenv(var, value)


def test_world_size_must_match_tp(monkeypatch, tiny_folder):
    _fake_torchrun_env(monkeypatch, 4)
    with pytest.raises(BackendError, match="torchrun started 4 processes but --tp is 2"):
        load_backend("torch", tiny_folder, device="cpu", tp=2)
    with pytest.raises(BackendError, match="4 processes were launched but --tp is 1; pass --tp 4"):
        load_backend("torch", tiny_folder, device="cpu")


def test_tp_runs_on_torch_only(monkeypatch):
    _fake_torchrun_env(monkeypatch, 2)
    with pytest.raises(BackendError, match="--tp 2 runs on the torch backend only"):
        load_backend("gguf", "model.gguf", tp=2)


def test_auto_backend_picks_torch_for_tp(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    # A .gguf file would go to llama.cpp, which has no tensor parallelism: the torch launch hint shows torch was chosen.
    with pytest.raises(BackendError, match="launch it as: torchrun"):
        load_backend("auto", "model.gguf", tp=2)


def test_sim_refuses_torchrun_and_torch_refuses_pp(monkeypatch, tiny_folder):
    _fake_torchrun_env(monkeypatch, 2)
    with pytest.raises(BackendError, match="the sim predicts --tp and --pp in one process"):
        load_backend("sim", None, tp=2)
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(BackendError, match="--pp 2 runs on the sim only"):
        load_backend("torch", tiny_folder, device="cpu", pp=2)


# ---------------------------------------------------------------- the CLI under torchrun


def test_cli_under_torchrun_prints_and_writes_once(tiny_folder, tmp_path):
    export = tmp_path / "tp.json"
    done = torchrun(2, "-m", "prefillbench", "run", "--backend", "torch", "--device", "cpu", "--tp", "2",
                    "-m", tiny_folder, "-p", "0", "-n", "0", "--pg", "12,3", "-c", "1,2", "-s", "sequential,chunked",
                    "--chunk-size", "5", "-r", "1", "--no-progress", "--export", str(export),
                    "--results-dir", str(tmp_path / "results"), "--verify", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert sum(line.startswith("| model") for line in lines) == 1
    rows = [line for line in lines if "torch 2xCPU TP2" in line]
    assert len(rows) == 4  # 2 strategies × 2 concurrencies, once
    assert done.stderr.count("on torch 2xCPU TP2, weights: float32") == 1
    assert done.stderr.count("prefillbench: wrote") == 1
    assert done.stderr.count("comparisons agree within tolerance") == 1 and "verify: all " in done.stderr
    assert len(list((tmp_path / "results").iterdir())) == 1
    exported = json.loads(export.read_text())
    assert exported["metadata"]["world_size"] == 2 and exported["metadata"]["process_group_backend"] == "gloo"
    assert len(exported["results"]) == 4


def test_cli_under_torchrun_tp_that_does_not_divide_the_heads(tmp_path):
    model, _ = tiny_model("llama", hidden_size=96, num_attention_heads=6, num_key_value_heads=3)
    model.save_pretrained(tmp_path / "six-heads")
    done = torchrun(2, "-m", "prefillbench", "run", "--backend", "torch", "--device", "cpu", "--tp", "2",
                    "-m", str(tmp_path / "six-heads"), "--pg", "8,2", "-c", "1", "--no-progress", "--no-results-file",
                    cwd=tmp_path)
    assert done.returncode != 0 and done.stdout == ""
    message = "--tp 2 does not divide the model's 6 attention heads and 3 KV heads; --tp 3 would"
    assert f"prefillbench: error: {message}" in done.stderr
    assert f"prefillbench: error (rank 1): {message}" in done.stderr
    assert "prefillbench/" not in done.stderr  # no traceback through our code; torchrun adds its own summary


RUN = ["run", "--no-progress", "--no-results-file", "--pg", "8,2", "-c", "1"]


@pytest.mark.parametrize("argv,world,message", [
    (["--backend", "torch", "--tp", "2"], None,
     "prefillbench: error: --tp 2 needs one process per rank; launch it as: torchrun --nproc-per-node 2 -m prefillbench run"),
    (["--backend", "torch", "--tp", "2"], 4, "prefillbench: error: torchrun started 4 processes but --tp is 2"),
    (["--backend", "gguf", "--tp", "2"], 2, "prefillbench: error: --tp 2 runs on the torch backend only"),
    (["--backend", "torch", "--pp", "2"], None, "prefillbench: error: --pp 2 runs on the sim only"),
])
def test_cli_tp_errors_are_one_line(monkeypatch, run_cli, tiny_folder, argv, world, message):
    if world is None:
        for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(var, raising=False)
    else:
        _fake_torchrun_env(monkeypatch, world)
    code, _, err = run_cli(*RUN, "-m", tiny_folder, *argv)
    assert code == 2
    assert err.startswith(message) and err.count("\n") == 1

"""The sim's cap on sequences in flight: what the KV cache holds, at most the engine's max_num_seqs (issue 45)."""
from __future__ import annotations

import json

import pytest

from prefillbench import engine
from prefillbench.backends.sim.backend import DEFAULT_MAX_NUM_SEQS, SimBackend
from prefillbench.backends.sim.measured.overheads import sglang_max_running_requests
from prefillbench.backends.sim.specs import SimConfigError
from prefillbench.cli import main
from prefillbench.sequence import Request
from strategies import make_strategy


def _requests(n: int, prompt: int = 64, gen: int = 8) -> list[Request]:
    return [Request(tuple(range(100 + i, 100 + i + prompt)), gen) for i in range(n)]


def _most_in_flight(run) -> int:
    return max(len(s.decode_contexts) + len(s.prefill_chunks) for s in run.steps)


def test_max_num_seqs_caps_the_sequences_in_a_step_and_the_rest_queue():
    # An 8B model on an H200 holds thousands of 72-token sequences; the cap, not the KV cache, binds.
    capped = SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h200", max_num_seqs=8)
    assert capped.cost.max_sequences(72) > 1000
    run = engine.run(capped, make_strategy("sarathi-serve", 256), _requests(32), 32)
    assert _most_in_flight(run) == 8
    assert capped.clamped == [(32, 8)]
    free = SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h200")
    wide = engine.run(free, make_strategy("sarathi-serve", 256), _requests(32), 32)
    assert _most_in_flight(wide) > 8 and not free.clamped
    # Queued requests wait: the last admitted starts only after earlier ones finished.
    assert max(r.first_scheduled for r in run.requests) > min(r.token_times[-1] for r in run.requests)
    assert capped.metadata()["sim_max_num_seqs"] == 8


def test_the_kv_cache_still_binds_below_the_engines_cap():
    b = SimBackend.load()  # llama-13b on an A6000: a few hundred short sequences fit
    fits = b.cost.max_sequences(200)
    assert fits < DEFAULT_MAX_NUM_SEQS
    assert b.max_concurrency(200) == fits
    assert b.clamp_kind(fits) == "kv" and b.clamp_kind(DEFAULT_MAX_NUM_SEQS) == "engine"


@pytest.mark.parametrize("overheads, gpu, expected", [
    ("vllm", "a100-sxm", 256),  # vllm/engine/arg_utils.py: A100s and GPUs under 70 GiB
    ("vllm", "h100-sxm", 1024),
    ("vllm", "b200", 1024),
    ("tensorrt-llm", "h100-sxm", 2048),
    ("none", "a100-sxm", DEFAULT_MAX_NUM_SEQS),
])
def test_each_engine_caps_at_its_own_default_on_the_gpu(overheads, gpu, expected):
    b = SimBackend.load(sim_model="llama-3.1-8b", sim_gpu=gpu, sim_pricing="measured", sim_overheads=overheads)
    assert b.max_num_seqs == expected
    assert b.max_concurrency(16) == min(expected, b.cost.max_sequences(16))


def test_sglang_caps_at_its_max_running_requests_from_the_kv_tokens():
    b = SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h100-sxm", sim_pricing="measured", sim_overheads="sglang")
    kv = b.cost.kv_capacity_tokens()
    assert b.max_num_seqs == sglang_max_running_requests(kv, b.model.max_context)
    assert 2048 <= b.max_num_seqs <= 4096 or b.max_num_seqs == kv // 2


def test_a_deployments_instances_keep_the_cap():
    b = SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h200", max_num_seqs=5)
    assert b.instance(2).max_num_seqs == 5


def test_a_cap_below_one_is_refused():
    with pytest.raises(SimConfigError, match="--max-num-seqs must be at least 1"):
        SimBackend.load(max_num_seqs=0)


def test_cli_runs_past_1024_sequences_and_names_the_cap(tmp_path, capsys):
    out = tmp_path / "r.json"
    status = main(["run", "--backend", "sim", "--sim-model", "llama-3.1-8b", "--sim-gpu", "h200", "-p", "0",
                   "--pg", "32,2", "-c", "1500", "-s", "sequential", "-r", "1", "--no-warmup", "--no-results-file",
                   "--no-progress", "--max-num-seqs", "600", "--export", str(out)])
    assert status == 0
    err = capsys.readouterr().err
    assert "the engine runs at most 600 at a time, the rest wait in its queue (max_num_seqs 600: --max-num-seqs)" in err
    meta = json.loads(out.read_text())["metadata"]
    assert meta["sim_max_num_seqs"] == 600 and "1500->600" in meta["sim_concurrency_clamped"]


def test_a_backend_without_the_cap_names_the_flag_as_ignored(capsys):
    status = main(["run", "--backend", "fake", "-p", "0", "--pg", "8,2", "-c", "1", "-r", "1", "--no-results-file",
                   "--no-progress", "--max-num-seqs", "4"])
    assert status == 0
    assert "--max-num-seqs 4 is ignored by the fake backend" in capsys.readouterr().err

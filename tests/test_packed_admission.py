"""packed packs whole prompts up to vLLM's max_num_batched_tokens, and a reserving strategy's run admits by the KV
its sequences reserve beside the step its engine sizes activations by; the clamp line names the limit that binds
(issue 68: an A30 with Qwen2.5-7B ran 10 of the 58 sequences its KV cache holds)."""
from __future__ import annotations

import json

import pytest

from prefillbench import engine
from prefillbench.backends.fake import FakeBackend
from prefillbench.sequence import Request, Sequence
from strategies import make_strategy

QUIET = ["--no-progress", "--no-results-file"]
#: The issue's A30: 165 TFLOPS, 933 GB/s, 24 GB (the sim's spec-file fields).
A30 = "name: A30\ntflops: 165\nmem_bw_gbs: 933\nmem_gb: 24\n"


def waiting(*lengths: int) -> list[Sequence]:
    return [Sequence(i, tuple(range(n)), 4, 0.0) for i, n in enumerate(lengths)]


def test_packed_packs_prompts_oldest_first_up_to_its_token_cap():
    packed = make_strategy("packed:max-batched=1000")
    step = packed.next_step(waiting(400, 500, 200, 10), [])
    assert [len(c.tokens) for c in step.prefills] == [400, 500]  # 400 + 500 + 200 > 1000: the third waits
    # a prompt longer than the cap enters alone (max_model_len makes room for it in vLLM), never split
    step = packed.next_step(waiting(3000, 10), [])
    assert [len(c.tokens) for c in step.prefills] == [3000]
    assert make_strategy("packed").max_batched_tokens == 2048  # vLLM's _DEFAULT_MAX_NUM_BATCHED_TOKENS


def test_packed_steps_stay_within_max_step_tokens():
    packed = make_strategy("packed:max-batched=100")
    requests = [Request(tuple(range(30 + 7 * i)), 3) for i in range(12)]
    backend = FakeBackend()
    engine.run(backend, packed, requests, 12)
    bound = packed.max_step_tokens(max(len(r.prompt) for r in requests), 12)
    prefills = [s for s in backend.steps if s.prefills]
    # within the cap, or one prompt past it alone (30 + 7 * 11 = 107 tokens)
    assert all(s.n_tokens <= 100 or len(s.prefills) == 1 for s in prefills) and len(prefills) > 1
    assert bound == 107 and all(s.n_tokens <= bound for s in backend.steps)
    assert all(not s.decodes for s in prefills)  # decodes pause while a prompt waits


def test_a_bad_cap_is_refused():
    with pytest.raises(ValueError, match="packed:max-batched must be at least 1"):
        make_strategy("packed:max-batched=0")


@pytest.fixture
def a30(tmp_path):
    path = tmp_path / "a30.yaml"
    path.write_text(A30)
    return str(path)


def a30_run(run_cli, a30, tmp_path, *flags):
    export = tmp_path / "out.json"
    code, out, err = run_cli("run", "--backend", "sim", "--sim-model", "docs/sim/qwen2.5-7b-instruct.json",
                             "--sim-gpu", a30, "--pg", "2048,256", "--requests", "70", "-p", "0", "-n", "0", "-r", "1",
                             *QUIET, "--export", str(export), *flags)
    assert code == 0, err
    return err, json.loads(export.read_text())["metadata"]


def test_the_a30_case_runs_what_its_kv_holds_beside_one_step(run_cli, a30, tmp_path):
    err, meta = a30_run(run_cli, a30, tmp_path, "-s", "packed", "-c", "70")
    assert meta["sim_kv_capacity_tokens"] // 2304 == 58  # whole lengths, no step: the 58
    # beside one 2048-token step (vLLM's profile run), 53; the line says the step's activations bind, and the 58
    assert "only 53 of 70 sequences fit" in err
    assert "packed's step activations: its largest step, 2,048 tokens for 54 sequences" in err
    assert "the KV alone holds 58 at their whole length" in err


def test_the_a30_clamp_moves_with_kv_cache_tokens_max_num_seqs_and_c(run_cli, a30, tmp_path):
    err, _ = a30_run(run_cli, a30, tmp_path, "-s", "packed", "-c", "70", "--kv-cache-tokens", "50000")
    assert "only 21 of 70 sequences fit" in err and "--kv-cache-tokens 50,000 holds 21 sequences" in err
    err, _ = a30_run(run_cli, a30, tmp_path, "-s", "packed", "-c", "70", "--max-num-seqs", "40")
    assert "the engine runs at most 40 at a time" in err and "only" not in err
    err, _ = a30_run(run_cli, a30, tmp_path, "-s", "packed", "-c", "30")
    assert "fit in" not in err and "at most" not in err  # 30 fit: no clamp


def test_padded_still_reserves_its_rectangular_batch(run_cli, a30, tmp_path):
    # FasterTransformer's context phase takes a [batch, max_input_len] buffer: every admitted prompt at once
    err, _ = a30_run(run_cli, a30, tmp_path, "-s", "padded", "-c", "70")
    assert "only 10 of 70 sequences fit" in err and "padded's step activations" in err

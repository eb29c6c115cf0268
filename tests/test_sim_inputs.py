"""Bad input to the sim: one line, non-zero exit; and the building blocks it checks."""
from __future__ import annotations

import json

import pytest

from prefillbench.cli import main
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.backends.sim.cost import Batch, CostModel
from prefillbench.backends.sim.specs import SimConfigError

RUN = ["run", "--backend", "sim", "-p", "128", "-n", "0", "-c", "1", "-r", "1", "--no-results-file", "--no-progress"]


def run_error(capsys, *args) -> str:
    assert main(RUN + list(args)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("prefillbench: error: ")
    return err[0]


def test_unknown_model_preset(capsys):
    assert "unknown sim model 'llama-99b'" in run_error(capsys, "--sim-model", "llama-99b")


def test_unknown_gpu_preset(capsys):
    assert "unknown sim GPU 'v100'" in run_error(capsys, "--sim-gpu", "v100")


def test_config_without_needed_fields(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "vocab_size": 100}))
    line = run_error(capsys, "--sim-model", str(path))
    assert "num_hidden_layers" in line and "num_attention_heads" in line


def test_unparsable_config(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    assert "cannot parse" in run_error(capsys, "--sim-model", str(path))


def test_tp_that_does_not_divide_the_heads(capsys):
    assert "--tp 3 does not divide llama-13b's 40 attention heads" in run_error(capsys, "--sim-model", "llama-13b", "--tp", "3")


def test_model_that_does_not_fit_says_by_how_much(capsys):
    line = run_error(capsys, "--sim-model", "llama-2-70b", "--sim-gpu", "a100-sxm")
    assert "does not fit on A100-SXM" in line and "short by" in line and "GiB" in line
    # 70B in bf16 is ~128.5 GiB of weights plus 1 GiB reserve on an 80 GiB GPU: short by ~49.5 GiB
    short = float(line.split("short by ")[1].split(" GiB")[0])
    assert 45 < short < 55


def test_model_fits_with_tensor_parallel(capsys):
    assert main(RUN + ["--sim-model", "llama-2-70b", "--sim-gpu", "h100", "--tp", "4"]) == 0
    assert "sim 4xH100-SXM TP4 PP1" in capsys.readouterr().out


def test_config_json_and_spec_yaml(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
                               "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192,
                               "vocab_size": 128256, "max_position_embeddings": 4096, "tie_word_embeddings": True}))
    gpu = tmp_path / "l4.yaml"
    gpu.write_text("name: L4\ntflops: 121\nmem_bw_gbs: 300\nmem_gb: 24\n")
    assert main(RUN + ["--sim-model", str(cfg), "--sim-gpu", str(gpu)]) == 0
    assert "sim L4" in capsys.readouterr().out


def test_gpu_spec_without_fields(tmp_path, capsys):
    gpu = tmp_path / "x.yaml"
    gpu.write_text("name: X\ntflops: 100\n")
    assert "GPU spec has no mem_bw, mem_bytes" in run_error(capsys, "--sim-gpu", str(gpu))


def test_presets_load_case_insensitively():
    assert load_gpu_spec("A6000").mem_bw == 768e9
    assert load_gpu_spec("h100").flops == 989e12
    assert load_model_spec("LLaMA-13B").n_params == pytest.approx(13.0e9, rel=0.01)
    assert load_model_spec("gpt3-175b").n_params == pytest.approx(175e9, rel=0.01)
    with pytest.raises(SimConfigError):
        load_model_spec("nope")


def test_cost_breakdown_names_every_operator():
    cm = CostModel(load_model_spec("llama-13b"), load_gpu_spec("a100"), tp=2, pp=2)
    cost = cm.step_cost(Batch(((256, 256, True),), (300, 500)))
    names = set(cost.breakdown())
    assert {"qkv_proj", "attn_out_proj", "mlp_gate_up", "mlp_down", "prefill_attention", "decode_attention",
            "lm_head", "tp_allreduce", "pp_send", "embedding", "norms_elementwise"} <= names
    assert cost.seconds == pytest.approx(sum(v["seconds"] for v in cost.breakdown().values()))
    assert len(cost.stages) == 2


def test_chunk_at_an_offset_pays_for_rereading_earlier_kv():
    cm = CostModel(load_model_spec("llama-13b"), load_gpu_spec("a6000"))
    first = cm.step_cost(Batch(((0, 256, False),))).breakdown()["prefill_attention"]
    last = cm.step_cost(Batch(((768, 256, True),))).breakdown()["prefill_attention"]
    assert last["flops"] > 3 * first["flops"] and last["bytes"] > 1.5 * first["bytes"]


def test_sim_has_no_logits():
    from prefillbench.api import generate
    from prefillbench.backends.sim.backend import SimBackend

    backend = SimBackend.load("mistral-7b", "h100")
    a = generate([[1, 2, 3, 4]], model=backend, strategy="chunked", chunk_size=2, max_new_tokens=5)
    b = generate([[1, 2, 3, 4]], model=backend, strategy="sequential", max_new_tokens=5)
    assert a == b and len(a[0]) == 5


def test_model_shapes_from_gguf_metadata():
    from prefillbench.models import default_model_path

    path = default_model_path()  # the default model package is a hard dependency: missing, this fails
    m = load_model_spec(path)
    assert (m.n_layers, m.hidden, m.n_heads, m.n_kv_heads, m.ffn, m.vocab) == (30, 576, 9, 3, 1536, 49152)
    assert 0.5 < m.weight_bytes < 1.0  # Q4_1 blocks, plus a few wider tensors

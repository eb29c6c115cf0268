"""`--kernels torch` runs plain torch; in `auto`, a C kernel runs only where it won when timed at prepare()."""
from __future__ import annotations

import itertools

import pytest
import torch

from prefillbench import api
from prefillbench.backends.base import BackendError
from prefillbench.backends.torch import kernel_choice
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.backends.torch.cpu import decode_attention as cpu_decode_attention
from prefillbench.backends.torch.cpu import few_rows as cpu_few_rows
from prefillbench.backends.torch.cpu import huge_pages
from prefillbench.backends.torch.cpu import layer_ops as cpu_layer_ops
from prefillbench.backends.torch.cpu import prefill_attention as cpu_prefill_attention
from prefillbench.step import DecodeToken, PrefillChunk, Step
from parity import assert_logits_match
from tiny_models import reference_logits, tiny_model

PROMPT = tuple(range(3, 40))
#: tiny_model("llama", hidden_size=256): heads of 64, as the prefill kernel takes
KERNELS = (cpu_decode_attention.KERNEL, cpu_few_rows.KERNEL, cpu_layer_ops.KERNELS, cpu_prefill_attention.KERNEL)


def _logits_match_transformers(backend: TorchBackend, reference, decode_position: int = len(PROMPT)) -> None:
    """A prompt chunk and a decode through the backend give a plain transformers forward's logits, to rounding."""
    backend.prepare(2, 64, 64)
    got = backend.execute(Step(prefills=(PrefillChunk(0, PROMPT, 0, True),)), return_logits=True).logits[0]
    assert_logits_match(got, reference_logits(reference, list(PROMPT))[-1], reference, PROMPT)
    got = backend.execute(Step(decodes=(DecodeToken(0, 7, decode_position),)), return_logits=True).logits[0]
    assert_logits_match(got, reference_logits(reference, list(PROMPT) + [7])[-1], reference, PROMPT + (7,))


@pytest.mark.parametrize("bug", ["a weight off by 1e-3", "a decode one position early"])
def test_the_rounding_tolerance_still_fails_a_small_real_error(bug):
    # The tolerance (tests/parity.py) allows what float32 summation order can move and no more: one of the
    # 65536 weights of a q projection moved by 1e-3 (half a percent of the init's 0.2), or a decode that
    # overwrites the prompt's last position, fails it.
    model, reference = tiny_model("llama", hidden_size=256)
    position = len(PROMPT)
    if bug == "a weight off by 1e-3":
        with torch.no_grad():
            model.model.layers[0].self_attn.q_proj.weight[0, 0] += 1e-3
    else:
        position -= 1
    with pytest.raises(AssertionError, match="past its rounding tolerance"):
        _logits_match_transformers(TorchBackend(model, "tiny"), reference, position)


def _forbid_c_kernels(monkeypatch) -> None:
    """Any use of a C kernel, or of huge pages, from here on fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a C kernel or huge pages were used")

    for kernel in KERNELS:
        monkeypatch.setattr(kernel, "status", refuse)
    monkeypatch.setattr(huge_pages, "empty", refuse)


def test_kernels_torch_runs_plain_torch_only_and_says_so(monkeypatch):
    model, reference = tiny_model("llama", hidden_size=256)
    _forbid_c_kernels(monkeypatch)
    backend = TorchBackend(model, "tiny", kernels="torch")
    _logits_match_transformers(backend, reference)
    meta = backend.metadata()
    assert meta["kernels"] == "torch" and meta["tune_linear"] == "off" and "linear_kernels" not in meta
    assert meta["decode_plan"] == "off (--kernels torch)" and backend.decode_plan is None
    assert meta["prefill_attention"] == "SDPA (--kernels torch)"
    assert meta["decode_attention"] == "matmuls/SDPA (--kernels torch)"
    assert meta["layer_ops"] == "torch ops (--kernels torch)"


def test_kernels_torch_leaves_another_backend_in_the_same_process_its_kernels(monkeypatch):
    model, reference = tiny_model("llama", hidden_size=256)
    plain = TorchBackend(model, "tiny", kernels="torch")
    plain.prepare(1, 64, 64)
    auto = TorchBackend(tiny_model("llama", hidden_size=256)[0], "tiny")
    calls = []
    real = cpu_prefill_attention.prefill_attention
    monkeypatch.setattr(cpu_prefill_attention, "prefill_attention", lambda *a: calls.append(1) or real(*a))
    step = Step(prefills=(PrefillChunk(0, PROMPT, 0, True),))
    plain.execute(step)
    assert calls == []
    auto.prepare(1, 64, 64)
    auto.execute(step)
    assert len(calls) == model.config.num_hidden_layers


def test_an_unknown_kernels_value_is_a_clear_error():
    with pytest.raises(BackendError, match="kernels must be one of auto, torch"):
        TorchBackend(tiny_model("llama", hidden_size=256)[0], "tiny", kernels="fast")


def test_the_api_passes_kernels_on(tmp_path, monkeypatch):
    model, reference = tiny_model("llama", hidden_size=256)
    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    _forbid_c_kernels(monkeypatch)
    tokens = api.generate([list(PROMPT)], model=str(folder), backend="torch", device="cpu", max_new_tokens=3, kernels="torch")
    expected = reference.generate(torch.tensor([PROMPT]), max_new_tokens=3, do_sample=False)[0, len(PROMPT):].tolist()
    assert tokens == [expected]


def _timed_as(monkeypatch, kernel_s: float, torch_s: float) -> None:
    """Timing says the kernel side took kernel_s and torch's side torch_s, every time (decide times them alternately)."""
    monkeypatch.setenv(kernel_choice.DECISION_VARIABLE, "timed")
    answers = itertools.cycle([kernel_s, torch_s])
    monkeypatch.setattr(kernel_choice, "best_time", lambda fn, rounds=kernel_choice.ROUNDS: next(answers))


def test_kernels_that_lose_when_timed_are_not_used_and_the_metadata_says_by_how_much(monkeypatch):
    model, reference = tiny_model("llama", hidden_size=256)
    _timed_as(monkeypatch, 2.0, 1.0)
    backend = TorchBackend(model, "tiny")
    used = []
    for module, name in ((cpu_prefill_attention, "prefill_attention"), (cpu_decode_attention, "decode_attention"),
                         (cpu_decode_attention, "stage_and_attend"), (cpu_layer_ops, "add_rms_norm")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name: used.append(name) or real(*a))
    _logits_match_transformers(backend, reference)
    assert used == []
    meta = backend.metadata()
    assert meta["prefill_attention"] == "SDPA (kernel timed 2.00x SDPA's time)"
    assert meta["decode_attention"] == "matmuls/SDPA (kernel timed 2.00x matmuls/SDPA's time)"
    assert meta["layer_ops"].startswith("torch ops (kernel timed 2.00x at 1 row, 2.00x at 64 rows")
    assert backend.decode_plan is None and meta["decode_plan"].startswith("off (the decode_attention, layer_ops kernel lost")


def test_kernels_that_win_when_timed_are_used(monkeypatch):
    model, reference = tiny_model("llama", hidden_size=256)
    _timed_as(monkeypatch, 1.0, 2.0)
    backend = TorchBackend(model, "tiny")
    _logits_match_transformers(backend, reference)
    meta = backend.metadata()
    assert meta["prefill_attention"] == "compiled C kernel (timed 0.50x SDPA's time)"
    assert meta["decode_attention"] == "compiled C kernel (timed 0.50x matmuls/SDPA's time)"
    assert meta["layer_ops"].startswith("compiled C loops (timed 0.50x at 1 row")
    assert backend.decode_plan is not None and meta["decode_plan"] == "on, 1-8 decodes (timed 0.50x the eager step's time)"


def test_real_timings_decide_every_kernel_and_the_steps_stay_right(monkeypatch):
    monkeypatch.setenv(kernel_choice.DECISION_VARIABLE, "timed")
    model, reference = tiny_model("llama", hidden_size=256)
    backend = TorchBackend(model, "tiny")
    _logits_match_transformers(backend, reference)
    decisions = backend.kernel_choice.decisions
    assert {"prefill_attention", "decode_attention", "layer_ops"} <= set(decisions)
    # the plan runs those two kernels: it is timed only where both won
    planned = decisions["decode_attention"].on and decisions["layer_ops"].on
    assert ("decode_plan" in decisions) == planned and (backend.decode_plan is not None) == (planned and decisions["decode_plan"].on)
    assert all(d.ratio is not None and d.ratio > 0 and d.on == (d.ratio < 1) for d in decisions.values())

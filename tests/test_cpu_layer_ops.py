"""The compiled layer loops compute what transformers' modules compute, and the backend uses them."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from prefillbench.backends.torch.cpu import layer_ops as cpu_layer_ops
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.step import DecodeToken, PrefillChunk, Step
from kernel_builds import forget_build
from parity import assert_logits_match
from tiny_models import tiny_model


def one_ulp(dtype: torch.dtype) -> dict:
    """Tolerances: float32 to rounding; bfloat16 to one unit in the last place (the order of a sum)."""
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.0, rtol=2**-7)


def test_the_kernels_build_here():
    # CI has a C compiler: a build that fails must fail a test, not fall back unseen.
    assert cpu_layer_ops.status() == ""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,dim", [(1, 64), (37, 576), (300, 96)])  # 300 x 96 runs on both threads
def test_add_rms_norm_is_the_residual_add_then_transformers_norm(dtype, rows, dim):
    gen = torch.Generator().manual_seed(rows)
    residual, delta = (torch.randn(1, rows, dim, generator=gen).to(dtype) * 3 for _ in range(2))
    norm = LlamaRMSNorm(dim, eps=1e-5).to(dtype)
    norm.weight.data = torch.randn(dim, generator=gen).to(dtype)
    want_residual = residual + delta
    want = norm(want_residual)
    got = cpu_layer_ops.add_rms_norm(residual, delta, norm.weight, 1e-5)
    assert torch.equal(residual, want_residual)  # added in place, rounded as torch rounds
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, **one_ulp(dtype))
    before = residual.clone()
    torch.testing.assert_close(cpu_layer_ops.add_rms_norm(residual, None, norm.weight, 1e-5), norm(before), **one_ulp(dtype))
    assert torch.equal(residual, before)  # no delta: the residual is only read


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_heads,kv_heads,dim", [(9, 3, 64), (4, 4, 24), (8, 2, 128)])
def test_rotary_rotates_q_and_k_in_place_and_leaves_v(dtype, q_heads, kv_heads, dim):
    gen = torch.Generator().manual_seed(dim)
    rows = 40
    sizes = (q_heads * dim, kv_heads * dim, kv_heads * dim)
    qkv = torch.randn(1, rows, sum(sizes), generator=gen).to(dtype)
    angles = torch.rand(1, rows, dim // 2, generator=gen) * 6
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1).to(dtype) for f in (torch.cos, torch.sin))
    shape = (1, rows, -1, dim)
    q, k, v = (t.view(shape).transpose(1, 2) for t in qkv.split(sizes, dim=-1))
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    want_v = v.clone()
    got = cpu_layer_ops.rotary_(qkv, cos, sin, q_heads + kv_heads, dim)
    assert got is qkv
    q, k, v = (t.view(shape).transpose(1, 2) for t in qkv.split(sizes, dim=-1))
    torch.testing.assert_close(q, want_q, **one_ulp(dtype))
    torch.testing.assert_close(k, want_k, **one_ulp(dtype))
    assert torch.equal(v, want_v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 64])
def test_silu_mul_is_silu_of_the_gate_times_up(dtype, rows):
    gen = torch.Generator().manual_seed(rows)
    gate_up = (torch.randn(1, rows, 2 * 96, generator=gen) * 6).to(dtype)
    gate_up[0, 0, :4] = torch.tensor([-200.0, -88.5, 0.0, 90.0])  # exp's range ends: no inf, no NaN
    gate, up = gate_up.chunk(2, dim=-1)
    got = cpu_layer_ops.silu_mul(gate_up)
    assert got.shape == (1, rows, 96) and torch.isfinite(got).all()
    # Below -88 silu is under 1e-36 and the kernel's exp is held finite: count such values as equal.
    torch.testing.assert_close(got, F.silu(gate) * up, **{**one_ulp(dtype), "atol": 1e-30})


def test_loading_the_kernels_leaves_the_process_denormals_alone():
    # A shared library linked with -ffast-math sets flush-to-zero when loaded (gcc 12): torch's ops would change.
    from prefillbench.backends.torch.cpu import decode_attention as cpu_decode_attention

    assert cpu_layer_ops.status() == "" and cpu_decode_attention.status() == ""
    tiny = torch.tensor([1e-39])
    assert (tiny * 1.0).item() > 0.0
    assert (torch.tensor([1e-38]) / 100).item() > 0.0


def test_bad_inputs_are_refused_not_misread():
    with pytest.raises(ValueError):
        cpu_layer_ops.silu_mul(torch.randn(4, 16).half())
    with pytest.raises(ValueError):
        cpu_layer_ops.silu_mul(torch.randn(16, 4).t())  # not contiguous
    with pytest.raises(ValueError):
        cpu_layer_ops.add_rms_norm(torch.randn(2, 8), torch.randn(2, 8).bfloat16(), torch.ones(8), 1e-5)
    with pytest.raises(ValueError):
        cpu_layer_ops.rotary_(torch.randn(3, 20), torch.randn(3, 8), torch.randn(3, 8), 3, 8)  # 3 heads of 8 > 20


MIXED_PROMPTS = [tuple(range(3, 40)), tuple(range(5, 12))]
#: Each sequence's tokens up to the logits _mixed_step_logits returns for it.
MIXED_TOKENS = {0: MIXED_PROMPTS[0] + (9,), 1: MIXED_PROMPTS[1] + (9,), 2: tuple(range(7, 30))}


def _mixed_step_logits(backend: TorchBackend):
    """Two prompts, then a step with a chunk of a third and both decodes: every kind of row."""
    for i, p in enumerate(MIXED_PROMPTS):
        backend.execute(Step(prefills=(PrefillChunk(i, p, 0, is_last=True),)))
    step = Step(prefills=(PrefillChunk(2, MIXED_TOKENS[2], 0, is_last=True),),
                decodes=tuple(DecodeToken(i, 9, len(p)) for i, p in enumerate(MIXED_PROMPTS)))
    return backend.execute(step, return_logits=True).logits


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_backend_runs_the_compiled_loops_with_the_torch_ops_logits(arch, monkeypatch):
    model, reference = tiny_model(arch)
    backend = TorchBackend(model, f"tiny-{arch}", "cpu")
    assert backend.fused.c_layer_ops
    calls = []
    for name in ("add_rms_norm", "rotary_", "silu_mul"):
        fn = getattr(cpu_layer_ops, name)
        monkeypatch.setattr(cpu_layer_ops, name, lambda *a, fn=fn, name=name: calls.append(name) or fn(*a))
    backend.prepare(3, 128, 512)
    compiled = _mixed_step_logits(backend)
    # Per layer and step: two add+norms, one rotary, one gate; one more norm to start.
    assert calls.count("rotary_") == calls.count("silu_mul") == 3 * backend.n_layers
    assert calls.count("add_rms_norm") == 3 * (2 * backend.n_layers + 1)
    assert backend.metadata()["layer_ops"] == "compiled C loops"

    backend.fused.c_layer_ops = False
    calls.clear()
    backend.prepare(3, 128, 512)
    torch_ops = _mixed_step_logits(backend)
    assert not calls
    assert sorted(compiled) == sorted(MIXED_TOKENS)
    for seq in compiled:
        assert_logits_match(compiled[seq], torch_ops[seq], reference, MIXED_TOKENS[seq])


def test_without_the_kernels_the_torch_ops_run_and_say_why(monkeypatch, tmp_path):
    forget_build(monkeypatch, cpu_layer_ops.KERNELS, tmp_path, compiler="no-such-compiler")  # nothing built there yet
    model, _ = tiny_model("llama")
    backend = TorchBackend(model, "tiny-llama", "cpu")
    backend.prepare(3, 128, 512)
    assert _mixed_step_logits(backend)  # the torch ops ran: the library was never loaded
    assert backend.metadata()["layer_ops"].startswith("torch ops; compiled loops off (build failed")


def test_a_norm_of_another_kind_keeps_the_torch_ops():
    model, _ = tiny_model("llama")
    model.model.layers[1].post_attention_layernorm.__class__ = type("OffsetRMSNorm", (LlamaRMSNorm,), {})
    backend = TorchBackend(model, "tiny-llama", "cpu")
    assert backend.fused is not None and not backend.fused.c_layer_ops
    assert backend.metadata()["layer_ops"].startswith("torch ops (this model's norms")

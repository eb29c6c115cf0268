"""A chunk's causal attention through the compiled kernel (cpu_prefill_attention) computes what SDPA computes."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from prefillbench import engine
from prefillbench.backends.torch.cpu import decode_attention as cpu_decode_attention
from prefillbench.backends.torch.cpu import few_rows as cpu_few_rows
from prefillbench.backends.torch.cpu import layer_ops as cpu_layer_ops
from prefillbench.backends.torch.cpu import prefill_attention as cpu_prefill_attention
from prefillbench.backends.torch.attention import causal_offset_mask
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.sequence import Request
from strategies import make_strategy
from kernel_builds import forget_build
from tiny_models import reference_logits, tiny_model


def test_the_kernel_builds_here():
    # CI has a C compiler: a build that fails must fail a test, not fall back unseen.
    assert cpu_prefill_attention.status() == ""


def _reference(q, keys, values, start, scale):
    """Plain SDPA with an explicit causal mask at the chunk's offset: [T, heads, D]."""
    length = q.shape[1]
    mask = causal_offset_mask(start, length, q.dtype, q.device)
    kv = start + length
    return F.scaled_dot_product_attention(q[None], keys[None, :, :kv], values[None, :, :kv], attn_mask=mask, scale=scale,
                                          enable_gqa=True)[0].transpose(0, 1)


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 4, 64), (8, 2, 128)])
@pytest.mark.parametrize("start,length", [(0, 1), (0, 3), (0, 64), (0, 200), (5, 77), (63, 2), (64, 64), (130, 140)])
def test_causal_attention_at_any_offset_matches_sdpa(heads, kv_heads, dim, start, length):
    torch.manual_seed(start * 1000 + length)
    qkv = torch.randn(length, (heads + 2 * kv_heads) * dim)
    q = qkv[:, : heads * dim].view(length, heads, dim).transpose(0, 1)  # a view of the qkv product, as the backend has it
    keys, values = (torch.randn(kv_heads, start + length + 7, dim) for _ in range(2))
    got = cpu_prefill_attention.prefill_attention(q, keys, values, start, 0.3)
    torch.testing.assert_close(got, _reference(q, keys, values, start, 0.3), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (8, 2, 128)])
@pytest.mark.parametrize("start,length", [(0, 3), (0, 200), (63, 2), (130, 140)])
def test_bfloat16_is_attended_as_its_float32_values(heads, kv_heads, dim, start, length):
    # Widened exactly and summed in float32: the reference gets the same inputs widened; the output is rounded once.
    torch.manual_seed(start * 1000 + length)
    qkv = torch.randn(length, (heads + 2 * kv_heads) * dim).bfloat16()
    q = qkv[:, : heads * dim].view(length, heads, dim).transpose(0, 1)
    keys, values = (torch.randn(kv_heads, start + length + 7, dim).bfloat16() for _ in range(2))
    got = cpu_prefill_attention.prefill_attention(q, keys, values, start, 0.3)
    assert got.dtype == torch.bfloat16
    want = _reference(q.float(), keys.float(), values.float(), start, 0.3)
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)


def test_contiguous_queries_and_the_default_scale():
    q = torch.randn(4, 10, 64)  # [heads, T, D] contiguous: not a qkv view
    keys, values = torch.randn(2, 16, 64), torch.randn(2, 16, 64)
    got = cpu_prefill_attention.prefill_attention(q, keys, values, 2, None)
    torch.testing.assert_close(got, _reference(q, keys, values, 2, 64**-0.5), atol=2e-5, rtol=1e-4)


def test_inputs_it_cannot_take_are_refused():
    keys = torch.randn(2, 16, 64)
    assert not cpu_prefill_attention.applies(torch.device("cpu"), torch.float32, 32)  # a head of 32
    assert not cpu_prefill_attention.applies(torch.device("cpu"), torch.float16, 64)
    assert cpu_prefill_attention.applies(torch.device("cpu"), torch.float32, 64)
    assert cpu_prefill_attention.applies(torch.device("cpu"), torch.bfloat16, 128)
    with pytest.raises(ValueError):
        cpu_prefill_attention.prefill_attention(torch.randn(4, 10, 64), keys, keys, 10, None)  # 20 positions > 16
    with pytest.raises(ValueError):
        cpu_prefill_attention.prefill_attention(torch.randn(3, 4, 64), keys, keys, 0, None)  # 3 heads over 2 K/V heads
    with pytest.raises(ValueError):
        cpu_prefill_attention.prefill_attention(torch.randn(4, 10, 64).bfloat16(), keys, keys, 2, None)  # mixed dtypes


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_backend_attends_chunks_through_it_with_the_plain_forwards_logits(arch, monkeypatch):
    calls = []
    kernel = cpu_prefill_attention.prefill_attention
    monkeypatch.setattr(cpu_prefill_attention, "prefill_attention", lambda *a: calls.append(a[3]) or kernel(*a))
    model, reference = tiny_model(arch, hidden_size=256)  # heads of 64, as the kernel takes
    backend = TorchBackend(model, f"tiny-{arch}", "cpu")
    rng = np.random.default_rng(7)
    requests = [Request(tuple(int(t) for t in rng.integers(0, 512, size=n)), 4) for n in (70, 9, 33)]
    record = engine.run(backend, make_strategy("chunked", 16), requests, 3, keep_logits=True)
    assert 0 in calls and max(calls) >= 64  # whole prompts and chunks at an offset
    assert backend.metadata()["prefill_attention"] == "compiled C kernel"
    for req, rec in zip(requests, record.requests):
        expected = reference_logits(reference, list(req.prompt) + rec.tokens[:-1])[len(req.prompt) - 1 :]
        torch.testing.assert_close(torch.tensor(np.stack(rec.logits)), expected, atol=2e-4, rtol=1e-4)


def test_without_a_compiler_sdpa_attends(monkeypatch, tmp_path):
    # No compiler builds none of the kernels: the whole step takes torch's paths.
    for kernels in (cpu_prefill_attention.KERNEL, cpu_decode_attention.KERNEL, cpu_few_rows.KERNEL, cpu_layer_ops.KERNELS):
        forget_build(monkeypatch, kernels, tmp_path, compiler="no-such-compiler")
    assert cpu_prefill_attention.status().startswith("off (build failed")
    model, reference = tiny_model("llama", hidden_size=256)
    backend = TorchBackend(model, "tiny-llama", "cpu")
    prompt = tuple(range(3, 30))
    record = engine.run(backend, make_strategy("sequential", 4), [Request(prompt, 3)], 1, keep_logits=True)
    expected = reference_logits(reference, list(prompt) + record.requests[0].tokens[:-1])[len(prompt) - 1 :]
    torch.testing.assert_close(torch.tensor(np.stack(record.requests[0].logits)), expected, atol=2e-4, rtol=1e-4)
    assert backend.metadata()["prefill_attention"].startswith("SDPA; kernel off (build failed")
    assert backend.metadata()["decode_plan"].startswith("off (layer ops kernel off (build failed")


def test_a_bfloat16_backend_attends_chunks_through_it_as_close_to_float32_as_sdpa(monkeypatch):
    # The same chunked run in bf16 with the kernel and with SDPA, each against the float32 model: bf16 rounding
    # moves both, and the kernel (float32 sums, one rounding) must be no further off than SDPA is.
    model, reference = tiny_model("llama", hidden_size=256)
    backend = TorchBackend(model.to(torch.bfloat16), "tiny-llama", "cpu")
    rng = np.random.default_rng(3)
    requests = [Request(tuple(int(t) for t in rng.integers(0, 512, size=n)), 1) for n in (70, 9, 33)]
    calls = []
    kernel = cpu_prefill_attention.prefill_attention
    monkeypatch.setattr(cpu_prefill_attention, "prefill_attention", lambda *a: calls.append(a[3]) or kernel(*a))
    with_kernel = engine.run(backend, make_strategy("chunked", 16), requests, 3, keep_logits=True)
    assert 0 in calls and max(calls) >= 64
    monkeypatch.setattr(cpu_prefill_attention, "applies", lambda *a: False)
    with_sdpa = engine.run(backend, make_strategy("chunked", 16), requests, 3, keep_logits=True)
    for req, a, b in zip(requests, with_kernel.requests, with_sdpa.requests):
        exact = reference_logits(reference, list(req.prompt))[-1]
        off_kernel = float((torch.tensor(a.logits[0]) - exact).abs().max())
        off_sdpa = float((torch.tensor(b.logits[0]) - exact).abs().max())
        assert off_kernel <= 1.5 * off_sdpa + 0.02

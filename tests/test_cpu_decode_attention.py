"""The compiled CPU decode-attention kernel computes what softmax(q Kᵀ) V computes, and the backend uses it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from prefillbench.backends.torch.cpu import decode_attention as cpu_decode_attention
from prefillbench.backends.torch import fused as torch_fused
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.step import DecodeToken, PrefillChunk, Step
from kernel_builds import forget_build
from parity import assert_logits_match
from tiny_models import tiny_model


def reference(q, k_cache, v_cache, slots, positions, scaling):
    """Each decode alone through SDPA over its own slot's positions 0 .. p."""
    out = []
    for i, (slot, p) in enumerate(zip(slots.tolist(), positions.tolist())):
        k, v = k_cache[slot, :, : p + 1], v_cache[slot, :, : p + 1]
        out.append(F.scaled_dot_product_attention(q[i, :, None], k, v, scale=scaling, enable_gqa=True)[:, 0])
    return torch.stack(out)


def test_the_kernel_builds_here():
    # CI has a C compiler: a build that fails must fail a test, not fall back unseen.
    assert cpu_decode_attention.status() == ""


# (heads, kv heads, head dim): SmolLM2's 9/3/64, a Llama-8B-like group of 4 at 128, no grouping at an odd width;
# then the AVX-512 path's edges: groups whose V sums take two passes (8 at 64) or end in a part pass (7 at 128),
# one query per K/V head at 64, and a group past the sizes it is compiled for (12), which takes the plain loop.
SHAPES = [(9, 3, 64), (8, 2, 128), (4, 4, 24), (8, 1, 64), (7, 1, 128), (2, 2, 64), (12, 1, 64)]


@pytest.mark.parametrize("heads,kv_heads,dim", SHAPES)
def test_kernel_matches_sdpa_at_every_length(heads, kv_heads, dim):
    gen = torch.Generator().manual_seed(heads * dim)
    n_slots, max_len = 7, 300
    k_cache = torch.randn(n_slots, kv_heads, max_len, dim, generator=gen)
    v_cache = torch.randn(n_slots, kv_heads, max_len, dim, generator=gen)
    # Unordered, non-consecutive slots; position 0 (one key: a span of the two is empty), an odd count, the last position.
    slots = torch.tensor([5, 0, 3, 6, 1])
    positions = torch.tensor([0, 1, 150, max_len - 1, 8])
    q = torch.randn(len(slots), heads, dim, generator=gen) * 3  # sharp softmaxes too
    got = cpu_decode_attention.decode_attention(q, k_cache, v_cache, slots, positions, dim**-0.5)
    want = reference(q, k_cache, v_cache, slots, positions, dim**-0.5)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_a_non_contiguous_query_is_read_correctly():
    k_cache, v_cache = torch.randn(3, 2, 40, 16), torch.randn(3, 2, 40, 16)
    q = torch.randn(6, 4, 16).transpose(0, 1)  # [4 decodes, 6 heads, 16]: a strided view, as the packed step passes it
    slots, positions = torch.tensor([2, 0, 1, 0]), torch.tensor([39, 3, 17, 20])
    got = cpu_decode_attention.decode_attention(q, k_cache, v_cache, slots, positions, 0.25)
    torch.testing.assert_close(got, reference(q, k_cache, v_cache, slots, positions, 0.25), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 2, 128)])
def test_a_bfloat16_cache_is_read_as_its_float32_values(heads, kv_heads, dim):
    # The kernel widens bf16 to float32 exactly and computes in float32: the reference gets the same inputs widened.
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache = (torch.randn(4, kv_heads, 200, dim, generator=gen).bfloat16() for _ in range(2))
    q = torch.randn(3, heads, dim, generator=gen).bfloat16()
    slots, positions = torch.tensor([3, 1, 0]), torch.tensor([199, 0, 64])
    got = cpu_decode_attention.decode_attention(q, k_cache, v_cache, slots, positions, 0.125)
    assert got.dtype == torch.bfloat16
    want = reference(q.float(), k_cache.float(), v_cache.float(), slots, positions, 0.125)
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)  # one bf16 rounding of the output


def test_only_float32_and_bfloat16_cpu_caches_take_the_kernel():
    q, cache = torch.randn(1, 2, 8), torch.randn(1, 2, 4, 8)
    assert cpu_decode_attention.applies(q, cache)
    assert cpu_decode_attention.applies(q.bfloat16(), cache.bfloat16())
    assert not cpu_decode_attention.applies(q.half(), cache.half())


def _decode_steps(backend: TorchBackend, prompts):
    """Prefill each prompt in its own slot, then one decode-only step of all: its logits."""
    for i, p in enumerate(prompts):
        backend.execute(Step(prefills=(PrefillChunk(i, p, 0, is_last=True),)))
    step = Step(decodes=tuple(DecodeToken(i, 7, len(p)) for i, p in enumerate(prompts)))
    return backend.execute(step, return_logits=True).logits


def test_backend_decodes_through_the_kernel_with_the_matmul_path_logits(monkeypatch):
    monkeypatch.setenv("PREFILLBENCH_DECODE_PLAN", "0")  # the eager path's attention (the plan is tested on its own)
    model, reference = tiny_model("llama")
    backend = TorchBackend(model, "tiny-llama", "cpu")
    prompts = [tuple(range(3, 40)), tuple(range(5, 12)), tuple(range(1, 60))]
    backend.prepare(len(prompts), 128, 512)
    calls = []
    for name in ("decode_attention", "stage_and_attend"):  # the fused decoder stages decodes and attends in one call
        kernel = getattr(cpu_decode_attention, name)
        monkeypatch.setattr(cpu_decode_attention, name, lambda *a, kernel=kernel: calls.append(1) or kernel(*a))
    with_kernel = _decode_steps(backend, prompts)
    assert len(calls) == backend.n_layers  # one call per layer covers every decode of the step
    assert backend.metadata()["decode_attention"] == "compiled C kernel"

    backend.prepare(len(prompts), 128, 512)  # a fresh cache
    monkeypatch.setattr(cpu_decode_attention.KERNEL, "_status", "off (test)")
    calls.clear()
    without = _decode_steps(backend, prompts)
    assert not calls
    assert backend.metadata()["decode_attention"] == "matmuls/SDPA; kernel off (test)"
    for seq in with_kernel:
        assert_logits_match(with_kernel[seq], without[seq], reference, prompts[seq] + (7,))


def test_without_a_compiler_the_kernel_is_off_with_the_reason(monkeypatch, tmp_path):
    forget_build(monkeypatch, cpu_decode_attention.KERNEL, tmp_path, compiler="no-such-compiler")  # nothing built there yet
    assert cpu_decode_attention.status().startswith("off (build failed")
    assert not cpu_decode_attention.applies(torch.randn(1, 2, 8), torch.randn(1, 2, 4, 8))


def test_the_build_is_cached_per_source_and_machine(monkeypatch, tmp_path):
    forget_build(monkeypatch, cpu_decode_attention.KERNEL, tmp_path)
    assert cpu_decode_attention.status() == ""
    built = list((tmp_path / "prefillbench").glob("decode_attention-*.so"))
    assert len(built) == 1
    monkeypatch.setattr(cpu_decode_attention.KERNEL, "_status", None)
    assert cpu_decode_attention.status() == ""  # loaded from the cache: no second file, no temporary left
    assert list((tmp_path / "prefillbench").iterdir()) == built


def test_a_header_the_kernels_share_is_part_of_the_build_key(monkeypatch, tmp_path):
    """A change to bf16.h must rebuild the kernels that include it, not load a stale library."""
    import shutil

    from prefillbench.backends.torch.cpu import build as c_kernels

    source_dir = tmp_path / "src"
    source_dir.mkdir()
    source = Path(shutil.copy(cpu_decode_attention.KERNEL.source, source_dir))
    header = Path(shutil.copy(cpu_decode_attention.KERNEL.source.with_name("bf16.h"), source_dir))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    c_kernels._build(source)
    header.write_text(header.read_text() + "\n/* changed */\n")
    c_kernels._build(source)
    assert len(list((tmp_path / "cache" / "prefillbench").glob("decode_attention-*.so"))) == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staging_decodes_from_the_fused_product_writes_and_attends_as_index_put_does(monkeypatch, dtype):
    # A mixed step (a chunk at an offset, decodes in shuffled slots) through stage_and_attend, and again
    # through the unfused write (index_put) and decode_attention: the same logits and the same caches.
    monkeypatch.setenv("PREFILLBENCH_DECODE_PLAN", "0")
    model, _ = tiny_model("llama")
    backend = TorchBackend(model.to(dtype), "tiny-llama", "cpu")
    prompts = [tuple(range(3, 40)), tuple(range(5, 12)), tuple(range(1, 60)), tuple(range(7, 30))]
    staged = []
    stage = cpu_decode_attention.stage_and_attend
    monkeypatch.setattr(cpu_decode_attention, "stage_and_attend", lambda *a: staged.append(1) or stage(*a))

    def mixed_step():
        backend.prepare(len(prompts), 128, 512)  # a fresh cache
        for i, p in enumerate(prompts[1:], start=1):
            backend.execute(Step(prefills=(PrefillChunk(i, p, 0, is_last=True),)))
        backend.execute(Step(prefills=(PrefillChunk(0, prompts[0][:20], 0, is_last=False),)))
        step = Step(prefills=(PrefillChunk(0, prompts[0][20:], 20, is_last=True),),
                    decodes=tuple(DecodeToken(i, 7, len(prompts[i])) for i in (3, 1, 2)))
        logits = backend.execute(step, return_logits=True).logits
        return logits, [c.clone() for c in backend.cache.keys + backend.cache.values]

    with_staging, caches_staged = mixed_step()
    assert len(staged) == backend.n_layers
    monkeypatch.setattr(torch_fused.CLayerOps, "rotates_in_place", False)  # the fused product is not handed over
    staged.clear()
    without, caches = mixed_step()
    assert not staged
    for a, b in zip(caches_staged, caches):
        assert torch.equal(a, b)
    for seq in with_staging:
        np.testing.assert_array_equal(with_staging[seq], without[seq])

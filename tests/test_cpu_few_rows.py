"""Products of a few rows by packed weights (cpu_few_rows) compute what F.linear computes, and the tuner can route to them."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from prefillbench import engine
from prefillbench.backends.torch.cpu import few_rows as cpu_few_rows
from prefillbench.backends.torch.cpu import huge_pages
from prefillbench.backends.torch import linear as torch_linear
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.backends.torch.linear import LinearKernels
from prefillbench.sequence import Request
from strategies import make_strategy
from kernel_builds import forget_build
from tiny_models import reference_logits, tiny_model

PACKED = "few_rows_packed"


def test_the_kernel_builds_here():
    # CI has a C compiler: a build that fails must fail a test, not fall back unseen.
    assert cpu_few_rows.status() == ""


def test_pack_lays_blocks_of_four_rows_64_bytes_at_a_time():
    for dtype, per_unit in ((torch.float32, 16), (torch.bfloat16, 32)):
        w = torch.arange(8 * 64, dtype=torch.float32).view(8, 64).to(dtype)
        [packed] = cpu_few_rows.pack([w])
        expected = w.view(2, 4, 64 // per_unit, per_unit).permute(0, 2, 1, 3).reshape(-1)
        assert torch.equal(packed.reshape(-1), expected)


@pytest.mark.parametrize("bias", [False, True])
# widths of 2, 1, 6 and 3 steps of 16: the one-row loop takes steps in pairs, so 16 and 48 end on a lone step
@pytest.mark.parametrize("shape", [(48, 32), (8, 16), (1004, 96), (12, 48)])
def test_float32_products_of_one_to_eight_rows_match_f_linear(shape, bias):
    torch.manual_seed(0)
    w = torch.randn(shape)
    b = torch.randn(shape[0]) if bias else None
    [packed] = cpu_few_rows.pack([w])
    for rows in range(1, cpu_few_rows.MAX_ROWS + 1):
        x = torch.randn(rows, shape[1])
        torch.testing.assert_close(cpu_few_rows.multiply(x, packed, b), F.linear(x, w, b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_bfloat16_products_round_once_like_torchs(bias):
    torch.manual_seed(0)
    w = (torch.randn(256, 576) * 0.05).bfloat16()
    b = torch.randn(256).bfloat16() if bias else None
    [packed] = cpu_few_rows.pack([w])
    for rows in (1, 3, 4, 5, 8):
        x = torch.randn(rows, 576).bfloat16()
        got, expected = cpu_few_rows.multiply(x, packed, b), F.linear(x, w, b)
        assert got.dtype == torch.bfloat16
        # float32 sums in another order: at most one unit in the last place apart, most of them equal
        torch.testing.assert_close(got.float(), expected.float(), atol=0.0, rtol=2**-7)
        assert (got == expected).float().mean() > 0.9


def test_several_weights_share_one_buffer_and_each_multiplies_as_its_own():
    torch.manual_seed(0)
    weights = [torch.randn(12, 32) for _ in range(3)]
    packed = cpu_few_rows.pack(weights)
    assert len({p.untyped_storage().data_ptr() for p in packed}) == 1
    x = torch.randn(2, 32)
    for w, p in zip(weights, packed):
        torch.testing.assert_close(cpu_few_rows.multiply(x, p, None), x @ w.T, atol=1e-5, rtol=1e-5)


def test_shapes_and_inputs_it_cannot_take_are_refused():
    assert not cpu_few_rows.applies(torch.randn(10, 32))  # 10 rows do not fill blocks of 4
    assert not cpu_few_rows.applies(torch.randn(8, 24))  # 96 bytes a row: not whole 64-byte units
    assert not cpu_few_rows.applies(torch.randn(8, 32).half())
    assert cpu_few_rows.applies(torch.randn(8, 32)) and cpu_few_rows.applies(torch.randn(8, 32).bfloat16())
    with pytest.raises(ValueError):
        cpu_few_rows.pack([torch.randn(10, 32)])
    [packed] = cpu_few_rows.pack([torch.randn(8, 32)])
    for x in (torch.randn(9, 32), torch.randn(0, 32), torch.randn(2, 16), torch.randn(2, 32).bfloat16()):
        with pytest.raises(ValueError):
            cpu_few_rows.multiply(x, packed, None)


def _mapping_flags(address: int) -> list[str]:
    """The VmFlags of the mapping holding `address` (smaps)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    return []


def test_huge_page_tensors_are_aligned_and_advised_into_huge_pages():
    a, b = huge_pages.empty([(3, 5), (1 << 20,)], torch.float32)
    assert a.data_ptr() % huge_pages.HUGE_PAGE == 0 and b.data_ptr() % 64 == 0
    assert a.is_contiguous() and b.is_contiguous() and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    b.fill_(2.0)
    assert b.sum().item() == 2.0 * (1 << 20)
    # "hg": advised MADV_HUGEPAGE. Whether the kernel found free 2 MB pages depends on the machine's memory, not on us.
    assert "hg" in _mapping_flags(b.data_ptr())


def test_the_tuner_routes_a_few_rows_to_the_packed_kernel_with_the_plain_forwards_logits(monkeypatch):
    """Every product of 1-8 rows forced through the packed kernel: a chunked run's logits still match transformers'."""
    pick = LinearKernels._pick

    def packed_where_it_applies(self, x, layer):
        pick(self, x, layer)  # packs the kind's weights, as timing it would
        return PACKED if torch_linear._applies(PACKED, layer, x.shape[0]) else "linear"

    monkeypatch.setattr(LinearKernels, "_pick", packed_where_it_applies)
    model, reference = tiny_model("qwen2")  # q/k/v with a bias
    backend = TorchBackend(model, "tiny-qwen2", "cpu")
    calls = []
    multiply = cpu_few_rows.multiply
    monkeypatch.setattr(cpu_few_rows, "multiply", lambda *a: calls.append(a[0].shape[0]) or multiply(*a))
    rng = np.random.default_rng(3)
    requests = [Request(tuple(int(t) for t in rng.integers(0, 512, size=n)), 5) for n in (9, 3, 14, 6)]
    record = engine.run(backend, make_strategy("chunked", 4), requests, 3, keep_logits=True)
    assert 1 in calls and 3 in calls and max(calls) <= cpu_few_rows.MAX_ROWS  # decode steps, small mixed ones
    chosen = backend.linear_kernels.summary()
    assert all(name == PACKED for key, name in chosen.items() if int(key.split("@")[1]) <= cpu_few_rows.MAX_ROWS)
    for req, rec in zip(requests, record.requests):
        expected = reference_logits(reference, list(req.prompt) + rec.tokens[:-1])[len(req.prompt) - 1 :]
        torch.testing.assert_close(torch.tensor(np.stack(rec.logits)), expected, atol=2e-4, rtol=1e-4)


def test_packed_copies_are_kept_only_for_the_kinds_that_chose_them(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 32))
    kernels = LinearKernels()
    kernels.install(model)
    wide = next(kind for kind in kernels.layers if kind[0] == 64)
    pick = LinearKernels._pick
    monkeypatch.setattr(LinearKernels, "_pick", lambda self, x, layer: pick(self, x, layer) and (
        PACKED if layer.kind == wide and x.shape[0] == 2 else "linear"))
    kernels.tune_ahead(4, 1)
    assert [t.few_rows is not None for kind in kernels.layers for t in kernels.layers[kind]] == [True, False]


def test_without_a_compiler_the_tuner_leaves_it_out(monkeypatch, tmp_path):
    forget_build(monkeypatch, cpu_few_rows.KERNEL, tmp_path, compiler="no-such-compiler")
    assert cpu_few_rows.status().startswith("off (build failed")
    assert not torch_linear._applies(PACKED, torch_linear.TunedWeight(torch.randn(8, 32), None), 2)

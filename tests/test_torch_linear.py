"""The row-count-dependent linear kernels compute what F.linear computes, and the tuner routes every layer."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from prefillbench.backends.torch.cpu import few_rows as cpu_few_rows
from prefillbench.backends.torch.linear import KERNELS, LARGE_ROW_KERNELS, LARGE_ROWS, LinearKernels, TunedWeight, _applies, row_bucket


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 8, 17])
@pytest.mark.parametrize("name", list(KERNELS))
def test_every_kernel_computes_x_times_weight_transposed(name, rows, bias):
    torch.manual_seed(0)
    w, b, x = torch.randn(48, 32), torch.randn(48) if bias else None, torch.randn(rows, 32)
    layer = TunedWeight(w, b, w.t().contiguous())
    if not _applies(name, layer, rows):  # the tuner never offers it these rows
        assert name == "few_rows_packed" and rows > cpu_few_rows.MAX_ROWS
        return
    out = KERNELS[name](x, layer)
    assert out.shape == (rows, 48) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, w, b), atol=1e-5, rtol=1e-5)


def test_tuner_routes_every_linear_and_remembers_one_choice_per_shape_and_bucket():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32, bias=False), nn.Linear(32, 100, bias=False))
    kernels = LinearKernels()
    assert kernels.install(model, transposed_for={model[3]}) == 3
    for rows in (1, 2, 5, 40, 100):
        x = torch.randn(1, rows, 32)
        with torch.inference_mode():
            got = model(x)
            h = torch.relu(F.linear(x, model[0].weight, model[0].bias))
            expected = F.linear(F.linear(h, model[2].weight), model[3].weight)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    chosen = kernels.summary()
    # Three shapes, five buckets (100 rows shares the one large bucket); only the head may use its transposed copy.
    assert len(chosen) == 15 and set(chosen.values()) <= set(KERNELS)
    assert all(name != "transposed_weight" for key, name in chosen.items() if "+T" not in key)
    assert all(name in LARGE_ROW_KERNELS for key, name in chosen.items() if key.endswith(f"@{LARGE_ROWS}"))
    assert [row_bucket(n) for n in (1, 8, 9, 16, 17, 33, 64, 65, 4096)] == [1, 8, 16, 16, 32, 64, 64, LARGE_ROWS, LARGE_ROWS]


def test_split_rows_kernels_apply_only_where_their_blocks_divide_the_rows():
    from prefillbench.backends.torch.linear import _applies

    w = torch.randn(100, 8)
    layer = TunedWeight(w, None)
    assert _applies("split_rows_2", layer, 4) and _applies("split_rows_4", layer, 4)
    assert not _applies("split_rows_8", layer, 4)  # 100 rows do not split into 8 blocks
    assert not _applies("transposed_weight", layer, 4) and _applies("transposed_weight", TunedWeight(w, None, w.t().contiguous()), 4)
    # Prompt-sized products: only F.linear and the oneDNN product compete (the rest exist for a few rows).
    assert [n for n in KERNELS if _applies(n, layer, LARGE_ROWS)] == list(LARGE_ROW_KERNELS)
    assert not _applies("onednn_packed", TunedWeight(w.half(), None), 4)  # no oneDNN fp16 product on this path


def test_onednn_copies_are_kept_only_for_the_kinds_that_chose_them(monkeypatch):
    model = nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 32))
    kernels = LinearKernels()
    kernels.install(model)
    wide = next(kind for kind in kernels.layers if kind[0] == 64)

    def pick(self, x, layer):
        layer.onednn_weight()  # timing it makes the copy, as the real tuner does
        return "onednn_packed" if layer.kind == wide and x.shape[0] == LARGE_ROWS else "linear"

    monkeypatch.setattr(LinearKernels, "_pick", pick)
    kernels.tune_ahead(200, 1)
    assert kernels.choice[(wide, LARGE_ROWS)] == "onednn_packed"
    assert [t.onednn is not None for kind in kernels.layers for t in kernels.layers[kind]] == [True, False]
    with torch.inference_mode():
        x = torch.randn(1, 150, 32)
        expected = F.linear(F.linear(x, model[0].weight, model[0].bias), model[1].weight, model[1].bias)
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


def test_prepare_picks_every_kernel_a_run_can_need_so_no_timed_step_tunes(monkeypatch):
    """A chunked run brings row counts (a short chunk plus decodes) that its warm-up may not: they are tuned in prepare()."""
    from prefillbench import engine
    from prefillbench.backends.torch.backend import TorchBackend
    from prefillbench.sequence import Request
    from strategies import make_strategy
    from tiny_models import TEST_DEVICE, tiny_model

    model, _ = tiny_model("llama")
    backend = TorchBackend(model, "tiny-llama", TEST_DEVICE)
    backend.prepare(3, 64, 40)
    kernels = backend.linear_kernels
    head = {kind for kind in kernels.layers if kind[3]}
    assert head  # the LM head has its transposed copy
    for kind in kernels.layers:
        expected = [1, 2, 3] if kind in head else [*range(1, 9), 16, 32, 64]  # 40 step tokens: buckets up to 64
        assert sorted(rows for k, rows in kernels.choice if k == kind) == expected
    backend.prepare(3, 256, 200)  # a longer step adds the one bucket of prompt-sized products
    assert all(sorted(rows for k, rows in kernels.choice if k == kind)[-1] == (3 if kind in head else LARGE_ROWS)
               for kind in kernels.layers)

    picks = []
    monkeypatch.setattr(LinearKernels, "_pick", lambda self, x, layer: picks.append(x.shape[0]) or "linear")
    requests = [Request(tuple(range(1, 1 + n)), 4) for n in (3, 9, 2, 5)]
    engine.run(backend, make_strategy("chunked", 4), requests, 3)
    assert picks == []

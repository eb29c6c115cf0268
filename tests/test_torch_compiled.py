"""--compile: decode-only steps through inductor graphs compute what a plain forward pass computes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from prefillbench import engine
from prefillbench.backends.torch import attention as torch_attention
from prefillbench.backends.base import BackendError
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.backends.torch.compiled import CompiledDecode
from prefillbench.cli import main
from prefillbench.sequence import Request
from strategies import make_strategy
from tiny_models import TEST_DEVICE, reference_logits, tiny_model

pytestmark = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="--compile is the CPU's; CUDA replays CUDA graphs")


def _requests(lengths: tuple[int, ...], n_gen: int, seed: int = 5) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(tuple(int(t) for t in rng.integers(0, 512, size=n)), n_gen) for n in lengths]


def _assert_matches_reference(record, requests, reference) -> None:
    for req, rec in zip(requests, record.requests):
        full = list(req.prompt) + rec.tokens[:-1]
        expected = reference_logits(reference, full)[len(req.prompt) - 1 :]
        torch.testing.assert_close(torch.tensor(np.stack(rec.logits)), expected, atol=2e-4, rtol=1e-4)
        assert rec.tokens == expected.argmax(-1).tolist()


@pytest.fixture(scope="module", params=["llama", "qwen2"])  # qwen2: q/k/v with a bias
def compiled_pair(request):
    model, reference = tiny_model(request.param)
    backend = TorchBackend(model, f"tiny-{request.param}", "cpu", compile_decode=True)
    backend.prepare(4, 64, 64)  # compiles here: one graph for 1 sequence, one for 2 and more
    return backend, reference


@pytest.mark.parametrize("strategy,concurrency", [("sequential", 1), ("sequential", 3), ("chunked", 4), ("orca", 2)])
def test_compiled_decode_steps_match_plain_forward(compiled_pair, strategy, concurrency, monkeypatch):
    backend, reference = compiled_pair
    calls = []
    real_call = CompiledDecode.__call__
    monkeypatch.setattr(CompiledDecode, "__call__", lambda self, tokens, *a: calls.append(len(tokens)) or real_call(self, tokens, *a))
    requests = _requests((9, 3, 14, 6), n_gen=6)
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    record = engine.run(backend, make_strategy(strategy, 4), requests, concurrency, keep_logits=True)
    _assert_matches_reference(record, requests, reference)
    assert calls and max(calls) <= concurrency  # the decode-only steps ran compiled
    if strategy == "sequential":
        assert max(calls) == concurrency
    # prepare() compiled every graph a run needs: nothing compiles while steps are timed.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == before
    assert "compiled in" in backend.metadata()["compile"]


def test_matmul_decode_attention_matches_plain_forward(monkeypatch):
    """Long CPU contexts attend through two matmuls; forced from position 1 here, on GQA heads and ragged runs."""
    monkeypatch.setattr(torch_attention, "MATMUL_ATTENTION_FROM", 1)
    model, reference = tiny_model("llama")
    backend = TorchBackend(model, "tiny-llama", "cpu")
    requests = _requests((11, 4, 17, 2, 8), n_gen=5, seed=9)
    record = engine.run(backend, make_strategy("chunked", 5), requests, 3, keep_logits=True)
    _assert_matches_reference(record, requests, reference)


def test_compile_needs_a_fusable_decoder():
    model, _ = tiny_model("phi3")
    with pytest.raises(BackendError, match="--compile needs a Llama-family decoder"):
        TorchBackend(model, "tiny-phi3", "cpu", compile_decode=True)


def test_compile_on_another_backend_is_a_one_line_error(capsys):
    assert main(["run", "--backend", "sim", "--compile", "-p", "16", "-n", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["prefillbench: error: --compile applies to --backend torch, not sim"]

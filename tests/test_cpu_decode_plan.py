"""cpu_decode_plan: decode-only steps as one list of C calls must compute what the eager path computes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from prefillbench import engine
from prefillbench.backends.torch.cpu import decode_plan as cpu_decode_plan
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.step import DecodeToken, PrefillChunk, Step
from prefillbench.sequence import Request
from strategies import make_strategy
from parity import assert_logits_match
from tiny_models import reference_logits, tiny_model

PROMPTS = [tuple(range(3, 40)), tuple(range(5, 12)), tuple(range(1, 60)), tuple(range(9, 30)), tuple(range(2, 5)),
           tuple(range(7, 50)), tuple(range(4, 25)), tuple(range(6, 16)), tuple(range(8, 13))]


def _prefilled(model, n: int) -> TorchBackend:
    backend = TorchBackend(model, "tiny", "cpu")
    backend.prepare(n, 128, 512)
    for i, p in enumerate(PROMPTS[:n]):
        backend.execute(Step(prefills=(PrefillChunk(i, p, 0, is_last=True),)))
    return backend


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: q/k/v biases
@pytest.mark.parametrize("order", [[0], [2, 0, 1], [4, 8, 1, 6, 0, 3, 7, 2]])  # slots out of order, ragged positions
def test_a_decode_step_matches_the_eager_path_in_logits_and_cache(arch, order):
    model, reference = tiny_model(arch)
    planned, eager = _prefilled(model, 9), _prefilled(model, 9)
    eager.decode_plan = None
    assert planned.decode_plan is not None and planned.metadata()["decode_plan"] == "on, 1-8 decodes"
    step = Step(decodes=tuple(DecodeToken(i, 11 + i, len(PROMPTS[i])) for i in order))
    calls = []
    run = planned.decode_plan.run
    planned.decode_plan.run = lambda *a: calls.append(1) or run(*a)
    got, expected = planned.execute(step, return_logits=True).logits, eager.execute(step, return_logits=True).logits
    assert calls == [1]
    for i in order:
        assert_logits_match(got[i], expected[i], reference, PROMPTS[i] + (11 + i,))
        transformers_logits = reference_logits(reference, list(PROMPTS[i]) + [11 + i])[-1]
        torch.testing.assert_close(torch.tensor(got[i]), transformers_logits, atol=2e-4, rtol=1e-4)
    for layer in range(planned.n_layers):  # the step's K/V were written where the eager path writes them
        for mine, theirs in ((planned.cache.keys[layer], eager.cache.keys[layer]), (planned.cache.values[layer], eager.cache.values[layer])):
            torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)


def test_bfloat16_steps_stay_as_close_to_float32_as_the_eager_path():
    model, reference = tiny_model("llama")
    bf16 = model.to(torch.bfloat16)
    planned, eager = _prefilled(bf16, 4), _prefilled(bf16, 4)
    eager.decode_plan = None
    assert planned.decode_plan is not None
    step = Step(decodes=tuple(DecodeToken(i, 5, len(PROMPTS[i])) for i in (3, 1, 0)))
    got, expected = planned.execute(step, return_logits=True).logits, eager.execute(step, return_logits=True).logits
    for i in (3, 1, 0):
        exact = reference_logits(reference, list(PROMPTS[i]) + [5])[-1].numpy()
        # the same rounding at every op but the products' summation order: well inside the bf16 tolerance (1.0)
        assert np.abs(got[i] - exact).max() <= np.abs(expected[i] - exact).max() + 0.1
        assert np.abs(got[i] - expected[i]).max() < 0.25


def test_returned_logits_outlive_the_next_step():
    # The plan's logits live in a static buffer that the next step of as many decodes overwrites.
    model, _ = tiny_model("llama")
    backend = _prefilled(model, 2)
    first = backend.execute(Step(decodes=(DecodeToken(0, 5, len(PROMPTS[0])),)), return_logits=True).logits[0]
    snapshot = first.copy()
    second = backend.execute(Step(decodes=(DecodeToken(1, 6, len(PROMPTS[1])),)), return_logits=True).logits[1]
    assert not np.array_equal(second, snapshot)
    np.testing.assert_array_equal(first, snapshot)


def test_only_decode_only_steps_of_up_to_eight_take_it_and_a_chunked_run_still_matches_transformers():
    model, reference = tiny_model("llama")
    backend = TorchBackend(model, "tiny", "cpu")
    sizes = []
    backend.prepare(10, 128, 512)
    run = backend.decode_plan.run
    backend.decode_plan.run = lambda tokens, *a: sizes.append(len(tokens)) or run(tokens, *a)
    requests = [Request(PROMPTS[i % len(PROMPTS)], 4) for i in range(10)]
    record = engine.run(backend, make_strategy("chunked", 16), requests, 10, keep_logits=True)
    assert sizes and max(sizes) <= cpu_decode_plan.MAX_BATCH  # steps of 9-10 decodes and mixed steps ran eagerly
    for req, rec in zip(requests, record.requests):
        expected = reference_logits(reference, list(req.prompt) + rec.tokens[:-1])[len(req.prompt) - 1:]
        torch.testing.assert_close(torch.tensor(np.stack(rec.logits)), expected, atol=2e-4, rtol=1e-4)


def test_it_can_be_switched_off_and_says_why(monkeypatch):
    model, _ = tiny_model("llama")
    monkeypatch.setenv(cpu_decode_plan.SWITCH, "0")
    backend = _prefilled(model, 1)
    assert backend.decode_plan is None and backend.metadata()["decode_plan"] == f"off ({cpu_decode_plan.SWITCH}=0)"
    monkeypatch.delenv(cpu_decode_plan.SWITCH)
    declined = TorchBackend(model, "tiny", "cpu", decode_plan=False)
    declined.prepare(1, 64, 64)
    assert declined.decode_plan is None and declined.metadata()["decode_plan"] == "off (decode_plan=False)"
    untuned = TorchBackend(tiny_model("llama")[0], "tiny", "cpu", tune_linear=False)
    untuned.prepare(1, 64, 64)
    assert untuned.decode_plan is None and untuned.metadata()["decode_plan"].startswith("off (the kernel tuner is off")

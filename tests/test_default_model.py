"""The shipped SmolLM2-135M-Instruct, end to end on the torch backend."""
from __future__ import annotations

import pytest
import torch

from prefillbench import generate
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.models import default_model_path


@pytest.fixture(scope="module")
def smollm():
    return TorchBackend.load(default_model_path(), device="cpu")


def test_default_model_is_found_without_importing_llm():
    import sys

    path = default_model_path()
    assert path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert "llm" not in sys.modules


def test_every_strategy_matches_transformers_generate(smollm):
    prompts = [[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 28], [1, 504, 3458, 282, 4649, 314], list(range(200, 237))]
    model = smollm.model
    expected = []
    model.config._attn_implementation = "sdpa"
    try:
        with torch.inference_mode():
            for p in prompts:
                out = model.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, min_new_tokens=8)
                expected.append(out[0, len(p):].tolist())
    finally:
        model.config._attn_implementation = "prefillbench"
    for strategy in ("sequential", "padded", "chunked"):
        got = generate(prompts, model=smollm, strategy=strategy, chunk_size=16, max_new_tokens=8)
        assert got == expected, strategy

"""Tiny random-weight causal LMs for logic tests: built in memory, no download."""
from __future__ import annotations

import copy
import os

import torch

#: Where the torch tests run: cpu, or cuda on a GPU machine (benchmarks/gpu/check.sh sets it).
TEST_DEVICE = os.environ.get("PREFILLBENCH_TEST_DEVICE", "cpu")

ARCHITECTURES = ("llama", "qwen2")
#: Also checked, more briefly: other families that share the decoder-only layout.
MORE_ARCHITECTURES = ("mistral", "phi3", "qwen3", "gemma")


def tiny_config(arch: str = "llama", vocab_size: int = 512, **overrides):
    from transformers import AutoConfig

    common = dict(
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        # A wide init keeps greedy choices away from ties, so strategies can be
        # compared token for token.
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    common.update(overrides)
    return AutoConfig.for_model(arch, **common)


def tiny_model(arch: str = "llama", seed: int = 0, **overrides):
    """A (model for prefillbench, identical reference model with stock SDPA attention) pair."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(arch, **overrides)
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval().to(TEST_DEVICE)
    reference = copy.deepcopy(model)
    return model, reference


@torch.inference_mode()
def reference_logits(reference, tokens: list[int]) -> torch.Tensor:
    """Logits of a plain transformers forward over the whole sequence: [len, vocab]."""
    return reference(input_ids=torch.tensor([tokens], device=reference.device)).logits[0].float().cpu()

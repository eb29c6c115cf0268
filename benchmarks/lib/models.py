"""Models built from a config with random weights (nothing to download), and what a model's steps cost by its shapes."""
from __future__ import annotations

from dataclasses import dataclass

import torch

#: Random-weight models built from a config, for devices with no model on disk (GPU checks) and quick checks.
CONFIGS = {
    # Llama-3.2-1B's shapes.
    "llama-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                     tie_word_embeddings=True, rope_theta=500000.0),
    # Llama-3.1-8B's shapes.
    "llama-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                     tie_word_embeddings=False, rope_theta=500000.0),
    # SmolLM2-135M's shapes (the default model), for a quick run without its file.
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
                         tie_word_embeddings=True),
    # A Llama of the tests' tiny size, grouped-query attention included: a check's logic in seconds on a CPU.
    "tiny": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024, tie_word_embeddings=False),
}


def build_from_config(name: str, dtype: torch.dtype, device: str):
    """CONFIGS[name] as a transformers causal LM with seeded random weights, built on `device`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(CONFIGS[name])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def matmul_params(model) -> tuple[int, int]:
    """(weights of all linear layers but the LM head, LM head weights): what a token multiplies by."""
    head = model.get_output_embeddings()
    body = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    return body, head.weight.numel()


@dataclass(frozen=True)
class StepCosts:
    """What a model's steps compute and read, from its shapes: the floors a step's time is held against."""

    body: int  # weights of the linear layers but the LM head
    head: int  # LM head weights
    n_layers: int
    q_width: int  # query heads x head width
    kv_heads: int
    head_dim: int
    elt: int  # bytes per weight and per cached value

    @classmethod
    def of(cls, backend) -> "StepCosts":
        """A TorchBackend's model."""
        body, head = matmul_params(backend.model)
        cfg = backend.model.config.get_text_config()
        return cls(body, head, backend.n_layers, backend.head_dim * cfg.num_attention_heads, backend.kv_heads,
                   backend.head_dim, torch.finfo(backend.dtype).bits // 8)

    @property
    def weight_bytes(self) -> int:
        """Every weight a decode step multiplies by, read once."""
        return (self.body + self.head) * self.elt

    def product_flops(self, tokens: int, emitting: int = 1) -> float:
        """The linear layers over `tokens` rows, the LM head over the `emitting` rows that need a next token."""
        return 2 * tokens * self.body + 2 * emitting * self.head

    def attention_flops(self, tokens: int) -> float:
        """A causal prompt of `tokens` from position 0: QK and PV over half the square each."""
        return 2 * self.n_layers * self.q_width * tokens**2

    def kv_bytes(self, sequences: int, context: int) -> float:
        """The K and V that `sequences` decodes at `context` positions read, every layer."""
        return sequences * self.n_layers * 2 * self.kv_heads * context * self.head_dim * self.elt


#: SmolLM2-135M's attention (query heads, K/V heads, head width, layers): the attention kernel benchmarks' inputs.
HEADS, KV_HEADS, DIM, LAYERS = 9, 3, 64, 30

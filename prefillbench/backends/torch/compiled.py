"""Decode-only steps compiled by inductor on the CPU (`--compile`).

Eager, a CPU decode step is its weight products plus some 400 small ops, each
a dispatch and a pass over memory of its own. Compiled with inductor's freezing
and its C++ GEMM template (`max_autotune`), the weights become constants packed
for the kernels, the small ops fuse, and products of a few rows stream their
weights at the memory's speed, which the BLAS does not do for 2-16 rows
(README: torch performance). Attention stays outside the graph, as one opaque
op per layer over the static cache (`prefillbench::decode_attention`), so one
graph serves every context length.

Two graphs are compiled (one sequence; any batch of two or more) before any
step is timed (`warm`); steps with prompt tokens run eagerly. The compiled module holds the model's own
weights as parameters (views, no copy); the packed constants are inductor's.
"""
from __future__ import annotations

import time

import torch
import torch._inductor.config
import torch.fx.experimental._config
import torch.nn.functional as F
from torch import Tensor, nn

from prefillbench.backends.torch.attention import DecodeRun, decode_runs, write_and_attend_decodes
from prefillbench.backends.torch.fused import FusedDecoder

#: Inductor settings the graphs are compiled under (patched around each call: a recompile can happen on any).
#: freezing makes the weights constants, which the C++ GEMM template needs (it packs them at compile time);
#: ATEN stays a candidate so that a product the template cannot take still compiles.
#: The autotuner's reports off: stdout and stderr belong to the tables and the progress bar.
INDUCTOR_CONFIG = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                   "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}


class ActiveRuns:
    """The decode runs of the step being executed.

    The attention op's arguments can only be tensors and numbers; the runs
    (slices of the cache and their masks) are the same for every layer, so
    they are built once per step and read from here.
    """

    runs: list[DecodeRun] = []


def _decode_attention(q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor,
                      slots: Tensor, positions: Tensor, scaling: float) -> Tensor:
    out = torch.empty_like(q)
    write_and_attend_decodes(q, k, v, k_cache, v_cache, slots, positions, ActiveRuns.runs, scaling, out)
    return out


# Defined through torch.library.Library rather than the custom_op decorator: a decode step calls it
# once per layer, and the decorator's Python wrapping cost ~60 us a call, 1.9 ms of a 27 ms step.
_LIBRARY = torch.library.Library("prefillbench", "DEF")
_LIBRARY.define("decode_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, "
                "Tensor slots, Tensor positions, float scaling) -> Tensor")
_LIBRARY.impl("decode_attention", _decode_attention, "CPU")


@torch.library.register_fake("prefillbench::decode_attention")
def _decode_attention_shape(q, k, v, k_cache, v_cache, slots, positions, scaling):
    return torch.empty_like(q)


decode_attention = torch.ops.prefillbench.decode_attention


class DecodeModel(nn.Module):
    """A fused Llama-family decoder's decode step, written for tracing: [m] tokens in, [m, vocab] logits out."""

    def __init__(self, fused: FusedDecoder, lm_head: nn.Module) -> None:
        super().__init__()
        d = fused.decoder
        self.embed_tokens, self.rotary_emb, self.norm = d.embed_tokens, d.rotary_emb, d.norm
        self.rotate = fused.rotary
        self.lm_head = lm_head
        self.layers = nn.ModuleList()
        first = fused.layers[0]
        self.qkv_sizes = first.qkv_sizes
        self.head_dim = first.module.self_attn.head_dim
        self.scaling = first.module.self_attn.scaling
        for f in fused.layers:
            layer = nn.Module()
            layer.input_layernorm = f.module.input_layernorm
            layer.post_attention_layernorm = f.module.post_attention_layernorm
            layer.o_proj, layer.down_proj = f.module.self_attn.o_proj, f.module.mlp.down_proj
            # Parameters over the fused tensors (same storage): freezing folds parameters, not plain tensors.
            layer.qkv = nn.Parameter(f.qkv.weight, requires_grad=False)
            layer.qkv_bias = None if f.qkv.bias is None else nn.Parameter(f.qkv.bias, requires_grad=False)
            layer.gate_up = nn.Parameter(f.gate_up.weight, requires_grad=False)
            self.layers.append(layer)

    def forward(self, tokens: Tensor, positions: Tensor, slots: Tensor, keys: list[Tensor], values: list[Tensor]) -> Tensor:
        m = tokens.shape[0]
        hidden = self.embed_tokens(tokens)[None]
        cos, sin = (t[0] for t in self.rotary_emb(hidden, position_ids=positions[None]))  # [m, D]
        for i, layer in enumerate(self.layers):
            qkv = F.linear(layer.input_layernorm(hidden[0]), layer.qkv, layer.qkv_bias)
            q, k, v = (t.view(m, -1, self.head_dim) for t in qkv.split(self.qkv_sizes, dim=-1))
            q, k = self.rotate(q, k, cos, sin, unsqueeze_dim=1)  # [m, heads, D]: broadcast over heads
            out = decode_attention(q, k, v, keys[i], values[i], slots, positions, self.scaling)
            hidden = hidden + F.linear(out.view(1, m, -1), layer.o_proj.weight)
            gate, up = F.linear(layer.post_attention_layernorm(hidden), layer.gate_up).chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, layer.down_proj.weight)
        return F.linear(self.norm(hidden)[0], self.lm_head.weight, self.lm_head.bias)


class CompiledDecode:
    """Decode-only steps through inductor-compiled graphs; `warm` compiles them ahead of timing."""

    def __init__(self, fused: FusedDecoder, lm_head: nn.Module) -> None:
        self.model = DecodeModel(fused, lm_head).eval()
        # dynamic: one graph for every batch size of 2 or more, one for 1 (dynamo specializes sizes 0 and 1).
        # Measured: 52 s and 67 s to compile them; static graphs cost ~55 s per batch size.
        self.graph = torch.compile(self.model, dynamic=True, fullgraph=True)
        self.batch_sizes: set[int] = set()
        self.compile_s = 0.0

    def __call__(self, tokens: Tensor, positions: Tensor, slots: list[int], keys: list[Tensor], values: list[Tensor]) -> Tensor:
        ActiveRuns.runs = decode_runs(slots, positions, keys[0].dtype)
        # no_grad: inductor freezes parameters only when no gradient can be asked for. No duck sizing: a
        # cache whose length happened to equal its head count would tie the two and recompile later.
        with torch.no_grad(), torch._inductor.config.patch(INDUCTOR_CONFIG), torch.fx.experimental._config.patch(use_duck_shape=False):
            return self.graph(tokens, positions, torch.tensor(slots, device=tokens.device), keys, values)

    def warm(self, batch_sizes: range, scratch_slot: int, keys: list[Tensor], values: list[Tensor]) -> None:
        """Compile the graphs for `batch_sizes` not compiled yet, on the cache's scratch slot, so no timed step pays for it."""
        for m in batch_sizes:
            if m in self.batch_sizes:
                continue
            t0 = time.perf_counter()
            # Inputs made and passed as execute() makes and passes them: inference tensors differ from
            # others in dynamo's guards, as do two arguments that are one tensor, and a guard that fails recompiles in the middle of a timed run.
            with torch.inference_mode():
                tokens, positions = (torch.zeros(m, dtype=torch.long, device=keys[0].device) for _ in range(2))
                self(tokens, positions, [scratch_slot] * m, keys, values)
            self.compile_s += time.perf_counter() - t0
            self.batch_sizes.add(m)

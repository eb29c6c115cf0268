"""Decode-only steps on the CPU as one list of C calls over static buffers: the CPU's counterpart of
torch_graphs' CUDA graphs.

A decode step of the default model does ~1 ms of arithmetic outside its products, yet its eager
forward took 3.9-4.5 ms beside them (fp32, one sequence, 2 threads; measured by timing the step with
every product replaced by a preallocated result): ~12 torch ops and C calls a layer, each paying
Python, dispatch and allocation, plus 8 us of kernel choice and checks around each of 121 products.
Every op of the fused decoder already has a C kernel here (few_rows' products, layer_ops' norms,
rotary and SiLU gate, the decode attention), so a step of m decodes can be written down once per m,
as nano-vllm captures a graph per batch size: each call with its arguments bound to static input
and output buffers, replayed by one loop. Each step only fills the inputs (embeddings, rotary
cos/sin, slots, positions).

The same kernels as the eager path, except the products: all go through few_rows (the tuner may pick
another kernel per shape for the eager path), so logits agree to float rounding, not bit for bit.
Applies to the fused Llama-family decoder on the CPU in float32 or bfloat16, 1-8 decodes, with the
kernel tuner on and every C kernel built; `PREFILLBENCH_DECODE_PLAN=0` turns it off.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from prefillbench.backends.torch.cpu import decode_attention as cpu_decode_attention
from prefillbench.backends.torch.cpu import few_rows as cpu_few_rows
from prefillbench.backends.torch.cpu import layer_ops as cpu_layer_ops
from prefillbench.backends.torch.fused import FusedDecoder
from prefillbench.backends.torch.linear import LinearKernels

SWITCH = "PREFILLBENCH_DECODE_PLAN"
#: The most decodes a plan takes: the most rows few_rows multiplies in one call. Plans of 12 and 16 decodes, their
#: products in groups of 8, were tried: 0.975x and 1.01x the eager step's time (oneDNN reads each weight once).
MAX_BATCH = cpu_few_rows.MAX_ROWS


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


@dataclass
class _Product:
    """One linear layer as the plan multiplies it: the weight packed for few_rows, and its bias."""

    packed: torch.Tensor
    bias: torch.Tensor | None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.packed.shape)


@dataclass
class _Program:
    """The calls of one step of a given number of decodes, and the static buffers they read and write."""

    calls: list[tuple[Callable, tuple]]
    residual: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor
    buffers: list[torch.Tensor]  # every other buffer the bound addresses point into, alive as long as the calls


class CpuDecodePlan:
    """Programs per batch size (built on first use) over one KV cache; rebuilt with the cache."""

    def __init__(self, fused: FusedDecoder, products: dict[str, list[_Product]], lm_head: _Product, dtype: torch.dtype) -> None:
        self.fused, self.products, self.lm_head, self.dtype = fused, products, lm_head, dtype
        self.cache = None
        self.programs: dict[int, _Program] = {}
        layers = fused.layers
        self.norms = [(f.module.input_layernorm, f.module.post_attention_layernorm) for f in layers]
        self.final_norm = fused.decoder.norm
        # Norm weights kept in another dtype are cast once, as CLayerOps casts them every call.
        self.norm_weights = [tuple(n.weight.to(dtype).contiguous() for n in pair) for pair in self.norms]
        self.final_weight = self.final_norm.weight.to(dtype).contiguous()

    @classmethod
    def build(cls, fused: FusedDecoder | None, lm_head: nn.Module, kernels: LinearKernels, device: torch.device,
              dtype: torch.dtype) -> tuple["CpuDecodePlan | None", str]:
        """The plan, and "on"; or None and why it is off."""
        if os.environ.get(SWITCH, "1") == "0":
            return None, f"off ({SWITCH}=0)"
        if device.type != "cpu" or dtype not in cpu_few_rows.DTYPES:
            return None, "off (CPU float32 and bfloat16 only)"
        if fused is None or not fused.c_layer_ops:
            return None, "off (needs the fused Llama-family decoder and its compiled layer ops)"
        if not kernels.tune:
            return None, "off (the kernel tuner is off: products stay F.linear)"
        for name, status in (("layer ops", cpu_layer_ops.status()), ("decode attention", cpu_decode_attention.status()),
                             ("few_rows", cpu_few_rows.status())):
            if status:
                return None, f"off ({name} kernel {status})"

        if lm_head not in kernels.by_module:  # o_proj and down_proj are plain nn.Linear in every fusable layer
            return None, "off (the LM head is not a plain linear layer)"
        tuned = kernels.by_module
        weights = {
            "qkv": [f.qkv for f in fused.layers],
            "o": [tuned[f.module.self_attn.o_proj] for f in fused.layers],
            "gate_up": [f.gate_up for f in fused.layers],
            "down": [tuned[f.module.mlp.down_proj] for f in fused.layers],
        }
        head = tuned[lm_head]
        refused = [tuple(w.weight.shape) for w in [head, *(w for ws in weights.values() for w in ws)] if not cpu_few_rows.applies(w.weight)]
        if refused:
            return None, f"off (few_rows does not take weights of shape {refused[0]})"
        # few_rows_weight() keeps the packed copy on the TunedWeight: shared with the tuner's, never made twice.
        products = {k: [_Product(w.few_rows_weight(), w.bias) for w in ws] for k, ws in weights.items()}
        return cls(fused, products, _Product(head.few_rows_weight(), head.bias), dtype), f"on, 1-{MAX_BATCH} decodes"

    def bind(self, cache) -> None:
        """Run over `cache` (packed.KVCache) from now on: programs bound to another cache's addresses go."""
        if cache is not self.cache:
            self.cache = cache
            self.programs.clear()

    @staticmethod
    def fits(n_prefills: int, n_decodes: int) -> bool:
        return n_prefills == 0 and 1 <= n_decodes <= MAX_BATCH

    def run(self, tokens: list[int], positions: list[int], slots: list[int]) -> torch.Tensor:
        """Logits [m, vocab] of one decode step: decode i feeds tokens[i] at positions[i] in cache slot slots[i].
        A static buffer, overwritten by the next step of as many decodes."""
        m = len(tokens)
        if m not in self.programs:
            self.programs[m] = self._program(m)
        program = self.programs[m]
        decoder = self.fused.decoder
        program.slots.copy_(torch.tensor(slots))
        program.positions.copy_(torch.tensor(positions))
        program.residual.copy_(decoder.embed_tokens(torch.tensor(tokens)))
        cos, sin = decoder.rotary_emb(program.residual, position_ids=program.positions[None])
        program.cos.copy_(cos[0])
        program.sin.copy_(sin[0])
        for fn, args in program.calls:
            fn(*args)
        return program.logits

    def _program(self, m: int) -> _Program:
        dt, bf16 = self.dtype, int(self.dtype == torch.bfloat16)
        threads = torch.get_num_threads()  # the backend's, set when it loads
        first = self.fused.layers[0].module.self_attn
        dim = first.head_dim
        hidden = self.products["o"][0].shape[0]
        inner = self.products["down"][0].shape[1]
        heads, kv_heads = (s // dim for s in self.fused.layers[0].qkv_sizes[:2])
        width = self.products["qkv"][0].shape[0]

        def buffer(columns: int, dtype: torch.dtype = dt) -> torch.Tensor:
            return torch.zeros(m, columns, dtype=dtype)

        residual, normed, qkv = buffer(hidden), buffer(hidden), buffer(width)
        query, attended = buffer(heads * dim, torch.float32), buffer(heads * dim, torch.float32)
        attended_dt = attended if not bf16 else buffer(heads * dim)
        o_out, gate_up, act, down = buffer(hidden), buffer(2 * inner), buffer(inner), buffer(hidden)
        logits = buffer(self.lm_head.shape[0])
        cos, sin = buffer(dim), buffer(dim)
        slots, positions = torch.zeros(m, dtype=torch.long), torch.zeros(m, dtype=torch.long)

        ops, attention, few_rows = cpu_layer_ops.KERNELS.library, cpu_decode_attention.KERNEL.library, cpu_few_rows.KERNEL.library

        def product(p: _Product, x: torch.Tensor, y: torch.Tensor) -> tuple[Callable, tuple]:
            n, k = p.shape
            return few_rows.few_rows, (x.data_ptr(), p.packed.data_ptr(), _ptr(p.bias), y.data_ptr(), m, n, k, bf16, threads)

        def norm(delta: torch.Tensor | None, weight: torch.Tensor, module: nn.Module) -> tuple[Callable, tuple]:
            return ops.add_rms_norm, (residual.data_ptr(), _ptr(delta), weight.data_ptr(), normed.data_ptr(), m, hidden,
                                      module.variance_epsilon, bf16)

        calls: list[tuple[Callable, tuple]] = []
        delta = None
        for i, f in enumerate(self.fused.layers):
            attn = f.module.self_attn
            k_cache, v_cache = self.cache.keys[i], self.cache.values[i]
            (w_in, w_post), (n_in, n_post) = self.norm_weights[i], self.norms[i]
            calls += [
                norm(delta, w_in, n_in),
                product(self.products["qkv"][i], normed, qkv),
                (ops.rotary, (qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), m, width, heads + kv_heads, dim, bf16)),
                (attention.stage_decode_qkv, (qkv.data_ptr(), m, width, heads, kv_heads, dim, query.data_ptr(), k_cache.data_ptr(),
                                              v_cache.data_ptr(), slots.data_ptr(), positions.data_ptr(), self.cache.max_len, bf16)),
                (attention.decode_attention, (query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(),
                                              positions.data_ptr(), m, heads, kv_heads, self.cache.max_len, dim, attn.scaling,
                                              cpu_decode_attention.PARTS, attended.data_ptr(), bf16)),
            ]
            if bf16:  # rounded as the eager path's .to(q.dtype) rounds
                calls.append((attended_dt.copy_, (attended,)))
            calls += [
                product(self.products["o"][i], attended_dt, o_out),
                norm(o_out, w_post, n_post),
                product(self.products["gate_up"][i], normed, gate_up),
                (ops.silu_mul, (gate_up.data_ptr(), act.data_ptr(), m, inner, bf16)),
                product(self.products["down"][i], act, down),
            ]
            delta = down
        calls += [norm(delta, self.final_weight, self.final_norm), product(self.lm_head, normed, logits)]
        return _Program(calls, residual, cos, sin, slots, positions, logits,
                        [normed, qkv, query, attended, attended_dt, o_out, gate_up, act, down])

"""The packed step as attention sees it: where each token's K/V go (StepLayout), the static per-slot KV
cache (KVCache), and the attention function registered with transformers that reads both.

Every token of a step is packed into one [1, T] row (prefillbench.step.pack); transformers runs the
model's own modules over it, and each attention layer calls `packed_attention` with the step's layout.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prefillbench.backends.torch.attention import DecodeRun, QueryBlock, write_and_attend_decodes
from prefillbench.backends.torch.cpu import decode_attention as cpu_decode_attention
from prefillbench.backends.torch.cpu import huge_pages
from prefillbench.backends.torch.cpu import prefill_attention as cpu_prefill_attention
from prefillbench.backends.torch.routes import RouteLayout

#: The name transformers knows our attention by (config._attn_implementation).
ATTENTION_NAME = "prefillbench"


@dataclass
class ChunkSpan:
    """One prefill chunk of a packed step: its rows, where its K/V go, what it attends to."""

    slot: int
    start: int  # first position
    row: int  # first packed row
    length: int  # tokens, pads included
    blocks: list[QueryBlock]  # its SDPA calls: usually one; none when the prefill kernel attends


@dataclass
class StepLayout:
    """Where each token of a packed step lives; built once per step, used by every layer."""

    chunks: list[ChunkSpan]
    decode_from: int  # decodes occupy packed rows [decode_from, T)
    decode_slots: torch.Tensor  # [m] cache slot of each decode
    decode_positions: torch.Tensor  # [m]
    decode_runs: list[DecodeRun]
    cache: "KVCache"
    prefill_kernel: bool = False  # chunks attend through cpu_prefill_attention, one call each
    calls: int = 0

    @property
    def single_call(self) -> bool:
        """One chunk attending in one call: its output is the step's."""
        return (len(self.chunks) == 1 and not self.decode_runs
                and (self.prefill_kernel or len(self.chunks[0].blocks) == 1))


class KVCache:
    """One K and one V tensor per layer: [slots + 1, kv_heads, max_len, head_dim].

    The last slot is scratch: the padding rows of a CUDA-graph decode write there.
    `heads_first` (the CUDA routes'): stored [kv_heads, slots + 1, max_len, head_dim] and
    handed out as the same view, so that flex.flat_cache can lay every slot end to end.
    """

    def __init__(self, n_layers: int, n_slots: int, kv_heads: int, max_len: int, head_dim: int, dtype, device,
                 heads_first: bool = False, huge: bool = True) -> None:
        shape = (n_slots + 1, kv_heads, max_len, head_dim)
        if heads_first:
            def zeros() -> torch.Tensor:
                return torch.zeros((kv_heads, n_slots + 1, max_len, head_dim), dtype=dtype, device=device).transpose(0, 1)
        elif torch.device(device).type == "cpu" and huge:
            # Decode attention streams through the cache: 2 MB pages read faster. A buffer each: --compile's
            # graphs take every layer's K and V as inputs that mutate, and inputs sharing one storage gave wrong logits.
            def zeros() -> torch.Tensor:
                return huge_pages.empty([shape], dtype)[0].zero_()
        else:
            def zeros() -> torch.Tensor:
                return torch.zeros(shape, dtype=dtype, device=device)
        self.keys = [zeros() for _ in range(n_layers)]
        self.values = [zeros() for _ in range(n_layers)]
        self.n_slots, self.max_len = n_slots, max_len
        self.scratch_slot = n_slots

    def fits(self, n_slots: int, max_len: int) -> bool:
        return self.n_slots >= n_slots and self.max_len >= max_len


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, pb_layout: "StepLayout | RouteLayout | None" = None,
                     pb_qkv: torch.Tensor | None = None, **kwargs):
    """Attention over a packed step; registered with transformers' AttentionInterface.

    Each chunk attends with one SDPA call over a view of its own slot's cache;
    each run of decodes in consecutive slots with one call over a slice of the
    cache. Nothing is gathered: the cost follows the K/V actually read.
    `pb_qkv` (the fused decoder's): the rotated q|k|v product [1, T, width] that
    query, key and value are views of, from which the CPU kernel stages decodes.
    """
    if pb_layout is None:
        raise RuntimeError("prefillbench attention called without a step layout")
    layout = pb_layout
    layout.calls += 1
    k_cache = layout.cache.keys[module.layer_idx]
    v_cache = layout.cache.values[module.layer_idx]
    q, k, v = query[0], key[0], value[0]  # [heads, T, D]
    if isinstance(layout, RouteLayout):
        return layout.route.attend(q, k, v, k_cache, v_cache, layout.meta, scaling).unsqueeze(0), None
    for c in layout.chunks:
        k_cache[c.slot, :, c.start : c.start + c.length] = k[:, c.row : c.row + c.length]
        v_cache[c.slot, :, c.start : c.start + c.length] = v[:, c.row : c.row + c.length]
    out = None if layout.single_call else q.new_empty((q.shape[1], q.shape[0], q.shape[2]))  # [T, heads, D]
    for c in layout.chunks:
        if layout.prefill_kernel:
            rows = slice(c.row, c.row + c.length)
            o = cpu_prefill_attention.prefill_attention(q[:, rows], k_cache[c.slot], v_cache[c.slot], c.start, scaling)
            if out is None:
                return o.unsqueeze(0), None
            out[rows] = o
            continue
        for b in c.blocks:
            rows = slice(c.row + b.first, c.row + b.first + b.length)
            o = F.scaled_dot_product_attention(
                q[None, :, rows], k_cache[c.slot, None, :, : b.kv_len], v_cache[c.slot, None, :, : b.kv_len],
                attn_mask=b.mask, is_causal=b.mask is None, scale=scaling, enable_gqa=True,
            )[0].transpose(0, 1)  # [length, heads, D]
            if out is None:
                return o.unsqueeze(0), None
            out[rows] = o
    if layout.decode_runs:
        decodes = slice(layout.decode_from, None)
        if pb_qkv is not None and cpu_decode_attention.applies(q, k_cache):
            out[decodes] = cpu_decode_attention.stage_and_attend(pb_qkv[0, decodes], q.shape[0], k.shape[0], k_cache, v_cache,
                                                                 layout.decode_slots, layout.decode_positions, scaling)
            return out.unsqueeze(0), None
        write_and_attend_decodes(*(t[:, decodes].transpose(0, 1) for t in (q, k, v)), k_cache, v_cache, layout.decode_slots,
                                 layout.decode_positions, layout.decode_runs, scaling, out[decodes])
    return out.unsqueeze(0), None


def _no_mask(*args, **kwargs):
    # The layout carries the masks; a dense [T, T] mask would be wasted work.
    return None


def register_attention() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, packed_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)

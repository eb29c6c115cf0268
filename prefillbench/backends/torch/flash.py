"""The flash-attn CUDA route (`pip install prefillbench[cuda]`), as nano-vllm and vLLM call it.

Prompts that start at position 0 attend through `flash_attn_varlen_func` over
the step's own packed K/V (cumulative query and key lengths); a chunk at an
offset through `flash_attn_with_kvcache` over its own slot of the cache
(`cache_batch_idx`, `cache_seqlens` = its context, causal aligned to the lower
right); all decodes through one `flash_attn_with_kvcache` call, each reading
only its context. The cache is stored heads first (as for the flex route); flash
reads it through a [slots, max_len, kv_heads, D] view, which it allows (it
needs only the last dimension contiguous). Graph-capturable: the decode call
takes its context lengths and slots as tensors.

Not run in this project's tests (no GPU here, no flash-attn on the lent H200):
the flex route is the one measured.
"""
from __future__ import annotations

import importlib.util

import torch

from prefillbench.backends.torch.attention_meta import AttentionMeta


def available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


class FlashRoute:
    name = "flash"
    masked_sdpa = False

    def __init__(self) -> None:
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

        self.varlen, self.with_kvcache = flash_attn_varlen_func, flash_attn_with_kvcache

    def begin_step(self, meta: AttentionMeta) -> None:
        """Nothing to build: flash reads the contract's lengths directly."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMeta, scaling: float) -> torch.Tensor:
        """As FlexRoute.attend: q [heads, T, D], k/v [kv_heads, T, D] -> [T, heads, D]."""
        k_cache[meta.row_slots, :, meta.row_positions] = k.transpose(0, 1)
        v_cache[meta.row_slots, :, meta.row_positions] = v.transpose(0, 1)
        rows_q, rows_k, rows_v = (t.transpose(0, 1) for t in (q, k, v))  # [T, heads, D]
        kc, vc = k_cache.transpose(1, 2), v_cache.transpose(1, 2)  # [slots, max_len, kv_heads, D]
        n = meta.n_prefill
        out = q.new_empty(rows_q.shape)
        if n and meta.prompts_from_zero:
            out[:n] = self.varlen(rows_q[:n], rows_k[:n], rows_v[:n], meta.cu_seqlens_q, meta.cu_seqlens_q,
                                  meta.max_seqlen_q, meta.max_seqlen_q, softmax_scale=scaling, causal=True)
        elif n:
            for i, c in enumerate(meta.chunks):
                rows = slice(c.row, c.row + c.length)
                out[rows] = self.with_kvcache(rows_q[None, rows], kc, vc, cache_seqlens=meta.chunk_contexts[i : i + 1],
                                              cache_batch_idx=meta.chunk_slots[i : i + 1], softmax_scale=scaling, causal=True)[0]
        if meta.n_decodes:
            out[n:] = self.with_kvcache(rows_q[n:, None], kc, vc, cache_seqlens=meta.decode_contexts,
                                        cache_batch_idx=meta.decode_slots.to(torch.int32), softmax_scale=scaling)[:, 0]
        return out

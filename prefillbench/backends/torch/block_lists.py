"""FlexAttention's block lists as the flex route lays them out: tiles to and from dense masks, and the checks a
compiled kernel needs of their shapes and strides (flex.py's docstring has the layout)."""
from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask

#: Tile edge of the block masks (FlexAttention's default sparse block size).
KV_BLOCK = 128
Q_BLOCK = 128


def blocks_to_dense(num: torch.Tensor, indices: torch.Tensor, n_cols: int) -> torch.Tensor:
    """[..., rows, n_cols] bool: the tiles a (num [..., rows], indices [..., rows, k]) block list names."""
    listed = torch.arange(indices.shape[-1], device=indices.device) < num.unsqueeze(-1)
    dense = torch.zeros((*indices.shape[:-1], n_cols), dtype=torch.bool, device=indices.device)
    return dense.scatter_(-1, indices.long(), listed)


def dense_to_blocks(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(num, indices) int32 of a [..., rows, cols] bool tile mask: each row's named tiles first, in order."""
    order = torch.argsort(dense.to(torch.int8), dim=-1, descending=True, stable=True)
    return dense.sum(-1, dtype=torch.int32), order.to(torch.int32)


def layout_problems(mask: BlockMask, q_batch: int, q_len: int, kv_len: int) -> list[str]:
    """What in `mask`'s lists a compiled kernel would misread for a query [q_batch, H, q_len, D] against keys
    [1, H, kv_len, D]; empty when none. Shapes and strides only (no device sync), so a route checks its own masks
    when it warms: the Triton decode kernel reads FULL_KV_IDX with KV_IDX's strides and takes the list width from
    KV_IDX's last dimension, the forward kernels assume contiguous full lists, and inductor's CPU template asserts
    that the lists' width covers the key length."""
    problems = []
    num, idx = mask.kv_num_blocks, mask.kv_indices
    width = -(-kv_len // KV_BLOCK)
    if idx.dim() != 4 or num.dim() != 3:
        return [f"lists of {num.dim()} and {idx.dim()} dimensions, not [B, H, q_tiles] and [B, H, q_tiles, kv_tiles]"]
    if tuple(num.shape) != tuple(idx.shape[:-1]):
        problems.append(f"kv_num_blocks {tuple(num.shape)} does not match kv_indices {tuple(idx.shape)}")
    if idx.shape[0] != q_batch:
        problems.append(f"lists for a batch of {idx.shape[0]}, queries of {q_batch} (one list per decode row)")
    if idx.shape[1] != 1:
        problems.append(f"lists for {idx.shape[1]} heads, not 1 (the decode kernel takes one list for every head)")
    if idx.shape[2] != -(-q_len // Q_BLOCK):
        problems.append(f"lists for {idx.shape[2]} query tiles, queries of {q_len} rows")
    if idx.shape[3] != width:
        problems.append(f"kv_indices {idx.shape[3]} tiles wide, the key length {kv_len} is {width} tiles")
    if tuple(mask.seq_lengths) != (q_len, kv_len):
        problems.append(f"seq_lengths {tuple(mask.seq_lengths)}, the call ({q_len}, {kv_len})")
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        t = getattr(mask, name)
        if t is not None and (t.dtype != torch.int32 or not t.is_contiguous()):
            problems.append(f"{name} is {t.dtype}{'' if t.is_contiguous() else ', not contiguous'}")
    if (mask.full_kv_num_blocks is None) != (mask.full_kv_indices is None):
        problems.append("one full list without the other")
    elif mask.full_kv_indices is not None:
        for full, part, name in ((mask.full_kv_num_blocks, num, "full_kv_num_blocks"), (mask.full_kv_indices, idx, "full_kv_indices")):
            if full.shape != part.shape or full.stride() != part.stride():
                problems.append(f"{name} {tuple(full.shape)} strides {full.stride()}, the partial list's "
                                f"{tuple(part.shape)} strides {part.stride()}")
    return problems

"""Attention of decode tokens over a static per-slot KV cache, read in place.

Decodes whose sequences sit in consecutive cache slots form a run, attended in
one call over a slice of the cache; nothing is gathered, so the cost follows
the K/V actually read. On the CPU with a float32 or bfloat16 cache, all of a
step's decodes go instead through one call of the compiled kernel
(cpu_decode_attention), 1.2-3.6x faster than the better of these calls.
Shared by the eager packed step (torch_backend) and the compiled decode step
(torch_compiled). This is the CPU route's attention (routes.py): on CUDA, steps
attend through flex.py or flash.py, never through these masked SDPA calls.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prefillbench.backends.torch.cpu import decode_attention as cpu_decode_attention


@dataclass
class DecodeRun:
    """Decodes whose sequences sit in consecutive cache slots, attended in one call.

    The slots' K/V are read through a slice of the cache, in place; queries go to
    the run's slots in order.
    """

    rows: slice | torch.Tensor  # decode indices (0 .. m-1) in this run
    slots: slice  # cache slots read
    kv_len: int
    mask: torch.Tensor  # additive [n_slots_in_run, 1, 1, kv_len]: 0 where attended, -inf elsewhere


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where attended, -inf elsewhere: SDPA adds it, so it is converted once per step, not per layer."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def causal_offset_mask(start: int, length: int, dtype: torch.dtype, device) -> torch.Tensor:
    # SDPA's is_causal aligns to the upper left, which is wrong for a chunk at
    # offset start > 0: query i may see keys 0 .. start + i.
    q = torch.arange(length, device=device).unsqueeze(1)
    k = torch.arange(start + length, device=device).unsqueeze(0)
    return additive_mask(k <= q + start, dtype)


@dataclass
class QueryBlock:
    """Rows [first, first + length) of a chunk, attending to its slot's positions 0 .. kv_len - 1."""

    first: int
    length: int
    kv_len: int
    mask: torch.Tensor | None  # additive [length, kv_len]; None: plain causal (the block starts at position 0)


#: SDPA's CPU flash kernel works in K/V tiles of 512 positions and skips a tile only when it is masked
#: whole, so a causal prompt of up to 512 tokens costs its whole square. Cut into blocks of QUERY_BLOCK
#: rows, each attending only up to its last position, it costs about 5/8 of it at 512 tokens. Measured
#: on this project's 2-core CPU, whole prompt steps of SmolLM2-135M, fp32 (benchmarks/torch/query_blocks.py,
#: 9 alternated reps, paired medians): 0.97x the single call's time at 300 and 512 tokens, 1.01x at 256,
#: 1.03x at 768 and 1,024 (which already span two tiles), so only 257-512 tokens are cut. Measured on
#: that CPU only: a prompt on any other device attends in one call.
QUERY_BLOCK = 128
QUERY_BLOCKS_FOR = range(257, 513)


def chunk_query_blocks(start: int, length: int, dtype: torch.dtype, device) -> list[QueryBlock]:
    """How a chunk of `length` tokens at position `start` attends: one SDPA call, or (a causal prompt of
    257-512 tokens) one call per block of QUERY_BLOCK queries."""
    if start > 0:
        return [QueryBlock(0, length, start + length, causal_offset_mask(start, length, dtype, device))]
    if length not in QUERY_BLOCKS_FOR or torch.device(device).type != "cpu":
        return [QueryBlock(0, length, length, None)]
    blocks = [QueryBlock(0, QUERY_BLOCK, QUERY_BLOCK, None)]
    for first in range(QUERY_BLOCK, length, QUERY_BLOCK):
        n = min(QUERY_BLOCK, length - first)
        blocks.append(QueryBlock(first, n, first + n, causal_offset_mask(first, n, dtype, device)))
    return blocks


def decode_mask(positions: torch.Tensor, kv_len: int, dtype: torch.dtype) -> torch.Tensor:
    """[n, 1, 1, kv_len]: a decode at position p attends to positions 0 .. p."""
    allowed = torch.arange(kv_len, device=positions.device).unsqueeze(0) <= positions.unsqueeze(1)
    return additive_mask(allowed, dtype).view(len(positions), 1, 1, kv_len)


def decode_runs(slots: list[int], positions: torch.Tensor, dtype: torch.dtype) -> list[DecodeRun]:
    """Split decodes into runs of consecutive cache slots (usually one or two)."""
    order = sorted(range(len(slots)), key=slots.__getitem__)
    runs: list[list[int]] = []
    for i in order:
        if runs and slots[i] == slots[runs[-1][-1]] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    out = []
    for members in runs:
        in_order = members == list(range(members[0], members[0] + len(members)))
        index = torch.tensor(members, device=positions.device)
        rows = slice(members[0], members[0] + len(members)) if in_order else index
        run_positions = positions[rows]
        kv_len = int(run_positions.max()) + 1
        first = slots[members[0]]
        out.append(DecodeRun(rows, slice(first, first + len(members)), kv_len, decode_mask(run_positions, kv_len, dtype)))
    return out


#: Where the compiled kernel does not apply (fp16, no C compiler): from this many cache positions on, a CPU
#: decode attends through two matmuls instead of SDPA.
#: Measured on this project's 2-core CPU (benchmarks/cpu/decode_attention.py, fp32, SmolLM2-135M's heads,
#: 30 layers, SDPA and matmuls alternated rep by rep), matmul time / SDPA time: at 1,024 positions
#: 0.90 and 0.93 for four sequences, 0.84 and 1.09 for one; at 512, 1.04-1.26; below, SDPA's lower
#: fixed cost wins by up to 1.6x.
MATMUL_ATTENTION_FROM = 1024


def attend_decodes(q: torch.Tensor, run: DecodeRun, k_cache, v_cache, scaling) -> torch.Tensor:
    """Attention of one run's decode queries [n, heads, D] over their own slots' caches, read in place."""
    k, v = k_cache[run.slots, :, : run.kv_len], v_cache[run.slots, :, : run.kv_len]
    if q.device.type == "cpu" and run.kv_len >= MATMUL_ATTENTION_FROM:
        return _matmul_attention(q, k, v, run.mask, scaling)
    return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=run.mask, scale=scaling, enable_gqa=True).squeeze(2)


def write_and_attend_decodes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache, v_cache, slots: torch.Tensor,
                             positions: torch.Tensor, runs: list[DecodeRun], scaling, out: torch.Tensor) -> None:
    """Writes decodes' K/V [m, kv_heads, D] at their slots and positions, then attends their queries
    q [m, heads, D] run by run into out [m, heads, D]: one layer's decode attention, eager or compiled."""
    k_cache[slots, :, positions] = k
    v_cache[slots, :, positions] = v
    if runs and cpu_decode_attention.applies(q, k_cache):
        out[:] = cpu_decode_attention.decode_attention(q, k_cache, v_cache, slots, positions, scaling)
        return
    for run in runs:
        out[run.rows] = attend_decodes(q[run.rows], run, k_cache, v_cache, scaling)


def _matmul_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scaling: float) -> torch.Tensor:
    """softmax(q K^T * scaling + mask) V, each K/V head shared by its group of query heads without a copy."""
    n, heads, dim = q.shape
    kv_heads = k.shape[1]
    scores = torch.matmul(q.reshape(n, kv_heads, heads // kv_heads, dim), k.transpose(-1, -2)).mul_(scaling)
    probs = torch.softmax(scores.add_(mask), dim=-1)
    return torch.matmul(probs, v).view(n, heads, dim)

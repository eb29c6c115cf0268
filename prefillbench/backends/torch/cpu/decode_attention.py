"""Decode attention on the CPU as one compiled loop over each sequence's cache, read in place.

Every decode step attends one query per head over its own sequence's K/V. As
two batched matmuls (q·Kᵀ, then p·V) each is a product of 1-8 query rows per
K/V head, a shape the BLAS runs far from the memory's speed: measured on this
project's 2-core CPU (SmolLM2-135M's heads at 1,024 positions, 30 layers, fp32),
they read the cache at 8-13 GB/s where a plain reduction streams it at
25-29 GB/s. The loop in decode_attention.c reads each K row once for the whole
query group, takes the softmax in between (the C library's vector expf), and
reads each V row once (benchmarks/cpu/decode_attention.py compares the two). With
AVX-512, heads of 64 or 128 and groups of 1-8 (the sizes compiled in), it sums
16 keys' scores across lanes at once and keeps the V sums in registers: 0.77-0.88x
the time of the plain loop in fp32 and 0.56-0.63x with a bf16 cache
(benchmarks/cpu/kernel_revisions.py decode_attention 85209ef). A bfloat16 cache is
read as such and widened in registers; the arithmetic is float32 either way.

It is compiled on first use and cached (c_kernels); without a C compiler, with
`PREFILLBENCH_DECODE_KERNEL=0`, or for other cache dtypes (fp16), the matmul path stays.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from prefillbench.backends.torch.cpu.build import CKernels

#: Spans of positions per (decode, K/V head): two threads share even one sequence's work.
PARTS = 2


def _declare(library: ctypes.CDLL) -> None:
    fn = library.decode_attention
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5 + [ctypes.c_float, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    # the staging of a step's q, k and v (cpu_decode_plan, stage_and_attend)
    library.stage_decode_qkv.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 5 + [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 2
    library.stage_decode_qkv.restype = None


KERNEL = CKernels(Path(__file__).with_name("decode_attention.c"), "PREFILLBENCH_DECODE_KERNEL", _declare, fast_path="avx512f")


def status() -> str:
    """"" if the kernel is in use, else why not (no compiler, a failed build); builds it on first call."""
    return KERNEL.status()


#: Cache dtypes the kernel reads; it computes in float32 either way.
DTYPES = (torch.float32, torch.bfloat16)


def applies(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """float32 and bfloat16 caches on the CPU, once the kernel is built, unless the running backend refused it."""
    return q.device.type == "cpu" and k_cache.dtype in DTYPES and KERNEL.usable()


def _check_caches(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if status():
        raise RuntimeError(f"the decode attention kernel is {status()}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and v_cache.shape == k_cache.shape
            and k_cache.dtype == v_cache.dtype and k_cache.dtype in DTYPES):
        raise ValueError("the decode kernel reads whole contiguous float32 or bfloat16 caches")


def _attend(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
            positions: torch.Tensor, scaling: float) -> torch.Tensor:
    """The kernel on float32 queries [m, heads, D] and int64 slots and positions: float32 [m, heads, D]."""
    out = torch.empty_like(query)
    n_slots, kv_heads, max_len, dim = k_cache.shape
    failed = KERNEL.library.decode_attention(query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(),
                                             positions.data_ptr(), query.shape[0], query.shape[1], kv_heads, max_len, dim,
                                             scaling, PARTS, out.data_ptr(), int(k_cache.dtype == torch.bfloat16))
    if failed:
        raise MemoryError("the decode attention kernel could not allocate its partial results")
    return out


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     positions: torch.Tensor, scaling: float) -> torch.Tensor:
    """Attention of decode queries q [m, heads, D], decode i at `positions[i]` in cache slot `slots[i]`,
    over positions 0 .. positions[i] of its own slot: [m, heads, D]."""
    _check_caches(k_cache, v_cache)
    query = q.to(torch.float32).contiguous()
    slots, positions = slots.to(torch.int64).contiguous(), positions.to(torch.int64).contiguous()
    return _attend(query, k_cache, v_cache, slots, positions, scaling).to(q.dtype)


def stage_and_attend(qkv: torch.Tensor, heads: int, kv_heads: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     slots: torch.Tensor, positions: torch.Tensor, scaling: float) -> torch.Tensor:
    """Decodes given as rows of a fused, rotated q|k|v product [m, width]: each row's K and V written into
    the cache at its slot and position, then its queries attended as `decode_attention` does: [m, heads, D].

    One C pass stages them where the unfused path takes two `index_put` calls and a widening copy of q a
    layer. Small, measured (the default model, decodes at 1,024 positions, 11 alternated reps, paired
    medians, three runs): eager steps of 3 decodes 0.3-1.0 ms less (0.95-0.99x), of 16 decodes -3.0 to
    +0.3 ms, a 256-token chunk with 3 decodes -3.8 to +0.9 ms (that step's own spread is tens of ms)."""
    _check_caches(k_cache, v_cache)
    m, width = qkv.shape
    n_slots, cache_heads, max_len, dim = k_cache.shape
    if not (qkv.is_contiguous() and qkv.dtype == k_cache.dtype and cache_heads == kv_heads
            and width == (heads + 2 * kv_heads) * dim):
        raise ValueError("stage_and_attend takes contiguous q|k|v rows of the caches' heads and dtype")
    slots, positions = slots.to(torch.int64).contiguous(), positions.to(torch.int64).contiguous()
    query = torch.empty(m, heads, dim, dtype=torch.float32)
    KERNEL.library.stage_decode_qkv(qkv.data_ptr(), m, width, heads, kv_heads, dim, query.data_ptr(), k_cache.data_ptr(),
                                    v_cache.data_ptr(), slots.data_ptr(), positions.data_ptr(), max_len,
                                    int(k_cache.dtype == torch.bfloat16))
    return _attend(query, k_cache, v_cache, slots, positions, scaling).to(qkv.dtype)

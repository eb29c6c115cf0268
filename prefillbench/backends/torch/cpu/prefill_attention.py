"""A prompt chunk's causal attention on the CPU as one compiled flash-style loop (prefill_attention.c).

SDPA's CPU flash kernel runs a prompt's attention at 55-95 GFLOP/s here (SmolLM2-135M's
heads, fp32, 2 threads, counting only the causal half), about a third of the GEMM peak:
it skips key tiles above the diagonal only in whole tiles of 512 positions, and its
softmax between two small products is a larger share than in a long-K GEMM. The loop in
prefill_attention.c works in 64 x 64 tiles, touches only the tiles on or below the
diagonal, keeps each tile's 16 running sums in registers, and takes the softmax's
exponentials 16 at a time (libmvec). Measured against the SDPA calls the backend made
before (30 layers, 9/3 heads of 64, 2 threads): pp512 0.66x the time, a 256-token chunk
at offset 768 0.88x, a 1,024-token prompt 0.70x.

float32 or bfloat16 on the CPU with heads of 64 or 128; bfloat16 is widened as it is read
and summed in float32, as SDPA's CPU kernel does, so its output is one bf16 rounding of
the float32 result. Built and switched as the other kernels (c_kernels;
`PREFILLBENCH_PREFILL_KERNEL=0` turns it off, and SDPA runs).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from prefillbench.backends.torch.cpu.build import CKernels

HEAD_DIMS = (64, 128)
DTYPES = (torch.float32, torch.bfloat16)


def _declare(library: ctypes.CDLL) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int64
    library.prefill_attention.argtypes = [p, i, p, p, i, i, i, i, i, i, ctypes.c_float, p, i]
    library.prefill_attention.restype = ctypes.c_int


KERNEL = CKernels(Path(__file__).with_name("prefill_attention.c"), "PREFILLBENCH_PREFILL_KERNEL", _declare, fast_path="avx512f")


def status() -> str:
    """"" if the kernel is in use, else why not; builds it on first call."""
    return KERNEL.status()


def applies(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """A float32 or bfloat16 model (queries and cache) on the CPU with heads of 64 or 128, once the kernel is built."""
    return torch.device(device).type == "cpu" and dtype in DTYPES and head_dim in HEAD_DIMS and KERNEL.usable()


def prefill_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, scaling: float | None) -> torch.Tensor:
    """Causal attention of a chunk's queries q [heads, T, D], query t at position start + t, over one slot's
    keys and values [kv_heads, max_len, D] (positions 0 .. start + t): [T, heads, D]. Scores are scaled by
    `scaling`, or 1/sqrt(D) (SDPA's default) if None."""
    heads, length, dim = q.shape
    scaling = dim**-0.5 if scaling is None else scaling
    kv_heads, max_len, _ = keys.shape
    if status():
        raise RuntimeError(f"the prefill attention kernel is {status()}")
    if not (keys.is_contiguous() and values.is_contiguous() and values.shape == keys.shape and dim in HEAD_DIMS
            and heads % kv_heads == 0 and start + length <= max_len and q.dtype == keys.dtype == values.dtype
            and q.dtype in DTYPES):
        raise ValueError("the prefill kernel takes float32 or bfloat16 heads of 64 or 128 over a contiguous slot of the cache")
    if q.stride(0) != dim or q.stride(2) != 1:
        q = q.transpose(0, 1).contiguous().transpose(0, 1)  # rows of all heads side by side, as a qkv product lays them
    out = torch.empty(length, heads, dim, dtype=torch.float32)
    failed = KERNEL.library.prefill_attention(q.data_ptr(), q.stride(1), keys.data_ptr(), values.data_ptr(), max_len, start,
                                              length, heads, kv_heads, dim, scaling, out.data_ptr(), int(q.dtype == torch.bfloat16))
    if failed:
        raise MemoryError("the prefill attention kernel could not allocate its scratch tiles")
    return out.to(q.dtype)

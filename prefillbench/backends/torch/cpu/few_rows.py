"""Products of a few rows (1-8: decode steps) on the CPU, by weights packed for one sequential read.

A decode step reads every weight once for a handful of rows, so its products run at
the memory's read speed or not at all. Measured on this project's 2-core CPU
(SmolLM2-135M's 121 weights, fp32, 538 MB): a plain read streams at 46 GB/s, but
every product tried on nn.Linear's layout (the BLAS, oneDNN, batched row blocks, a
hand-written AVX-512 loop) read the weights at 18-23 GB/s. Two causes, each measured:
- a block of output rows read together is as many short streams (2,304 bytes a row
  here), too short for the hardware prefetcher to get ahead of;
- 4 KB pages: the same plain read ran at 31 GB/s without huge pages.
So few_rows.c reads weights packed into blocks that are one sequential stream each
(left to the hardware prefetcher: a software prefetch measured slower), and every weight of one shape is packed into one buffer
in 2 MB pages (huge_pages). The LM head alone: 22 GB/s as nn.Linear's layout, 41-45
packed in huge pages.

Built and switched as the other kernels (c_kernels; `PREFILLBENCH_FEW_ROWS_KERNEL=0`
turns it off). torch_linear's tuner times it against the torch kernels per weight
shape and row count, so it runs only where it measured fastest.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from prefillbench.backends.torch.cpu import huge_pages
from prefillbench.backends.torch.cpu.build import CKernels

DTYPES = (torch.float32, torch.bfloat16)
#: The most rows few_rows.c multiplies in one call (MAX_ROWS there).
MAX_ROWS = 8
#: Output rows per packed block and bytes of a row per block step (NB and UNIT in few_rows.c).
BLOCK_ROWS, UNIT_BYTES = 4, 64


def _declare(library: ctypes.CDLL) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int64
    library.few_rows_pack.argtypes = [p, p, i, i, i]
    library.few_rows_pack.restype = None
    library.few_rows.argtypes = [p, p, p, p, i, i, i, ctypes.c_int, ctypes.c_int]
    library.few_rows.restype = ctypes.c_int
    library.few_rows_block_rows.restype = library.few_rows_unit_bytes.restype = ctypes.c_int
    if (library.few_rows_block_rows(), library.few_rows_unit_bytes()) != (BLOCK_ROWS, UNIT_BYTES):
        raise RuntimeError("few_rows.c and cpu_few_rows.py disagree on the packed layout")


KERNEL = CKernels(Path(__file__).with_name("few_rows.c"), "PREFILLBENCH_FEW_ROWS_KERNEL", _declare, fast_path="avx512f")


def status() -> str:
    """"" if the kernel is in use, else why not; builds it on first call."""
    return KERNEL.status()


def applies(weight: torch.Tensor) -> bool:
    """A float32 or bfloat16 CPU weight whose shape the packed layout takes, once the kernel is built."""
    n, k = weight.shape
    return (weight.device.type == "cpu" and weight.dtype in DTYPES and n % BLOCK_ROWS == 0
            and (k * weight.element_size()) % UNIT_BYTES == 0 and KERNEL.usable())


def pack(weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each weight [N, K] packed for `multiply`, all into one huge-page arena (freed with the last of them)."""
    for w in weights:
        if not applies(w) or w.dtype != weights[0].dtype:
            raise ValueError(f"few_rows cannot pack a {w.dtype} weight of shape {tuple(w.shape)} (with {weights[0].dtype} ones)")
    packed = huge_pages.empty([tuple(w.shape) for w in weights], weights[0].dtype)
    for w, p in zip(weights, packed):
        KERNEL.library.few_rows_pack(w.contiguous().data_ptr(), p.data_ptr(), w.shape[0], w.shape[1], w.element_size())
    return packed


def multiply(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] @ W.T (+ bias) for 1 <= M <= MAX_ROWS, W given as `pack` left it: [M, N], x's dtype."""
    m, k = x.shape
    n = packed.shape[0]
    if not (1 <= m <= MAX_ROWS and k == packed.shape[1] and x.dtype == packed.dtype):
        raise ValueError(f"few_rows multiplies 1-{MAX_ROWS} rows of the weight's width and dtype, not {tuple(x.shape)} {x.dtype}")
    x = x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype)
    failed = KERNEL.library.few_rows(x.data_ptr(), packed.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(),
                                     m, n, k, int(x.dtype == torch.bfloat16), torch.get_num_threads())
    if failed:
        raise ValueError(f"few_rows does not take a {tuple(packed.shape)} weight")
    return out

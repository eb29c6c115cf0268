"""CPU tensors in 2 MB pages, for memory a step streams through (packed weights, the K/V cache).

A read that walks hundreds of MB through 4 KB pages misses the TLB at every page:
measured on this project's 2-core CPU, a plain read of the 113 MB LM head ran at
31 GB/s in 4 KB pages and 46 GB/s in 2 MB ones. Linux backs anonymous memory with
huge pages where it is advised to (MADV_HUGEPAGE) before the first touch, when
transparent huge pages are "always" or "madvise"; elsewhere the advice is refused
and the tensors are the same, only slower to read.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import sys

import torch

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # Linux's value on every architecture


@functools.cache
def _madvise():
    """libc's madvise, looked up once: find_library runs a subprocess, and a K/V cache asks for 2 buffers a layer."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc.madvise


def _advise(address: int, length: int) -> bool:
    if not sys.platform.startswith("linux") or length <= 0:
        return False
    return _madvise()(address, length, MADV_HUGEPAGE) == 0


def empty(shapes: list[tuple[int, ...]], dtype: torch.dtype) -> list[torch.Tensor]:
    """Uninitialized contiguous tensors of these shapes, laid one after the other in one buffer advised into
    huge pages (kept alive by the views; freed with the last of them). The first starts on a 2 MB boundary,
    every other on a 64-byte one."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    align = 64 // math.gcd(64, itemsize) * itemsize  # bytes: a multiple of 64 and of the item size
    sizes = [math.prod(s) * itemsize for s in shapes]
    padded = [-(-n // align) * align for n in sizes]
    buffer = torch.empty(sum(padded) + HUGE_PAGE, dtype=torch.uint8)
    offset = -buffer.data_ptr() % HUGE_PAGE
    _advise(buffer.data_ptr() + offset, (buffer.numel() - offset) // HUGE_PAGE * HUGE_PAGE)
    out = []
    for shape, size, step in zip(shapes, sizes, padded):
        out.append(buffer[offset : offset + size].view(dtype).view(shape))
        offset += step
    return out

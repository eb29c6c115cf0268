"""The device's own limits, measured in the same process as the steps they bound: a GEMM peak and a copy bandwidth."""
from __future__ import annotations

import ctypes
import platform
import sys

import torch

from prefillbench.backends.torch.linear import KERNELS, TunedWeight, onednn_applies

from benchmarks.lib.timing import Clock, time_interleaved


def gemm_peak(dtype: torch.dtype, device: torch.device, clock: Clock, reps: int, sizes: tuple[int, ...] | None = None) -> float:
    """FLOP/s: the best of a few large square matmuls, through every GEMM library the backend may use
    (on the CPU, MKL's `torch.mm` and oneDNN's product with a prepacked weight: the roofline is the
    device's, not one library's)."""
    sizes = sizes or ((4096, 8192) if device.type == "cuda" else (1024, 2048))
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
        products = {"mm": lambda: torch.mm(a, b)}
        if onednn_applies(b):
            weight = TunedWeight(b, None)  # a @ b.T: the same FLOPs as a @ b
            products["onednn"] = lambda: KERNELS["onednn_packed"](a, weight)
        for timing in time_interleaved(products, reps, clock).values():
            best = max(best, 2 * n**3 / min(timing.seconds))
    return best


def copy_bandwidth(device: torch.device, clock: Clock, reps: int, nbytes: int | None = None) -> float:
    """Bytes/s moved (read + write) by a large tensor copy, far larger than any cache."""
    n = nbytes or ((1 << 30) if device.type == "cuda" else (256 << 20))
    src = torch.ones(n // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = min(time_interleaved({"copy": lambda: dst.copy_(src)}, reps, clock)["copy"].seconds)
    return 2 * n / t


def hold_freed_memory() -> None:
    """Keep glibc from handing large freed blocks back to the OS between steps.

    A step allocates its activations afresh. glibc returns large frees to the OS by a threshold that
    adapts to what was freed before, so in a benchmark's mix of step kinds (which a CLI run does not
    have) the packed ragged step took 36,000-56,000 page faults a step, each 4 KB page faulted in and
    zeroed by the kernel (0.8 us a page measured here), where after a 1,024-token prompt it took none;
    three alternated pairs of processes put that step at 0.90-0.96x its time with freed memory held.
    A CLI run of the default preset faulted as often either way (558 and 554 thousand, nearly all
    loading), so holding memory here makes the steps cost what they cost in a run."""
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: glibc's largest; bigger blocks are mapped anyway
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD

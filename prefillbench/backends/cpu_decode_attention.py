"""Decode attention on the CPU as one compiled loop over each sequence's cache, read in place.

Every decode step attends one query per head over its own sequence's K/V. As
two batched matmuls (q·Kᵀ, then p·V) each is a product of 1-8 query rows per
K/V head, a shape the BLAS runs far from the memory's speed: measured on this
project's 2-core CPU (SmolLM2-135M's heads at 1,024 positions, 30 layers, fp32),
they read the cache at 8-13 GB/s where a plain reduction streams it at
25-29 GB/s. The loop in decode_attention.c reads each K row once for the whole
query group, takes the softmax in between (the C library's vector expf), and
reads each V row once (benchmarks/decode_attention.py compares the two). A
bfloat16 cache is read as such and widened in registers; the arithmetic is
float32 either way.

It is compiled here, on first use, for this machine (`-march=native`), and
cached; it runs its threads through OpenMP, which resolves to the libgomp that
torch loaded (torch's Linux wheels ship one), so they are torch's own threads. A JIT with a pool of its own
(numba was tried) lost everything it gained: the two pools' threads spun
against each other on the two cores. Without a C compiler, or for other cache
dtypes (fp16), the matmul path stays.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import sysconfig
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("decode_attention.c")
FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-shared", "-fPIC"]
#: Spans of positions per (decode, K/V head): two threads share even one sequence's work.
PARTS = 2

_library: ctypes.CDLL | None = None
_status: str | None = None  # why the kernel is not used, once known; "" when it is


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "prefillbench"


def _build() -> ctypes.CDLL:
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    compiler = compiler.split()[0]
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else platform.processor()
    flags_line = next((line for line in cpu.splitlines() if line.startswith("flags")), cpu)
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join([compiler, *FLAGS, flags_line]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"decode_attention-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([compiler, *FLAGS, "-o", str(partial), str(SOURCE), "-lm"], check=True, capture_output=True, timeout=120)
        partial.replace(target)  # atomic: a concurrent process sees the whole library or none
    library = ctypes.CDLL(str(target))
    fn = library.decode_attention
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5 + [ctypes.c_float, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    return library


def status() -> str:
    """"" if the kernel is in use, else why not (no compiler, a failed build); builds it on first call."""
    global _library, _status
    if _status is None:
        if os.environ.get("PREFILLBENCH_DECODE_KERNEL", "1") == "0":
            _status = "off (PREFILLBENCH_DECODE_KERNEL=0)"
        elif platform.system() != "Linux":
            _status = f"off (built for Linux only, not {platform.system()})"
        else:
            try:
                _library = _build()
                _status = ""
            except Exception as e:  # noqa: BLE001: no compiler, no cache folder, a failed build: the matmul path is always right
                detail = getattr(e, "stderr", b"") or b""
                first = detail.decode(errors="replace").strip().splitlines()[:1]
                _status = f"off (build failed: {first[0] if first else type(e).__name__})"
    return _status


#: Cache dtypes the kernel reads; it computes in float32 either way.
DTYPES = (torch.float32, torch.bfloat16)


def applies(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """float32 and bfloat16 caches on the CPU, once the kernel is built."""
    return q.device.type == "cpu" and k_cache.dtype in DTYPES and status() == ""


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     positions: torch.Tensor, scaling: float) -> torch.Tensor:
    """Attention of decode queries q [m, heads, D], decode i at `positions[i]` in cache slot `slots[i]`,
    over positions 0 .. positions[i] of its own slot: [m, heads, D]."""
    if status():
        raise RuntimeError(f"the decode attention kernel is {status()}")
    query = q.to(torch.float32).contiguous()
    slots = slots.to(torch.int64).contiguous()
    positions = positions.to(torch.int64).contiguous()
    out = torch.empty_like(query)
    n_slots, kv_heads, max_len, dim = k_cache.shape
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and v_cache.shape == k_cache.shape
            and k_cache.dtype == v_cache.dtype and k_cache.dtype in DTYPES):
        raise ValueError("the decode kernel reads whole contiguous float32 or bfloat16 caches")
    failed = _library.decode_attention(query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(),
                                       positions.data_ptr(), q.shape[0], q.shape[1], kv_heads, max_len, dim, scaling,
                                       PARTS, out.data_ptr(), int(k_cache.dtype == torch.bfloat16))
    if failed:
        raise MemoryError("the decode attention kernel could not allocate its partial results")
    return out.to(q.dtype)

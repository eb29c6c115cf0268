"""This package's C kernels: compiled here on first use, for this machine, cached, and loaded through ctypes.

Each source is compiled with `cc -O3 -march=native -ffast-math -fopenmp` (and linked
without -ffast-math, which would set flush-to-zero in every process that loads it) in under a
second and cached in `~/.cache/prefillbench` under a key made of the source, the
headers beside it (bf16.h), the compiler and the CPU's flags. OpenMP resolves to the libgomp that torch loaded
(torch's Linux wheels ship one), so a kernel's threads are torch's own: a JIT with
a pool of its own (numba was tried) lost what it gained to two pools spinning on
two cores. Without a C compiler, or with the kernel's switch set to 0, a kernel is
off, says why, and its callers take their torch path.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import sysconfig
from collections.abc import Callable
from pathlib import Path

FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC"]
#: Linked apart from the compile: gcc 12 links crtfastmath.o into a shared library built with
#: -ffast-math, and loading it set flush-to-zero for the whole process, torch's ops included.
LINK_FLAGS = ["-shared", "-fopenmp"]


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "prefillbench"


def _build(source: Path) -> ctypes.CDLL:
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    compiler = compiler.split()[0]
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else platform.processor()
    flags_line = next((line for line in cpu.splitlines() if line.startswith("flags")), cpu)
    # Every header beside the source counts: a kernel that includes one must rebuild when it changes.
    text = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    key = hashlib.sha256(text + " ".join([compiler, *FLAGS, *LINK_FLAGS, flags_line]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"{source.stem}-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial, obj = target.with_suffix(f".{os.getpid()}.tmp"), target.with_suffix(f".{os.getpid()}.o")
        try:
            subprocess.run([compiler, *FLAGS, "-c", "-o", str(obj), str(source)], check=True, capture_output=True, timeout=120)
            subprocess.run([compiler, *LINK_FLAGS, "-o", str(partial), str(obj), "-lm"], check=True, capture_output=True, timeout=120)
        finally:
            obj.unlink(missing_ok=True)
        partial.replace(target)  # atomic: a concurrent process sees the whole library or none
    return ctypes.CDLL(str(target))


class CKernels:
    """One C source's functions, built when first asked for; `status` is "" once they are usable."""

    def __init__(self, source: Path, switch: str, declare: Callable[[ctypes.CDLL], None]) -> None:
        self.source = source
        self.switch = switch  # environment variable: "0" turns these kernels off
        self.declare = declare  # sets the functions' ctypes signatures
        self.library: ctypes.CDLL | None = None
        self._status: str | None = None

    def status(self) -> str:
        """"" if the kernels are in use, else why not (switched off, no compiler, a failed build)."""
        if self._status is None:
            if os.environ.get(self.switch, "1") == "0":
                self._status = f"off ({self.switch}=0)"
            elif platform.system() != "Linux":
                self._status = f"off (built for Linux only, not {platform.system()})"
            else:
                try:
                    library = _build(self.source)
                    self.declare(library)
                    self.library, self._status = library, ""
                except Exception as e:  # noqa: BLE001: no compiler, no cache folder, a failed build: the torch path is always right
                    detail = getattr(e, "stderr", b"") or b""
                    first = detail.decode(errors="replace").strip().splitlines()[:1]
                    self._status = f"off (build failed: {first[0] if first else type(e).__name__})"
        return self._status

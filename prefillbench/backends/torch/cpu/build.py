"""This package's C kernels: compiled here on first use, for this machine, cached, and loaded through ctypes.

Each source is compiled with `cc -O3 -march=native -ffast-math -fopenmp` (and linked
without -ffast-math, which would set flush-to-zero in every process that loads it) in under a
second and cached in `~/.cache/prefillbench` under a key made of the source, the
headers beside it (bf16.h), the compiler and the CPU's flags. OpenMP resolves to the libgomp that torch loaded
(torch's Linux wheels ship one), so a kernel's threads are torch's own: a JIT with
a pool of its own (numba was tried) lost what it gained to two pools spinning on
two cores. Without a C compiler, or with the kernel's switch set to 0, a kernel is
off, says why, and its callers take their torch path.

`PREFILLBENCH_MARCH` (e.g. `x86-64-v3`, `x86-64-v2`) builds for another instruction set than
this CPU's (part of the cache key), so the branches an ordinary CPU compiles are tested on any.
Before a library loads, the instruction sets the compiler enables for that target are checked
against the CPU's flags: a build this CPU cannot run is off, never an illegal instruction. Each
kernel names the instruction set its fast path is written in (`fast_path`, AVX-512F for the
hand-vectorized loops); built without it, the kernel runs its plain C loops, which lost to torch
in places (the prefill kernel's ran 5-13x slower than SDPA), so the backend times them against
torch before using them (kernel_choice). A backend that runs none (`--kernels torch`) or has
timed one slower says so for the span of its own calls (`use_only`), not for the process.
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import sysconfig
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

MARCH_VARIABLE = "PREFILLBENCH_MARCH"
FLAGS = ["-O3", "-ffast-math", "-fopenmp", "-fPIC"]
#: Linked apart from the compile: gcc 12 links crtfastmath.o into a shared library built with
#: -ffast-math, and loading it set flush-to-zero for the whole process, torch's ops included.
LINK_FLAGS = ["-shared", "-fopenmp"]


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "prefillbench"


def march() -> str:
    """The -march the kernels are built for: this CPU's unless PREFILLBENCH_MARCH names another."""
    return os.environ.get(MARCH_VARIABLE, "").strip() or "native"


def _compiler() -> str:
    return (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]


def _cpu_flags_line() -> str:
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else platform.processor()
    return next((line for line in cpu.splitlines() if line.startswith("flags")), cpu)


#: The compiler's macro for each x86 instruction set a kernel may use, and /proc/cpuinfo's name for it.
ISA_MACROS = {"__AVX512F__": "avx512f", "__AVX512BW__": "avx512bw", "__AVX512VL__": "avx512vl", "__AVX512DQ__": "avx512dq",
              "__AVX512BF16__": "avx512_bf16", "__AVX2__": "avx2", "__FMA__": "fma", "__AVX__": "avx", "__F16C__": "f16c",
              "__SSE4_2__": "sse4_2"}


@functools.cache
def target_isa(compiler: str, target: str) -> frozenset[str]:
    """The instruction sets (cpuinfo's names) that `compiler -march=target` enables, read from its predefined macros."""
    done = subprocess.run([compiler, f"-march={target}", "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True,
                          timeout=60, check=True)
    defined = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("#define ")}
    return frozenset(name for macro, name in ISA_MACROS.items() if macro in defined)


def cpu_isa() -> frozenset[str]:
    """Those of ISA_MACROS' instruction sets this CPU has (its /proc/cpuinfo flags)."""
    flags = set(_cpu_flags_line().split())
    return frozenset(name for name in ISA_MACROS.values() if name in flags)


def _build(source: Path) -> ctypes.CDLL:
    compiler = _compiler()
    flags_line = _cpu_flags_line()
    flags = [f"-march={march()}", *FLAGS]
    # Every header beside the source counts: a kernel that includes one must rebuild when it changes.
    text = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    key = hashlib.sha256(text + " ".join([compiler, *flags, *LINK_FLAGS, flags_line]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"{source.stem}-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial, obj = target.with_suffix(f".{os.getpid()}.tmp"), target.with_suffix(f".{os.getpid()}.o")
        try:
            subprocess.run([compiler, *flags, "-c", "-o", str(obj), str(source)], check=True, capture_output=True, timeout=120)
            subprocess.run([compiler, *LINK_FLAGS, "-o", str(partial), str(obj), "-lm"], check=True, capture_output=True, timeout=120)
        finally:
            obj.unlink(missing_ok=True)
        partial.replace(target)  # atomic: a concurrent process sees the whole library or none
    return ctypes.CDLL(str(target))


#: The kernels a backend has decided against, for the span of its own calls (`use_only`); None: no backend's span.
_REFUSED: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar("prefillbench_refused_kernels", default=None)


@contextlib.contextmanager
def refusing(names: Collection[str]) -> Iterator[None]:
    """Within this block, the kernels named (CKernels.name) are not `usable`: a backend's own decision, which
    two backends in one process (a test, an A/B) may make differently."""
    token = _REFUSED.set(frozenset(names))
    try:
        yield
    finally:
        _REFUSED.reset(token)


class CKernels:
    """One C source's functions, built when first asked for; `status` is "" once they are usable."""

    def __init__(self, source: Path, switch: str, declare: Callable[[ctypes.CDLL], None], fast_path: str | None = None) -> None:
        self.source = source
        self.name = source.stem
        self.switch = switch  # environment variable: "0" turns these kernels off
        self.declare = declare  # sets the functions' ctypes signatures
        self.fast_path = fast_path  # the instruction set (cpuinfo's name) the source's fast branch is written in
        self.library: ctypes.CDLL | None = None
        self._status: str | None = None
        self.built_for = ""  # the -march of the library loaded
        self.isa: frozenset[str] = frozenset()  # the instruction sets it was compiled with

    def status(self) -> str:
        """"" if the kernels are in use, else why not (switched off, no compiler, a failed build, a target this CPU cannot run)."""
        if self._status is None:
            if os.environ.get(self.switch, "1") == "0":
                self._status = f"off ({self.switch}=0)"
            elif platform.system() != "Linux":
                self._status = f"off (built for Linux only, not {platform.system()})"
            else:
                try:
                    target, isa = march(), target_isa(_compiler(), march())
                    missing = sorted(isa - cpu_isa())
                    if missing:
                        self._status = f"off (built for -march={march()}, which needs {', '.join(missing)}: this CPU lacks it)"
                        return self._status
                    library = _build(self.source)
                    self.declare(library)
                    self.library, self._status, self.built_for, self.isa = library, "", target, isa
                except Exception as e:  # noqa: BLE001: no compiler, no cache folder, a failed build: the torch path is always right
                    detail = getattr(e, "stderr", b"") or b""
                    detail = detail.encode() if isinstance(detail, str) else detail
                    first = detail.decode(errors="replace").strip().splitlines()[:1]
                    self._status = f"off (build failed: {first[0] if first else type(e).__name__})"
        return self._status

    def usable(self) -> bool:
        """Built, and not refused by the backend whose call this is."""
        refused = _REFUSED.get()
        return (refused is None or self.name not in refused) and self.status() == ""

    def fast(self) -> bool:
        """Whether the build has the source's fast branch (its `fast_path` instruction set); True if it has none."""
        return self.fast_path is None or (self.status() == "" and self.fast_path in self.isa)

    def describe(self) -> str:
        """The build, for metadata: its target and whether the fast branch is in it."""
        if self.status():
            return self.status()
        if self.fast_path is None:
            return f"-march={self.built_for}"
        return f"-march={self.built_for}, {self.fast_path} {'fast path' if self.fast() else 'absent: plain C loops'}"

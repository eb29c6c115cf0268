"""Tests' way to make a C kernel build again, under a compiler and cache folder of their choosing."""
from __future__ import annotations

from pathlib import Path

from prefillbench.backends.torch.cpu.build import CKernels


def forget_build(monkeypatch, kernels: CKernels, cache_home: Path, compiler: str | None = None) -> None:
    """`kernels` unbuilt (restored after the test), built next into `cache_home`, with `compiler` if given."""
    monkeypatch.setattr(kernels, "_status", None)
    monkeypatch.setattr(kernels, "library", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    if compiler is not None:
        monkeypatch.setenv("CC", compiler)

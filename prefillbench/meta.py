"""Run metadata for exports: what ran, where, from which code, and how it was asked for; one record for every
command that measures, so a CI job can tell which commit and machine a result belongs to."""
from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

PACKAGES = ("prefillbench", "torch", "transformers", "llama_cpp_python", "numpy")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git(*args: str) -> str | None:
    """A git command's output in the tree this code came from; None outside one (an installed wheel) or without git."""
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_commit() -> str | None:
    out = _git("rev-parse", "--short", "HEAD")
    return out.strip() or None if out is not None else None


def git_dirty() -> bool | None:
    """Whether tracked files differ from the commit (a result from a dirty tree is not that commit's)."""
    out = _git("status", "--porcelain", "--untracked-files=no")
    return bool(out.strip()) if out is not None else None


def gpu_name() -> str | None:
    """The CUDA device's name where torch is already loaded and sees one; never imports torch (seconds) for it."""
    torch = sys.modules.get("torch")
    try:
        return torch.cuda.get_device_name() if torch is not None and torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken driver must not cost the results
        return None


def command_line() -> str:
    return shlex.join(["prefillbench", *sys.argv[1:]])


def run_metadata(backend_meta: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "command": command_line(),
        "cpu": cpu_name(),
        "gpu": gpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    meta.update({f"{p}_version": v for p in PACKAGES if (v := _version(p.replace("_", "-"))) is not None})
    meta.update(backend_meta)
    return meta

"""Which attention code a torch backend runs: decided once, from the device, recorded in the metadata.

- "cpu": the CPU route (backend.StepLayout, attention.py and the C kernels),
  tuned on CPUs; its chunks at an offset and its decode runs call SDPA with an
  additive mask, which is fine on a CPU and the slow math kernel on CUDA, so it
  never runs on CUDA.
- "flash": flash-attn's varlen and kv-cache kernels (flash.py), where the
  package is importable.
- "flex": FlexAttention with one block mask per step (flex.py), torch only.

`attention="flex"` (or PREFILLBENCH_ATTENTION=flex) runs the CUDA route's
attention code on a CPU, eagerly: how the tests check it here.
"""
from __future__ import annotations

import os

from prefillbench.backends.base import BackendError

ROUTES = ("auto", "flex", "flash")
ENV = "PREFILLBENCH_ATTENTION"


def choose_route(device_type: str, requested: str = "auto", flash_available: bool = False) -> str:
    """"cpu", "flex" or "flash" for a device ("cpu" or "cuda"); `requested` is auto, flex or flash."""
    if requested not in ROUTES:
        raise BackendError(f"unknown attention route {requested!r}; use {', '.join(ROUTES)}")
    if requested == "flash":
        if device_type != "cuda" or not flash_available:
            raise BackendError("attention=flash needs a CUDA device and the flash-attn package (pip install prefillbench[cuda])")
        return "flash"
    if requested == "flex":
        return "flex"
    if device_type == "cuda":
        return "flash" if flash_available else "flex"
    return "cpu"


def requested_route(option: str | None) -> str:
    """The backend option if given, else PREFILLBENCH_ATTENTION, else auto."""
    return option or os.environ.get(ENV, "").strip() or "auto"

"""Which attention code a torch backend runs: decided once, from the device, recorded in the metadata.

- "cpu": the CPU route (packed.StepLayout, attention.py and the C kernels),
  tuned on CPUs; its chunks at an offset and its decode runs call SDPA with an
  additive mask, which is fine on a CPU and the slow math kernel on CUDA, so it
  never runs on CUDA.
- "flash": flash-attn's varlen and kv-cache kernels (flash.py), where the
  package is importable.
- "flex": FlexAttention with one block mask per step (flex.py), torch only.

`attention="flex"` (or PREFILLBENCH_ATTENTION=flex) runs the CUDA route's
attention code on a CPU, eagerly: how the tests check its logic here. The flex
route compiles on CUDA; TorchBackend(..., flex_compiled=True) compiles it on a
CPU too (inductor's C++ template), which is how the tests check the compiled
kernels' reading of the block lists and that no step compiles after the warm-up.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from prefillbench.backends.base import BackendError
from prefillbench.backends.torch import flash, flex
from prefillbench.backends.torch.attention_meta import AttentionMeta
from prefillbench.backends.torch.graphs import graph_batch_sizes

Route = flex.FlexRoute | flash.FlashRoute

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


@dataclass
class RouteLayout:
    """A step on the flex or flash route: its attention contract, built once, and the route reading it."""

    route: Route
    meta: AttentionMeta
    cache: Any  # packed.KVCache
    calls: int = 0


def make_route(name: str, max_len: int, n_slots: int, device: torch.device, compiled: bool | None = None) -> Route:
    """The route over a cache of n_slots (+ scratch) x max_len positions; flex compiles on CUDA unless `compiled`
    says otherwise (True on a CPU: the tests of the compiled route)."""
    if name == "flash":
        return flash.FlashRoute()
    compiled = device.type == "cuda" if compiled is None else compiled
    return flex.FlexRoute(max_len, n_slots + 1, compiled=compiled, batch_sizes=graph_batch_sizes(n_slots))


def route_note(name: str, device_type: str, compiled: bool | None = None) -> str:
    """How the metadata and stderr name the route."""
    if name == "cpu":
        return "cpu (SDPA and the C kernels)"
    if name == "flash":
        return "flash (flash-attn varlen and kv-cache kernels)"
    compiled = device_type == "cuda" if compiled is None else compiled
    how = "compiled" if compiled else "eager"
    if device_type != "cuda":
        how += ", the CUDA route's code on a CPU"
    return f"flex (FlexAttention, one block mask per step, {how})"


def warm_route(route: Route, k_cache: torch.Tensor, v_cache: torch.Tensor, scratch_slot: int, heads: int,
               max_step_tokens: int, scaling: float) -> None:
    """Compile a compiled flex route for every shape class a step can bring (FlexRoute.warm), with the model's
    own attention scale, so that no timed step pays for a compile; nothing for the other routes."""
    if isinstance(route, flex.FlexRoute) and route.compiled:
        route.warm(k_cache, v_cache, scratch_slot, heads, max_step_tokens, scaling)

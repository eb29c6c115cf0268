"""Which of the C kernels a torch backend runs: all that build and win, or none (`--kernels torch`).

The kernels in backends/torch/cpu were measured faster than torch on an AVX-512 CPU. Elsewhere they
can lose: built for x86-64-v3 the prefill kernel's plain C loops ran 5-13x slower than SDPA on a
512-token chunk. So in `auto` each kernel that has a torch equivalent is timed against it at
prepare(), on the model's own shapes and in the cache's scratch slot, and runs only where it was
faster, as the linear tuner (linear.py) does for its products; the decision and its ratio go in the
metadata. Timing is a few calls of one layer's work per kernel (tens of milliseconds on the default
model). `PREFILLBENCH_KERNEL_DECISION` replaces the timing with a fixed answer: `kernel` (every
kernel that builds, what the kernel tests need) or `torch`.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from prefillbench.backends.torch.attention import attend_decodes, chunk_query_blocks, decode_runs
from prefillbench.backends.torch.cpu import decode_attention as cpu_decode_attention
from prefillbench.backends.torch.cpu import few_rows as cpu_few_rows
from prefillbench.backends.torch.cpu import layer_ops as cpu_layer_ops
from prefillbench.backends.torch.cpu import prefill_attention as cpu_prefill_attention
from prefillbench.backends.torch.cpu.build import CKernels, refusing
from prefillbench.backends.torch.fused import CLayerOps, FusedDecoder, TorchLayerOps

#: `--kernels`: auto, the C kernels where they build and win; torch, plain torch only (no C kernel,
#: no linear tuner, no decode plan, no huge pages).
KERNEL_MODES = ("auto", "torch")
DECISION_VARIABLE = "PREFILLBENCH_KERNEL_DECISION"
DECISIONS = ("timed", "kernel", "torch")
#: Every C kernel, by CKernels.name.
C_KERNELS = tuple(k.name for k in (cpu_decode_attention.KERNEL, cpu_few_rows.KERNEL, cpu_layer_ops.KERNELS, cpu_prefill_attention.KERNEL))
#: Timed rounds per side, alternated; the fastest counts (other processes only ever add time).
ROUNDS = 3
#: The longest chunk and the context a decode is timed at: past these the ratios measured held.
TIMED_ROWS, TIMED_CONTEXT = 512, 512


@dataclass
class Decision:
    on: bool
    note: str  # why, for the metadata: the timed ratio, or the fixed answer
    ratio: float | None = None  # the kernel's time over torch's, where timed


@dataclass
class KernelChoice:
    """One backend's kernels: `mode` as asked, and per timed kernel (C_KERNELS' names, and "decode_plan") its decision."""

    mode: str = "auto"
    decisions: dict[str, Decision] = field(default_factory=dict)
    decided: bool = False  # timed at the first prepare(), kept for the backend's life

    def __post_init__(self) -> None:
        if self.mode not in KERNEL_MODES:
            raise ValueError(f"kernels must be one of {', '.join(KERNEL_MODES)}, not {self.mode!r}")

    @property
    def plain_torch(self) -> bool:
        return self.mode == "torch"

    def refused(self) -> frozenset[str]:
        if self.plain_torch:
            return frozenset(C_KERNELS)
        return frozenset(name for name, d in self.decisions.items() if not d.on)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The backend's calls: the kernels it refused are off inside."""
        with refusing(self.refused()):
            yield

    def decide(self, shapes: "Shapes") -> None:
        """Time every kernel that applies against its torch equivalent (decide_attention, decide_layer_ops)."""
        self.decisions = decide_attention(shapes)
        layer_ops = decide_layer_ops(shapes)
        if layer_ops is not None:
            self.decisions[cpu_layer_ops.KERNELS.name] = layer_ops
        self.decided = True

    def paths(self, device: torch.device, dtype: torch.dtype, head_dim: int, fused: FusedDecoder | None) -> dict[str, str]:
        """The metadata's decode_attention, prefill_attention and layer_ops: which path each takes, and why not the kernel."""
        cpu, torch_only = device.type == "cpu", " (--kernels torch)" if self.plain_torch else ""
        if not cpu:
            decode = "SDPA"
        elif torch_only or dtype not in cpu_decode_attention.DTYPES:
            reads = ", ".join(str(d).removeprefix("torch.") for d in cpu_decode_attention.DTYPES)
            decode = f"matmuls/SDPA{torch_only or f' (the compiled kernel reads {reads} caches)'}"
        else:
            decode = self._path(cpu_decode_attention.KERNEL, "matmuls/SDPA")
        if not cpu or dtype not in cpu_prefill_attention.DTYPES:
            prefill = "SDPA"
        elif head_dim not in cpu_prefill_attention.HEAD_DIMS:
            prefill = f"SDPA (the compiled kernel takes heads of {' or '.join(map(str, cpu_prefill_attention.HEAD_DIMS))})"
        else:
            prefill = f"SDPA{torch_only}" if torch_only else self._path(cpu_prefill_attention.KERNEL, "SDPA")
        if fused is None:
            layer_ops = "transformers' modules"
        elif not fused.c_layer_ops:
            layer_ops = "torch ops (this model's norms or heads are not the compiled loops' kind)"
        elif not cpu or dtype not in cpu_layer_ops.DTYPES:
            layer_ops = "torch ops"
        else:
            layer_ops = f"torch ops{torch_only}" if torch_only else self._path(cpu_layer_ops.KERNELS, "torch ops", "compiled C loops")
        return {"decode_attention": decode, "prefill_attention": prefill, "layer_ops": layer_ops}

    def _path(self, kernel: CKernels, torch_path: str, kernel_path: str = "compiled C kernel") -> str:
        """A C kernel's path: the kernel, or the torch path and why (not built, lost when timed)."""
        why_not = kernel.status()
        if why_not:
            return f"{torch_path}; {'compiled loops' if kernel_path == 'compiled C loops' else 'kernel'} {why_not}"
        decision = self.decisions.get(kernel.name)
        if decision is not None and not decision.on:
            return f"{torch_path} (kernel {decision.note})"
        return f"{kernel_path}{self.note(kernel.name)}"

    def note(self, name: str) -> str:
        """" (timed: 0.66x SDPA's time)" or "" for the metadata beside a kernel's path."""
        d = self.decisions.get(name)
        return f" ({d.note})" if d is not None and d.note else ""


def decision_mode() -> str:
    mode = os.environ.get(DECISION_VARIABLE, "timed")
    if mode not in DECISIONS:
        raise ValueError(f"{DECISION_VARIABLE} must be one of {', '.join(DECISIONS)}, not {mode!r}")
    return mode


def best_time(fn: Callable[[], object], rounds: int = ROUNDS) -> float:
    fn()  # warm-up: first calls allocate
    best = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def decide(kernel: Callable[[], object], reference: Callable[[], object], reference_name: str) -> Decision:
    """Use the kernel if it took less time than `reference` (or as PREFILLBENCH_KERNEL_DECISION says)."""
    mode = decision_mode()
    if mode != "timed":
        return Decision(mode == "kernel", "" if mode == "kernel" else f"{DECISION_VARIABLE}={mode}")
    kernel_s = reference_s = math.inf
    for _ in range(2):  # alternated, so neither side always runs on a cache the other warmed
        kernel_s, reference_s = min(kernel_s, best_time(kernel)), min(reference_s, best_time(reference))
    ratio = kernel_s / reference_s
    return Decision(ratio < 1.0, f"timed {ratio:.2f}x {reference_name}'s time", ratio)


@dataclass
class Shapes:
    """What the timings run on: the backend's cache and model, and the run's sizes."""

    keys: torch.Tensor  # one layer's K cache [slots + 1, kv_heads, max_len, D]
    values: torch.Tensor
    scratch_slot: int
    heads: int
    scaling: float
    fused: FusedDecoder | None
    max_step_tokens: int


def decide_attention(shapes: Shapes) -> dict[str, Decision]:
    """The prefill and decode attention kernels against the backend's SDPA/matmul calls, where they apply."""
    out: dict[str, Decision] = {}
    k, v = shapes.keys[shapes.scratch_slot], shapes.values[shapes.scratch_slot]  # [kv_heads, max_len, D]
    kv_heads, max_len, dim = k.shape
    dtype, scaling = k.dtype, shapes.scaling
    rows = max(1, min(shapes.max_step_tokens, max_len, TIMED_ROWS))
    if cpu_prefill_attention.applies(k.device, dtype, dim):
        q = torch.randn(rows, shapes.heads, dim).to(dtype).transpose(0, 1)  # [heads, T, D] as a qkv product lays it
        blocks = chunk_query_blocks(0, rows, dtype, k.device)

        def sdpa() -> None:  # the backend's calls for a chunk at position 0
            for b in blocks:
                F.scaled_dot_product_attention(q[None, :, b.first : b.first + b.length], k[None, :, : b.kv_len], v[None, :, : b.kv_len],
                                               attn_mask=b.mask, is_causal=b.mask is None, scale=scaling, enable_gqa=True)

        out[cpu_prefill_attention.KERNEL.name] = decide(
            lambda: cpu_prefill_attention.prefill_attention(q, k, v, 0, scaling), sdpa, "SDPA")
    if dtype in cpu_decode_attention.DTYPES and cpu_decode_attention.KERNEL.usable():
        q = torch.randn(1, shapes.heads, dim).to(dtype)
        slots = torch.tensor([shapes.scratch_slot])
        positions = torch.tensor([min(max_len, TIMED_CONTEXT) - 1])
        runs = decode_runs([shapes.scratch_slot], positions, dtype)
        out[cpu_decode_attention.KERNEL.name] = decide(
            lambda: cpu_decode_attention.decode_attention(q, shapes.keys, shapes.values, slots, positions, scaling),
            lambda: [attend_decodes(q[r.rows], r, shapes.keys, shapes.values, scaling) for r in runs], "matmuls/SDPA")
    return out


def decide_layer_ops(shapes: Shapes) -> Decision | None:
    """The compiled norms, rotary and SiLU gate against the torch ops, one layer's worth at 1 row and at a chunk's rows:
    on where the geometric mean of the two ratios is below 1. None where they do not apply."""
    fused = shapes.fused
    if fused is None or not fused.c_layer_ops:
        return None
    layer = fused.layers[0]
    attn, module = layer.module.self_attn, layer.module
    dtype = layer.qkv.weight.dtype
    if not cpu_layer_ops.applies(layer.qkv.weight):
        return None
    hidden, width, inner = layer.module.input_layernorm.weight.shape[0], layer.qkv.weight.shape[0], layer.gate_up.weight.shape[0]
    ratios, note = [], ""
    for rows in sorted({1, max(1, min(shapes.max_step_tokens, TIMED_ROWS))}):
        residual = torch.randn(1, rows, hidden).to(dtype)
        delta, qkv, gate_up = torch.zeros_like(residual), torch.randn(1, rows, width).to(dtype), torch.randn(1, rows, inner).to(dtype)
        cos, sin = fused.decoder.rotary_emb(residual, position_ids=torch.arange(rows)[None])

        def one_layer(ops: TorchLayerOps) -> Callable[[], object]:
            def run() -> None:
                ops.add_norm(residual, delta, module.input_layernorm)
                ops.rotate(qkv, layer.qkv_sizes, attn.head_dim)
                ops.add_norm(residual, delta, module.post_attention_layernorm)
                ops.silu_mul(gate_up)
            return run

        d = decide(one_layer(CLayerOps(cos, sin)), one_layer(TorchLayerOps(cos, sin, fused.rotary)), "torch ops")
        if d.ratio is None:
            return d
        ratios.append(d.ratio)
        note += f"{'' if not note else ', '}{d.ratio:.2f}x at {rows} row{'s' if rows > 1 else ''}"
    mean = math.prod(ratios) ** (1 / len(ratios))
    return Decision(mean < 1.0, f"timed {note} of the torch ops' time", mean)

"""A decoder layer's elementwise work on the CPU as three compiled loops (layer_ops.c).

transformers' modules run a layer's RMSNorms, rotary embedding, SiLU gate and
residual adds as about 28 small torch ops: each its own pass over memory and its
own dispatch. Measured on this project's 2-core CPU (SmolLM2-135M, fp32), dropping
all of them from a pp512 step took 70 ms off its ~800 (one paired A/B of 9 reps);
they are a larger share still of a decode step, where every op is a few hundred
elements and costs its dispatch. Here a layer does them in four calls:
- residual += delta, then RMSNorm, in one pass (vLLM's fused_add_rms_norm);
- rotary embedding in place on the q and k heads of the fused qkv product;
- silu(gate) * up from the fused gate-up product.
Whole steps against the same loop of torch ops (benchmarks/cpu/layer_ops.py, fp32,
paired medians): pp512 0.84x, a 256-token chunk 0.96x, decode x1/x4/x16
0.88/0.91/0.96x; bf16 0.88-0.96x.
In bfloat16 each result is rounded where transformers rounds it, so both paths
give the same numbers but for the order of the norm's sum. Built and switched
as the decode kernel is (c_kernels; `PREFILLBENCH_LAYER_KERNELS=0` turns these off).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from prefillbench.backends.torch.cpu.build import CKernels

DTYPES = (torch.float32, torch.bfloat16)
#: The widest head the rotary kernel takes (MAX_HEAD_DIM in layer_ops.c).
MAX_HEAD_DIM = 512


def _declare(library: ctypes.CDLL) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int64
    library.add_rms_norm.argtypes = [p, p, p, p, i, i, ctypes.c_float, i]
    library.rotary.argtypes = [p, p, p, i, i, i, i, i]
    library.silu_mul.argtypes = [p, p, i, i, i]
    for fn in (library.add_rms_norm, library.rotary, library.silu_mul):
        fn.restype = None


KERNELS = CKernels(Path(__file__).with_name("layer_ops.c"), "PREFILLBENCH_LAYER_KERNELS", _declare)


def status() -> str:
    """"" if the kernels are in use, else why not; builds them on first call."""
    return KERNELS.status()


def applies(x: torch.Tensor) -> bool:
    """float32 and bfloat16 tensors on the CPU, once the kernels are built, unless the running backend refused them."""
    return x.device.type == "cpu" and x.dtype in DTYPES and KERNELS.usable()


def _check(*tensors: torch.Tensor) -> int:
    """1 for bfloat16, 0 for float32; raises if the kernels cannot take these tensors."""
    if status():
        raise RuntimeError(f"the layer kernels are {status()}")
    dtype = tensors[0].dtype
    if not all(t.is_contiguous() and t.dtype == dtype for t in tensors) or dtype not in DTYPES:
        raise ValueError("the layer kernels take contiguous float32 or bfloat16 tensors of one dtype")
    return int(dtype == torch.bfloat16)


def add_rms_norm(residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += delta (in place, when given), then weight * RMSNorm(residual) over the last dimension."""
    dim = residual.shape[-1]
    bf16 = _check(residual, weight, *(() if delta is None else (delta,)))
    if delta is not None and delta.shape != residual.shape:
        raise ValueError(f"delta {tuple(delta.shape)} does not match residual {tuple(residual.shape)}")
    out = torch.empty_like(residual)
    KERNELS.library.add_rms_norm(residual.data_ptr(), None if delta is None else delta.data_ptr(), weight.data_ptr(),
                                 out.data_ptr(), residual.numel() // dim, dim, eps, bf16)
    return out


def rotary_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Rotary embedding, in place, on the first `heads` heads of every row of qkv [..., width];
    cos and sin hold one row of head_dim per row of qkv."""
    width = qkv.shape[-1]
    rows = qkv.numel() // width
    bf16 = _check(qkv, cos, sin)
    if cos.numel() != rows * head_dim or sin.numel() != rows * head_dim or heads * head_dim > width or head_dim % 2 or head_dim > MAX_HEAD_DIM:
        raise ValueError("rotary_: cos and sin need [rows, head_dim] (head_dim even) and the heads must fit the row")
    KERNELS.library.rotary(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), rows, width, heads, head_dim, bf16)
    return qkv


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, gate_up [..., 2 * inner] holding gate then up: [..., inner]."""
    inner = gate_up.shape[-1] // 2
    bf16 = _check(gate_up)
    out = torch.empty(*gate_up.shape[:-1], inner, dtype=gate_up.dtype)
    KERNELS.library.silu_mul(gate_up.data_ptr(), out.data_ptr(), gate_up.numel() // (2 * inner), inner, bf16)
    return out

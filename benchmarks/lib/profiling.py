"""Which attention kernels a step ran, read from torch.profiler, and whether any attention took the unfused path.

On a GPU the names are the device kernels' (a CUDA-graph replay shows its kernels, not its ops); on a CPU, the
ops'. Unfused attention is what a fused kernel avoids: the math SDPA kernel (it materialises the scores, expands
K/V per query head and upcasts), a batched matmul shaped like attention (batch of heads, one side head-wide),
or a softmax kernel of its own on the device (a fused kernel keeps the softmax inside).
"""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

#: Kernel or op names that say attention: flash, memory-efficient (fmha), cuDNN (sdpa), FlexAttention's Triton templates.
ATTENTION_NAME = re.compile(r"flash|fmha|attention|attn|flex|sdpa|triton_tem", re.IGNORECASE)
#: The dispatcher's entry point: it runs one of the kernels above, which is the one worth naming.
DISPATCH_OPS = {"aten::scaled_dot_product_attention"}
MATH_OPS = {"aten::_scaled_dot_product_attention_math"}
BMM_OPS = {"aten::bmm", "aten::baddbmm"}
#: Device events that are no kernel: copies and fills. A CUDA-graph replay whose profile holds only these
#: shows nothing of its kernels, and is blind.
NOT_KERNELS = re.compile(r"memcpy|memset", re.IGNORECASE)


@dataclass
class AttentionProfile:
    kernels: list[str]  # attention kernels (or ops) the step ran, the most time first
    unfused: list[str]  # evidence of unfused attention; empty if none
    blind: bool = False  # a GPU step whose profile holds no device kernel at all: nothing can be read off it

    @property
    def math(self) -> bool:
        return bool(self.unfused)


def short_name(name: str) -> str:
    """A kernel's name without `void`, template arguments, parameters or anonymous namespaces:
    'void pytorch_flash::flash_fwd_kernel<Traits, ...>(Params)' -> 'pytorch_flash::flash_fwd_kernel'."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    for mark in ("<", "("):
        if (cut := name.find(mark)) > 0:
            name = name[:cut]
    return name.strip()


def attention_shaped_bmm(shapes: list[list[int]], head_dim: int) -> bool:
    """A bmm over a batch of heads with one side head_dim wide: Q @ K^T ([BH, T, D] @ [BH, D, S]) or
    P @ V ([BH, T, S] @ [BH, S, D]). Rotary embeddings' bmm has a batch of 1."""
    mats = [s for s in shapes if len(s) == 3][-2:]  # baddbmm's first input is the one added
    if len(mats) != 2:
        return False
    (b, _, k), (_, _, n) = mats
    return b > 1 and head_dim in (k, n)


def attention_profile(step: Callable[[], object], device: torch.device, head_dim: int) -> AttentionProfile:
    """Profile one run of `step` (after one unprofiled run) and read its attention kernels off the profile."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step()
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities, record_shapes=True) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    on_device: dict[str, float] = defaultdict(float)
    ops: dict[str, float] = defaultdict(float)
    unfused: set[str] = set()
    for event in prof.key_averages(group_by_input_shape=True):
        key = event.key
        if event.device_type != DeviceType.CPU:
            name = short_name(key)
            if ATTENTION_NAME.search(name):
                on_device[name] += getattr(event, "self_device_time_total", 0.0)
            elif "softmax" in name.lower():
                unfused.add(f"{name} (device softmax)")
            continue
        if key in MATH_OPS:
            unfused.add(key)
        elif key in BMM_OPS and attention_shaped_bmm(event.input_shapes, head_dim):
            unfused.add(f"{key} {'x'.join(map(str, event.input_shapes[-2]))}")
        elif ATTENTION_NAME.search(key) and key not in DISPATCH_OPS:
            ops[key] += event.self_cpu_time_total
    named = on_device or ops
    return AttentionProfile(sorted(named, key=named.get, reverse=True), sorted(unfused), blind=cuda and not saw_kernels(prof.key_averages()))


def saw_kernels(events) -> bool:
    """Whether a profile's events hold a device kernel: a device event that is no copy or fill."""
    from torch.autograd import DeviceType

    return any(e.device_type != DeviceType.CPU and not NOT_KERNELS.search(e.key) for e in events)

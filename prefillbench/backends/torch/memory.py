"""Memory planned before the run, as vLLM's `gpu_memory_utilization`: how many sequences fit.

A run needs the weights (loaded already, so inside what is used), the activations of its largest step,
the copies of weights the linear tuner makes while it times them (CPU only, before the first tuning),
and the KV cache: one slot of `max_seq_len` positions per sequence in flight, plus the scratch slot.
What is free is read from the device: `torch.cuda.mem_get_info` on CUDA; on the host the least of
MemAvailable, the address space left under RLIMIT_AS, the data segment left under RLIMIT_DATA and the
cgroup's limit less its use. The plan takes UTILIZATION of it, as vLLM takes 0.9 of a GPU, and the
engine clamps the sequences in flight to what fits (Backend.note_clamp says so), or refuses a request
of which not one sequence fits, in one line, before the first step.
"""
from __future__ import annotations

import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

#: The share of what is free that the plan may use: the rest is left to the allocator's slack, threads'
#: stacks and what the estimate of the activations misses (vLLM's default gpu_memory_utilization).
UTILIZATION = 0.9
GiB = 1 << 30


@dataclass(frozen=True)
class FreeMemory:
    bytes: int
    where: str  # e.g. "on this host (MemAvailable)", "on cuda:0"

    def describe(self) -> str:
        return f"the {self.bytes / GiB:.2f} GiB free {self.where}"


def _status_kib(field: str) -> int | None:
    """A field of /proc/self/status in bytes (VmSize, VmData), or None where there is none."""
    path = Path("/proc/self/status")
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None


def _cgroup_room() -> int | None:
    """The cgroup's memory limit less its use (v2, else v1); None where no limit is set."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit, usage = Path(limit_file).read_text().strip(), Path(usage_file).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and int(limit) < 1 << 60:  # v1 writes "no limit" as a number near 2**63
            return int(limit) - int(usage)
    return None


def host_free() -> FreeMemory:
    """The least of what the host, this process's limits and its cgroup leave."""
    candidates: list[tuple[int, str]] = []
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                candidates.append((int(line.split()[1]) * 1024, "on this host (MemAvailable)"))
    for limit, field, name in ((resource.RLIMIT_AS, "VmSize", "RLIMIT_AS"), (resource.RLIMIT_DATA, "VmData", "RLIMIT_DATA")):
        soft = resource.getrlimit(limit)[0]
        used = _status_kib(field)
        if soft != resource.RLIM_INFINITY and used is not None:
            candidates.append((soft - used, f"under this process's {name} ({soft / GiB:.2f} GiB, {used / GiB:.2f} used)"))
    room = _cgroup_room()
    if room is not None:
        candidates.append((room, "in this cgroup (memory limit less use)"))
    if not candidates:
        return FreeMemory(1 << 62, "(no limit found)")
    free, where = min(candidates)
    return FreeMemory(max(0, free), where)


def free_memory(device: torch.device) -> FreeMemory:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return FreeMemory(free, f"on {device} (torch.cuda.mem_get_info)")
    return host_free()


@dataclass(frozen=True)
class ModelSizes:
    """What the estimates read from the model."""

    n_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    itemsize: int


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def kv_bytes(sizes: ModelSizes, slots: int, max_len: int) -> int:
    """K and V of every layer for `slots` cache slots of `max_len` positions."""
    return 2 * sizes.n_layers * slots * sizes.kv_heads * max_len * sizes.head_dim * sizes.itemsize


def activation_bytes(sizes: ModelSizes, rows: int, kv_len: int, logit_rows: int) -> int:
    """An estimate of the largest step's live tensors, doubled for the temporaries between them: a layer's
    residual, norm, qkv, attention output, gate-up and activation rows; one block of 512 queries' float32
    scores over the context (what a score-materialising attention holds); float32 logits."""
    width = (sizes.heads + 2 * sizes.kv_heads) * sizes.head_dim
    per_row = (4 * sizes.hidden + width + 3 * sizes.intermediate) * sizes.itemsize
    scores = sizes.heads * min(rows, 512) * kv_len * 4
    return 2 * (rows * per_row + scores + logit_rows * sizes.vocab * 4)


@dataclass(frozen=True)
class MemoryPlan:
    """What a run of sequences of `max_seq_len` needs beside the weights, against what is free."""

    free: FreeMemory
    max_seq_len: int
    kv_per_sequence: int
    fixed: int  # activations, the tuner's copies, the scratch slot, page padding
    reusable: int  # the current KV cache's bytes: freed before a larger one is made

    @property
    def sequences(self) -> int:
        usable = int(self.free.bytes * UTILIZATION) + self.reusable - self.fixed
        return max(0, usable // self.kv_per_sequence)

    def describe(self) -> str:
        """Where the sequences have to fit and what each needs, for the clamp and refusal lines."""
        return (f"{self.free.describe()} beside the weights: each sequence of {self.max_seq_len} tokens needs "
                f"{self.kv_per_sequence / GiB:.3f} GiB of KV cache, after {self.fixed / GiB:.2f} GiB for the largest step's "
                f"activations and the cache's fixed part, at {UTILIZATION:.0%} utilization")


def plan(sizes: ModelSizes, max_seq_len: int, max_step_tokens: int, free: FreeMemory,
         weight_copies: int = 0, reusable: int = 0, padding: int = 0) -> MemoryPlan:
    """`weight_copies`: bytes the tuner has still to copy; `reusable`: the current cache's; `padding`: the cache's
    page alignment."""
    per_sequence = kv_bytes(sizes, 1, max_seq_len)

    def with_logits(rows: int) -> MemoryPlan:
        fixed = activation_bytes(sizes, max_step_tokens, max_seq_len, rows) + weight_copies + per_sequence + padding
        return MemoryPlan(free, max_seq_len, per_sequence, fixed, reusable)

    # A step emits at most one token per sequence in flight, and no more than its rows.
    return with_logits(min(max_step_tokens, with_logits(0).sequences))


#: What a backend asks for what is free (tests inject a smaller figure).
FreeMemoryReader = Callable[[torch.device], FreeMemory]

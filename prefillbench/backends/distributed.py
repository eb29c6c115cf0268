"""Tensor parallelism on PyTorch's own distributed stack: one process per rank, launched by torchrun.

Every rank runs the same engine and strategy on the same seeded requests, so
all ranks execute the same steps; transformers' tensor-parallel plan shards
each layer and inserts the collectives. This module owns what the backend and
the CLI need to know about the process group: joining it, who is rank 0, the
barrier that makes a step's time the slowest rank's, and what the metadata
records.
"""
from __future__ import annotations

import atexit
import os
import time
from dataclasses import dataclass
from typing import Any

from prefillbench.backends.base import BackendError

#: Variables torchrun sets in every process it starts.
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launch_hint(tp: int) -> str:
    return f"torchrun --nproc-per-node {tp} -m prefillbench run --backend torch --tp {tp} ..."


def launched_by_torchrun() -> bool:
    return all(v in os.environ for v in LAUNCH_VARIABLES)


def process_rank() -> int:
    """This process's global rank: 0 when not launched by torchrun.

    Read from the environment, so it is right before the process group exists
    (a usage error is printed once) and after it is gone.
    """
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def is_rank_zero() -> bool:
    return process_rank() == 0


def check_launch(tp: int, backend_name: str) -> None:
    """Errors a user can fix before anything loads: wrong backend, no torchrun, a world of another size."""
    if tp < 1:
        raise BackendError(f"--tp must be at least 1, got {tp}")
    world = os.environ.get("WORLD_SIZE")
    if backend_name == "sim":
        if world not in (None, "1"):
            raise BackendError("the sim predicts --tp and --pp in one process: run it without torchrun")
        return
    if tp == 1:
        if world not in (None, "1"):
            raise BackendError(f"{world} processes were launched but --tp is 1; pass --tp {world} (every process is one tensor-parallel rank)")
        return
    if backend_name != "torch":
        raise BackendError(f"--tp {tp} runs on the torch backend only (got --backend {backend_name}); the sim predicts TP with --backend sim --tp {tp}")
    if not launched_by_torchrun():
        raise BackendError(f"--tp {tp} needs one process per rank; launch it as: {launch_hint(tp)}")
    if int(world) != tp:
        raise BackendError(f"torchrun started {world} processes but --tp is {tp}; they must match (--nproc-per-node × --nnodes = --tp)")


def check_heads_divide(text_config, tp: int) -> None:
    """Each rank holds heads/tp query heads and kv_heads/tp KV heads: both must divide evenly."""
    heads = text_config.num_attention_heads
    kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
    if heads % tp or kv_heads % tp:
        fits = [n for n in range(2, kv_heads + 1) if heads % n == 0 and kv_heads % n == 0]
        hint = f"; --tp {' or '.join(map(str, fits))} would" if fits else "; no --tp above 1 does"
        raise BackendError(f"--tp {tp} does not divide the model's {heads} attention heads and {kv_heads} KV heads{hint}")


@dataclass
class TensorParallel:
    """The process group this rank belongs to: every rank is one tensor-parallel shard."""

    rank: int
    local_rank: int
    world_size: int
    process_group_backend: str  # "nccl" or "gloo"
    device: str  # this rank's torch device, e.g. "cuda:1" or "cpu"
    devices: list[str]  # every rank's device, by rank, with host names

    @property
    def tp(self) -> int:
        return self.world_size

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def clock(self) -> float:
        """Rank 0's clock, read once every rank has reached this point, the same on every rank.

        The engine decides from the clock (which open-loop arrivals to admit,
        how long to wait): one reading shared by all ranks keeps their
        decisions, and so their steps and collectives, identical. Clocks of
        different nodes do not share an origin, so no rank's own is used.
        """
        import torch
        import torch.distributed as dist

        self.barrier()
        reading = torch.tensor([time.perf_counter() if self.rank == 0 else 0.0], dtype=torch.float64, device=self.device)
        dist.broadcast(reading, src=0)
        return float(reading.item())

    def fewest(self, n: int) -> int:
        """The least of every rank's `n`: ranks that plan their memory apart must still run the same sequences."""
        import torch
        import torch.distributed as dist

        value = torch.tensor([n], dtype=torch.int64, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return int(value.item())

    def metadata(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "tp": self.tp,
            "process_group_backend": self.process_group_backend,
            "devices": "; ".join(self.devices),
        }

    @staticmethod
    def close() -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def join(tp: int, device: str) -> TensorParallel:
    """Join torchrun's process group (nccl on CUDA, gloo on CPU) and bind this rank to its device.

    transformers would create the group itself on first load, choosing the
    backend from whatever accelerator it sees; creating it here first keeps
    the choice with --device and lets the world size be checked up front.
    """
    import socket

    import torch
    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    if device == "cpu" and torch.cuda.is_available():
        # transformers builds its device mesh on the accelerator it sees, whatever the group says.
        raise BackendError("--tp on the CPU while a CUDA device is visible is not supported; use --device cuda, or hide the GPUs with CUDA_VISIBLE_DEVICES=")
    if device == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise BackendError(f"local rank {local_rank} has no GPU: this node has {torch.cuda.device_count()}; lower --nproc-per-node")
        torch.cuda.set_device(local_rank)
        rank_device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        rank_device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, device_id=rank_device if backend == "nccl" else None)
        # Leave the group on the way out however the run ends (nccl warns about a group never destroyed).
        atexit.register(TensorParallel.close)
    if dist.get_world_size() != tp:
        raise BackendError(f"the process group has {dist.get_world_size()} ranks but --tp is {tp}")
    name = torch.cuda.get_device_name(rank_device) if rank_device.type == "cuda" else "CPU"
    devices: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(devices, f"{socket.gethostname()}:{rank_device} {name}")
    return TensorParallel(dist.get_rank(), local_rank, dist.get_world_size(), dist.get_backend(), str(rank_device), devices)

"""One step's attention contract, built once per step on the device and read by every layer.

As nano-vllm's `Context`: where each packed row's K/V go (its cache slot and
position), the chunks' cumulative query and key lengths, each decode's context
length and slot. Everything a layer needs is a tensor made here, so no layer
asks the host anything (no `.item()`, no `.tolist()`): the steps of a CUDA route
stay free of synchronization per layer, and a CUDA graph can be captured over
a decode step whose contract is built from its static input buffers
(`AttentionMeta.for_decodes`).

The routes (flex.py, flash.py) read this contract; the CPU route keeps its own
`StepLayout` (packed.py), tuned for its C kernels.

On CUDA the contract's host arrays (and the step's tokens, positions and LM-head
rows, `extra`) travel in one pinned, non-blocking copy (`upload`), not one
pageable synchronous copy each: a mixed step of a few decodes is otherwise
bound by the host.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from prefillbench.step import PackedStep, Step


@dataclass(frozen=True)
class ChunkRows:
    """One prefill chunk of the step, host side: the flash route's per-chunk calls need its extent."""

    slot: int
    start: int  # first position
    row: int  # first packed row
    length: int  # tokens, pads included


@dataclass
class AttentionMeta:
    """What attention needs of one step: rows [0, n_prefill) are prompt chunks, [n_prefill, T) decodes."""

    row_slots: torch.Tensor  # [T] long: each packed row's cache slot
    row_positions: torch.Tensor  # [T] long: the position its K/V are written at (and its query sits at)
    n_prefill: int
    chunks: tuple[ChunkRows, ...]
    cu_seqlens_q: torch.Tensor  # [C + 1] int32: the chunks' query rows, cumulative
    cu_seqlens_k: torch.Tensor  # [C + 1] int32: their contexts (start + length), cumulative
    chunk_slots: torch.Tensor  # [C] int32
    chunk_contexts: torch.Tensor  # [C] int32: start + length, the positions a chunk's last row sees
    max_seqlen_q: int
    max_seqlen_k: int
    decode_slots: torch.Tensor  # [m] long
    decode_contexts: torch.Tensor  # [m] int32: position + 1, the positions each decode reads
    #: What a route builds from the above once per step (its block masks), so no layer rebuilds it.
    route_state: dict[str, Any] = field(default_factory=dict)
    #: The caller's own arrays, uploaded with the contract (for_step's `extra`): int64 tensors by name.
    extra: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def n_decodes(self) -> int:
        return self.decode_slots.shape[0]

    @property
    def prompts_from_zero(self) -> bool:
        """Every chunk starts at position 0: its keys are its own rows, no cache read is needed."""
        return all(c.start == 0 for c in self.chunks)

    @classmethod
    def for_step(cls, step: Step, packed: PackedStep, slots: list[int], device: torch.device,
                 extra: dict[str, np.ndarray] | None = None) -> "AttentionMeta":
        """The contract of a packed step whose sequences sit in `slots` (prefills' then decodes', in step order);
        `extra`: more int arrays to carry to the device in the same copy (meta.extra)."""
        chunks = []
        row_slots = np.empty(len(packed.tokens), dtype=np.int64)
        for chunk, row, slot in zip(step.prefills, packed.chunk_offsets, slots):
            n = len(chunk.tokens) + chunk.pad
            chunks.append(ChunkRows(slot, chunk.start, row, n))
            row_slots[row : row + n] = slot
        row_slots[packed.decode_from :] = slots[len(step.prefills) :]
        lengths = np.array([c.length for c in chunks], dtype=np.int64)
        contexts = np.array([c.start + c.length for c in chunks], dtype=np.int64)
        arrays = {
            "row_slots": row_slots,
            "row_positions": packed.positions,
            "cu_seqlens_q": np.concatenate([[0], np.cumsum(lengths)]),
            "cu_seqlens_k": np.concatenate([[0], np.cumsum(contexts)]),
            "chunk_slots": np.array([c.slot for c in chunks], dtype=np.int64),
            "chunk_contexts": contexts,
            "decode_slots": np.array(slots[len(step.prefills) :], dtype=np.int64),
            "decode_contexts": packed.positions[packed.decode_from :] + 1,
        }
        names = list(arrays)
        arrays.update(extra or {})
        t = upload(arrays, device)
        int32 = {"cu_seqlens_q", "cu_seqlens_k", "chunk_slots", "chunk_contexts", "decode_contexts"}
        fields = {name: t[name].to(torch.int32) if name in int32 else t[name] for name in names}
        return cls(
            n_prefill=packed.decode_from,
            chunks=tuple(chunks),
            max_seqlen_q=int(lengths.max(initial=0)),
            max_seqlen_k=int(contexts.max(initial=0)),
            extra={name: t[name] for name in extra or {}},
            **fields,
        )

    @classmethod
    def for_decodes(cls, positions: torch.Tensor, slots: torch.Tensor) -> "AttentionMeta":
        """A decode-only contract from tensors alone (a CUDA graph's static inputs): fixed shapes, no host sync."""
        empty = positions.new_zeros(1, dtype=torch.int32)
        return cls(
            row_slots=slots, row_positions=positions, n_prefill=0, chunks=(),
            cu_seqlens_q=empty, cu_seqlens_k=empty, chunk_slots=empty[:0], chunk_contexts=empty[:0],
            max_seqlen_q=0, max_seqlen_k=0,
            decode_slots=slots, decode_contexts=(positions + 1).to(torch.int32),
        )


def upload(arrays: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """The arrays as int64 tensors on `device`, by name. On a CPU, views of the arrays where they are int64
    already; elsewhere one host buffer, pinned on CUDA, copied in one non-blocking transfer and split into views
    (the host allocator keeps a pinned block until the copies reading it are done)."""
    flat = [np.ascontiguousarray(a, dtype=np.int64).reshape(-1) for a in arrays.values()]
    if device.type == "cpu":
        return {name: torch.from_numpy(a) for name, a in zip(arrays, flat)}
    host = torch.from_numpy(np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64))
    if device.type == "cuda":
        host = host.pin_memory()
    on_device = host.to(device, non_blocking=True)
    return dict(zip(arrays, on_device.split([a.size for a in flat])))

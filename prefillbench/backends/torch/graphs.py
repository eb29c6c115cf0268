"""Decode-only steps replayed from CUDA graphs, one graph per batch size (nano-vllm's scheme).

A decode step launches a few hundred small kernels; on a GPU their launch cost,
not the weight read, sets the step's time. A CUDA graph records the launches
once and replays them in one call. A graph needs fixed shapes and addresses, so
each captured batch size reads its inputs (tokens, positions, slots) from
static buffers; the forward builds the step's attention contract from them
inside the graph (context lengths = positions + 1, AttentionMeta.for_decodes),
so a replayed decode reads only its own context, whatever the cache's length.
A step of m decodes replays the smallest captured size >= m; the extra rows
write to the cache's scratch slot and their outputs are dropped.

Capture runs under `torch.inference_mode()`: with autograd on, the warm-up's
logits required grad and the cache gained a grad_fn. The memory the graphs'
pool holds is measured (`pool_bytes`) and reported in the metadata.

The same forward runs eagerly too (`capture=False`), which is how the CPU
tests check that it computes what the eager layout computes.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from prefillbench.step import Step


def graph_batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 16, up to the first size >= max_batch."""
    sizes = [1, 2, 4, 8]
    while sizes[-1] < max_batch:
        sizes.append(sizes[-1] + 16 if sizes[-1] >= 16 else 16)
    return [s for s in sizes if s < max_batch] + [next(s for s in sizes if s >= max_batch)]


class Capturer(Protocol):
    """What capture needs of a device: CUDA's (CudaCapturer), or a stand-in in tests."""

    def warm_and_capture(self, sizes: list[int], run: Callable[[int], torch.Tensor]) -> dict[int, tuple[object, torch.Tensor]]:
        """For each size (largest first): run it twice uncaptured, then capture it; -> size: (graph, its output)."""

    def reserved_bytes(self) -> int: ...


class CudaCapturer:
    def warm_and_capture(self, sizes, run):
        captured, pool = {}, None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for n in sizes:  # largest first, so the smaller graphs reuse its memory pool
                for _ in range(2):  # warm-up outside the capture: allocations, kernel choices, compiles
                    run(n)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    out = run(n)
                pool = graph.pool()
                captured[n] = (graph, out)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        return captured

    def reserved_bytes(self) -> int:
        return torch.cuda.memory_reserved()


class DecodeGraphs:
    """Static buffers, and a graph per batch size over them once captured."""

    def __init__(self, forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                 max_batch: int, scratch_slot: int, device: torch.device, capture: bool,
                 capturer: Capturer | None = None) -> None:
        """`forward(tokens, positions, slots)` runs the model's decode step on [n] tensors and returns logits [n, vocab]."""
        self.forward = forward
        self.sizes = graph_batch_sizes(max_batch)
        self.scratch_slot = scratch_slot
        largest = self.sizes[-1]
        self.device = torch.device(device)
        # One buffer, rows tokens / positions / slots, so that a step's inputs arrive in one copy.
        self.inputs = torch.zeros((3, largest), dtype=torch.long, device=device)
        self.tokens, self.positions, self.slots = self.inputs.unbind(0)
        self.slots.fill_(scratch_slot)
        self.logits: dict[int, torch.Tensor] = {}
        self.graphs: dict[int, object] = {}
        self.pool_bytes: int | None = None
        if capture:
            self._capture(capturer or CudaCapturer())

    def _inputs(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.tokens[:n], self.positions[:n], self.slots[:n]

    def _capture(self, capturer: Capturer) -> None:
        before = capturer.reserved_bytes()
        with torch.inference_mode():
            captured = capturer.warm_and_capture(list(reversed(self.sizes)), lambda n: self.forward(*self._inputs(n)))
        for n, (graph, logits) in captured.items():
            self.graphs[n], self.logits[n] = graph, logits
        self.pool_bytes = capturer.reserved_bytes() - before

    def fits(self, step: Step) -> bool:
        return not step.prefills and 0 < len(step.decodes) <= self.sizes[-1]

    def run(self, step: Step, slots: list[int]) -> torch.Tensor:
        """Logits [m, vocab] of a decode-only step whose sequences sit in `slots`."""
        m = len(step.decodes)
        n = next(s for s in self.sizes if s >= m)
        pad = self.inputs.shape[1] - m  # the whole buffer, so that it is one contiguous copy
        host = torch.tensor([[d.token for d in step.decodes] + [0] * pad, [d.position for d in step.decodes] + [0] * pad,
                             slots + [self.scratch_slot] * pad])
        if self.device.type == "cuda":
            host = host.pin_memory()  # one pinned, non-blocking copy, not three pageable synchronous ones
        self.inputs.copy_(host, non_blocking=True)
        if n in self.graphs:
            self.graphs[n].replay()
            return self.logits[n][:m]
        return self.forward(*self._inputs(n))[:m]

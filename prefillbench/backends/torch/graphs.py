"""Decode-only steps replayed from CUDA graphs, one graph per batch size (nano-vllm's scheme).

A decode step launches a few hundred small kernels; on a GPU their launch cost,
not the weight read, sets the step's time. A CUDA graph records the launches
once and replays them in one call. A graph needs fixed shapes and addresses, so
each captured batch size reads its inputs from static buffers, and attention
uses the static layout: every cache slot, every position up to the cache's
length, masked per slot (`static_decode_layout`). A step of m decodes replays
the smallest captured size >= m; the extra rows write to the cache's scratch
slot and their outputs are dropped.

The static layout runs eagerly too (`capture=False`), which is how the CPU
tests check that it computes what the eager layout computes.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from prefillbench.step import Step


def graph_batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 16, up to the first size >= max_batch."""
    sizes = [1, 2, 4, 8]
    while sizes[-1] < max_batch:
        sizes.append(sizes[-1] + 16 if sizes[-1] >= 16 else 16)
    return [s for s in sizes if s < max_batch] + [next(s for s in sizes if s >= max_batch)]


class DecodeGraphs:
    """Static buffers, and a graph per batch size over them once captured."""

    def __init__(self, forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                 max_batch: int, scratch_slot: int, device: torch.device, capture: bool) -> None:
        """`forward(tokens, positions, slots)` runs the model's decode step on [n] tensors and returns logits [n, vocab]."""
        self.forward = forward
        self.sizes = graph_batch_sizes(max_batch)
        self.scratch_slot = scratch_slot
        largest = self.sizes[-1]
        self.tokens = torch.zeros(largest, dtype=torch.long, device=device)
        self.positions = torch.zeros(largest, dtype=torch.long, device=device)
        self.slots = torch.full((largest,), scratch_slot, dtype=torch.long, device=device)
        self.logits: dict[int, torch.Tensor] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if capture:
            self._capture()

    def _inputs(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.tokens[:n], self.positions[:n], self.slots[:n]

    def _capture(self) -> None:
        pool = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for n in reversed(self.sizes):  # largest first, so the smaller graphs reuse its memory pool
                for _ in range(2):  # warm-up outside the capture: allocations, kernel choices
                    self.forward(*self._inputs(n))
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.logits[n] = self.forward(*self._inputs(n))
                pool = graph.pool()
                self.graphs[n] = graph
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def fits(self, step: Step) -> bool:
        return not step.prefills and 0 < len(step.decodes) <= self.sizes[-1]

    def run(self, step: Step, slots: list[int]) -> torch.Tensor:
        """Logits [m, vocab] of a decode-only step whose sequences sit in `slots`."""
        m = len(step.decodes)
        n = next(s for s in self.sizes if s >= m)
        pad = n - m
        self.tokens[:n].copy_(torch.tensor([d.token for d in step.decodes] + [0] * pad))
        self.positions[:n].copy_(torch.tensor([d.position for d in step.decodes] + [0] * pad))
        self.slots[:n].copy_(torch.tensor(slots + [self.scratch_slot] * pad))
        if n in self.graphs:
            self.graphs[n].replay()
            return self.logits[n][:m]
        return self.forward(*self._inputs(n))[:m]

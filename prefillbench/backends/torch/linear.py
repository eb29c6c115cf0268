"""Linear layers at a good speed for every row count a step can have.

A step multiplies each weight by 1 row (one decode), a few rows (decodes), or
hundreds (a chunk). The BLAS path that `F.linear` takes is good for the last and
can be far from it for the first two: measured on this project's CPU, fp32, the
LM head (49,152 x 576) took 11 ms for 1 row through `F.linear` and 5.8 ms as
`x @ W.T` with W.T stored contiguous; 40 ms for 3 rows, 8 ms as `W @ x.T`.
Which path wins depends on the device, the dtype, the shape and the row count,
so `LinearKernels` times the candidates on the model's own weights the first
time a (shape, row count) meets it and keeps the winner.

Prompt steps (hundreds of rows) were left to `F.linear` until a paired
measurement showed its cost per row rising as chunks shrink: all four layer
shapes of the default model, 30 layers, fp32, four 256-row passes took 1.19x one
1,024-row pass (a cost per call that does not shrink with the rows; MKL was not
profiled inside). oneDNN with the weight reordered once into its blocked layout
(what inductor's freezing does) took 0.63x `F.linear`'s time at 256 rows, 0.82x
at 1,024 and 0.38-0.61x at 1-16 rows, where the other kernels here also beat
`F.linear` (bf16: 0.86-0.94x from 128 rows on), so it is a candidate at every
row count and the tuner decides.
"""
from __future__ import annotations

import functools
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from prefillbench.backends.torch.cpu import few_rows as cpu_few_rows

#: Row counts up to this one are tuned bucket by bucket; every larger count shares one choice.
MAX_TUNED_ROWS = 64
#: The row count at which that shared choice is timed: above MAX_TUNED_ROWS only `F.linear` and the
#: oneDNN product compete, and the one that wins at 128 rows won at every count to 1,024 measured.
LARGE_ROWS = 128
#: Timing rounds per candidate; the fastest round counts (other processes only ever add time).
ROUNDS = 5


def _linear(x: torch.Tensor, layer: "TunedWeight") -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


def _weight_first(x: torch.Tensor, layer: "TunedWeight") -> torch.Tensor:
    # (W @ x.T).T: the BLAS sees the long dimension as M; contiguous again for the .view() that follows.
    out = torch.mm(layer.weight, x.t()).t().contiguous()
    return out if layer.bias is None else out.add_(layer.bias)


def _transposed_weight(x: torch.Tensor, layer: "TunedWeight") -> torch.Tensor:
    if layer.bias is None:
        return torch.mm(x, layer.weight_t)
    return torch.addmm(layer.bias, x, layer.weight_t)


def _split_rows(parts: int) -> Callable[[torch.Tensor, "TunedWeight"], torch.Tensor]:
    """W's output rows cut into `parts` blocks, multiplied as one batched product.

    For one or a few rows the BLAS runs `F.linear` as a GEMV on a single thread:
    measured on this project's 2-core CPU, fp32, it reads the weight at ~8-10 GB/s
    with 1 thread or 2, while 2 threads stream memory at ~25 GB/s. A batched
    product spreads the blocks over the threads: the LM head's one-row product
    went from 11.6 ms to 4.0 ms, a 1536x576 MLP weight's from 500 to 270 us.
    """

    def kernel(x: torch.Tensor, layer: "TunedWeight") -> torch.Tensor:
        n, k = layer.weight.shape
        m = x.shape[0]
        blocks = torch.bmm(layer.weight.view(parts, n // parts, k), x.t().expand(parts, k, m))  # [parts, n/parts, m]
        out = blocks.view(n, m).t().contiguous()
        return out if layer.bias is None else out.add_(layer.bias)

    return kernel


def _onednn_packed(x: torch.Tensor, layer: "TunedWeight") -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, layer.onednn_weight(), layer.bias, "none", [], "")


def _few_rows_packed(x: torch.Tensor, layer: "TunedWeight") -> torch.Tensor:
    return cpu_few_rows.multiply(x, layer.few_rows_weight(), layer.bias)


#: Block counts tried by the split-rows kernels (used where they divide the weight's rows).
SPLIT_PARTS = (2, 4, 8)

#: name -> kernel(x [M, K], layer) -> [M, N]; all compute x @ W.T + b.
KERNELS: dict[str, Callable[[torch.Tensor, "TunedWeight"], torch.Tensor]] = {
    "linear": _linear,
    "weight_first": _weight_first,
    "transposed_weight": _transposed_weight,
    **{f"split_rows_{p}": _split_rows(p) for p in SPLIT_PARTS},
    "onednn_packed": _onednn_packed,
    "few_rows_packed": _few_rows_packed,
}

#: The kernels that compete above MAX_TUNED_ROWS: the others exist for products of a few rows.
LARGE_ROW_KERNELS = ("linear", "onednn_packed")


def onednn_applies(weight: torch.Tensor) -> bool:
    """Whether oneDNN's reordered product can multiply by `weight` here (CPU, fp32 or bf16, and a CPU that runs it)."""
    return (weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16) and torch.backends.mkldnn.is_available()
            and onednn_runs(weight.dtype))


@functools.cache
def onednn_runs(dtype: torch.dtype) -> bool:
    """Whether oneDNN's reorder and product run in `dtype` on this CPU, found by trying them on a tiny weight.

    Its bf16 path needs AVX-512 (bw, vl, dq) or AVX-NE-CONVERT and raises elsewhere (an AVX2 laptop, or
    ONEDNN_MAX_CPU_ISA=AVX2): asked in advance, torch's own check reads the CPU's flags, not oneDNN's cap."""
    try:
        weight = torch.ones(16, 32, dtype=dtype)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 32, dtype=dtype), torch.ops.mkldnn._reorder_linear_weight(weight),
                                                 None, "none", [], "")
        return bool((out == 32).all())
    except RuntimeError:
        return False


def _applies(name: str, layer: "TunedWeight", rows: int) -> bool:
    if rows > MAX_TUNED_ROWS and name not in LARGE_ROW_KERNELS:
        return False
    if name == "onednn_packed":
        return onednn_applies(layer.weight)
    if name == "few_rows_packed":
        return rows <= cpu_few_rows.MAX_ROWS and cpu_few_rows.applies(layer.weight)
    if name == "transposed_weight":
        return layer.weight_t is not None
    if name.startswith("split_rows_"):
        return layer.weight.shape[0] % int(name.rsplit("_", 1)[1]) == 0
    return True


@dataclass
class TunedWeight:
    """One linear layer's tensors as the kernels see them."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    weight_t: torch.Tensor | None = None  # W.T contiguous, kept only where "transposed_weight" may be used
    onednn: torch.Tensor | None = None  # W in oneDNN's blocked layout, made when first timed, kept if chosen
    few_rows: torch.Tensor | None = None  # W packed for cpu_few_rows, with its peers, when first timed; kept if chosen

    def onednn_weight(self) -> torch.Tensor:
        if self.onednn is None:
            self.onednn = torch.ops.mkldnn._reorder_linear_weight(self.weight)
        return self.onednn

    def few_rows_weight(self) -> torch.Tensor:
        if self.few_rows is None:  # LinearKernels packs a kind's weights together; a weight alone packs here
            [self.few_rows] = cpu_few_rows.pack([self.weight])
        return self.few_rows

    @property
    def kind(self) -> tuple[int, int, bool, bool]:
        """Layers of one kind share kernel choices: shape, bias, transposed copy."""
        return (*self.weight.shape, self.bias is not None, self.weight_t is not None)


def row_bucket(rows: int) -> int:
    """Row counts that share a kernel choice: exact up to 8, then powers of two to MAX_TUNED_ROWS,
    then one bucket for all larger counts (timed at LARGE_ROWS).

    Every bucket is timed in prepare() (tune_ahead): 11 buckets took 13 s on the default model
    where 18 (exact up to 16) took 27 s, and the choice changes little between 9 and 16 rows.
    With oneDNN among the candidates and the large bucket, 12 buckets take 20-23 s."""
    if rows <= 8:
        return rows
    if rows > MAX_TUNED_ROWS:
        return LARGE_ROWS
    return 1 << (rows - 1).bit_length()


@dataclass
class LinearKernels:
    """Picks and remembers the fastest kernel per (weight shape, row bucket), by timing.

    All layers of one shape are timed together, one after the other, as a step
    runs them: a single weight timed in a loop would stay in cache and mislead.
    """

    tune: bool = True
    layers: dict[tuple, list[TunedWeight]] = field(default_factory=dict)
    choice: dict[tuple[tuple, int], str] = field(default_factory=dict)
    by_module: dict[nn.Module, TunedWeight] = field(default_factory=dict)  # the installed layers' own

    def install(self, model: nn.Module, transposed_for: set[nn.Module] = frozenset(), skip: set[nn.Module] = frozenset()) -> int:
        """Route every plain nn.Linear of `model` through `forward`; returns how many.

        `transposed_for` names the layers (the LM head) worth a transposed copy of
        their weight: it doubles their memory, and only pays for one-row products.
        `skip` names layers left as they are (ones whose products run fused elsewhere).
        """
        n = 0
        for module in model.modules():
            if type(module) is not nn.Linear or type(module.weight) is not nn.Parameter or module in skip:
                continue  # a sharded or quantized layer keeps its own forward
            w = module.weight.detach()
            tuned = TunedWeight(w, None if module.bias is None else module.bias.detach())
            if module in transposed_for:
                tuned.weight_t = w.t().contiguous()
            self.layers.setdefault(tuned.kind, []).append(tuned)
            self.by_module[module] = tuned
            module.forward = types.MethodType(lambda mod, x, t=tuned: self.forward(x, t), module)
            n += 1
        return n

    def tune_ahead(self, max_rows: int, max_rows_transposed: int) -> None:
        """Pick the kernel of every row bucket a step can bring, now rather than inside a timed step.

        Row counts depend on the schedule (a 3-token chunk with 2 decodes is 5 rows), so a warm-up
        cannot be relied on to meet them all: measured, a chunked run's first timed pass spent
        1.3 s a step choosing kernels for 4-6 rows. Layers with a transposed copy (the LM head)
        see one row per emitting sequence, so they go only to `max_rows_transposed`.
        """
        if not self.tune:
            return
        for kind, peers in self.layers.items():
            weight = peers[0].weight
            limit = max_rows_transposed if peers[0].weight_t is not None else max_rows
            buckets = {row_bucket(r) for r in range(1, min(limit, MAX_TUNED_ROWS) + 1)}
            if limit > MAX_TUNED_ROWS:
                buckets.add(LARGE_ROWS)
            for rows in sorted(buckets):
                if (kind, rows) not in self.choice:
                    x = torch.zeros(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
                    self.choice[(kind, rows)] = self._pick(x, peers[0])
        self.drop_unchosen()

    def drop_unchosen(self) -> None:
        """Free the oneDNN and packed copies of weights whose kind chose that kernel for no row count:
        each is as large as its weight."""
        for name, attribute in (("onednn_packed", "onednn"), ("few_rows_packed", "few_rows")):
            chosen = {kind for (kind, _), chosen_name in self.choice.items() if chosen_name == name}
            for kind, peers in self.layers.items():
                if kind not in chosen:
                    for peer in peers:
                        setattr(peer, attribute, None)

    def forward(self, x: torch.Tensor, layer: TunedWeight) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if not self.tune:
            return F.linear(x, layer.weight, layer.bias)
        key = (layer.kind, row_bucket(rows))
        name = self.choice.get(key)
        if name is None:
            name = self.choice[key] = self._pick(x.reshape(rows, x.shape[-1]), layer)
        out = KERNELS[name](x.reshape(rows, x.shape[-1]), layer)
        return out.view(*x.shape[:-1], out.shape[-1])

    def _pick(self, x: torch.Tensor, layer: TunedWeight) -> str:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return "linear"  # no timing inside a CUDA graph capture
        peers = self.layers.get(layer.kind) or [layer]
        names = [n for n in KERNELS if _applies(n, layer, x.shape[0])]
        if "few_rows_packed" in names and layer.few_rows is None:
            # one huge-page arena for every weight of the kind (see cpu_few_rows)
            for peer, packed in zip(peers, cpu_few_rows.pack([p.weight for p in peers])):
                peer.few_rows = packed
        if len(names) == 1:
            return names[0]
        best = {n: float("inf") for n in names}
        sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
        for n in names:  # warm-up: first calls allocate and load
            KERNELS[n](x, layer)
        for _ in range(ROUNDS):
            for n in names:
                sync()
                t0 = time.perf_counter()
                for peer in peers:
                    KERNELS[n](x, peer)
                sync()
                best[n] = min(best[n], time.perf_counter() - t0)
        return min(best, key=best.get)

    def summary(self) -> dict[str, str]:
        """The choices made so far, for metadata: 'NxK@rows' -> kernel (bias and transposed copy marked)."""
        return {
            f"{n}x{k}{'+b' if bias else ''}{'+T' if t else ''}@{rows}": name
            for ((n, k, bias, t), rows), name in sorted(self.choice.items())
        }

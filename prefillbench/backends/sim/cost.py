"""The cost of one step: a sum over operators, each on the GPU's roofline.

Every operator has FLOPs and bytes moved; its time is the larger of
FLOPs / attained FLOP/s and bytes / attained bandwidth (collectives and
pipeline sends: bytes / link bandwidth plus a latency). A step's time is
the sum over its operators, its pipeline stages, and a per-step overhead.
A calibration can add two terms the roofline does not know: decode attention
attaining its own share of the roofs, and a factor on steps that mix prompt
chunks with decodes (GPUSpec.decode_attention_fraction, mixed_step_factor).

Tensor parallelism splits heads and FFN columns over `tp` GPUs (Megatron
style, two all-reduces per layer); pipeline parallelism splits layers over
`pp` stages, the first also holding the embedding and the last the LM head.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from prefillbench.step import Step

from prefillbench.backends.sim.specs import GiB, GPUSpec, ModelSpec, SimConfigError


@dataclass(frozen=True)
class Batch:
    """What the cost model needs of a step: chunk shapes and decode contexts."""

    chunks: tuple[tuple[int, int, bool], ...] = ()  # (start, tokens computed incl. pads, emits a token)
    decodes: tuple[int, ...] = ()  # context each decode token attends to (itself included)

    @classmethod
    def from_step(cls, step: Step) -> "Batch":
        return cls(
            tuple((c.start, len(c.tokens) + c.pad, c.is_last) for c in step.prefills),
            tuple(d.position + 1 for d in step.decodes),
        )

    @property
    def n_tokens(self) -> int:
        return sum(n for _, n, _ in self.chunks) + len(self.decodes)

    @property
    def n_emit(self) -> int:
        return sum(1 for *_, e in self.chunks if e) + len(self.decodes)


@dataclass
class Op:
    name: str
    flops: float
    bytes: float
    seconds: float
    bound: str  # compute | memory | link | overhead

    def scaled(self, k: int) -> "Op":
        return Op(self.name, self.flops * k, self.bytes * k, self.seconds * k, self.bound)


@dataclass
class StageCost:
    ops: list[Op]

    @property
    def seconds(self) -> float:
        return sum(op.seconds for op in self.ops)


@dataclass
class StepCost:
    stages: list[StageCost]

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    def breakdown(self) -> dict[str, dict]:
        """Per operator, summed over stages: seconds, FLOPs, bytes and what bounds it."""
        out: dict[str, dict] = {}
        for stage in self.stages:
            for op in stage.ops:
                d = out.setdefault(op.name, {"seconds": 0.0, "flops": 0.0, "bytes": 0.0, "bound": op.bound})
                d["seconds"] += op.seconds
                d["flops"] += op.flops
                d["bytes"] += op.bytes
        return out


@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    pp: int = 1


class CostModel:
    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int = 1, pp: int = 1) -> None:
        check_parallel(model, tp, pp)
        self.model, self.gpu, self.tp, self.pp = model, gpu, tp, pp
        base, extra = divmod(model.n_layers, pp)
        self.stage_layers = [base + (1 if i < extra else 0) for i in range(pp)]
        self.q_local = model.q_dim // tp
        self.kv_local = max(model.n_kv_heads // tp, 1) * model.head_dim  # KV heads replicate when tp > kv heads
        self.heads_local = model.n_heads // tp
        stages_per_node = max(1, gpu.gpus_per_node // tp)
        self.send_bw = [
            (gpu.interconnect_bw if k // stages_per_node == (k + 1) // stages_per_node else gpu.network_bw)
            for k in range(pp - 1)
        ]
        self._by_tokens: dict[int, tuple[float, float, float | None]] = {}
        self._lm_head: dict[int, float] = {}

    # ---- roofline primitives ------------------------------------------------
    def _roof(self, name: str, flops: float, nbytes: float, share: float = 1.0) -> Op:
        t_c = flops / (self.gpu.flops * self.gpu.compute_fraction * share)
        t_m = nbytes / (self.gpu.mem_bw * self.gpu.memory_fraction * share)
        return Op(name, flops, nbytes, max(t_c, t_m), "compute" if t_c >= t_m else "memory")

    def _link(self, name: str, nbytes: float, bw: float) -> Op:
        return Op(name, 0.0, nbytes, nbytes / (bw * self.gpu.network_fraction) + self.gpu.collective_latency_s, "link")

    def _linear(self, name: str, n: int, d_in: int, d_out: int) -> Op:
        b = self.model.dtype_bytes
        return self._roof(name, 2.0 * n * d_in * d_out, self.model.weight_bytes * d_in * d_out + b * (n * d_in + n * d_out))

    # ---- one layer ------------------------------------------------------------
    def layer_ops(self, batch: Batch) -> list[Op]:
        m, b, tp = self.model, self.model.dtype_bytes, self.tp
        n = batch.n_tokens
        d, ffn_local = m.hidden, m.ffn // tp
        ops = [
            self._linear("qkv_proj", n, d, self.q_local + 2 * self.kv_local),
            self._linear("attn_out_proj", n, self.q_local, d),
        ]
        if m.gated_mlp:
            ops.append(self._linear("mlp_gate_up", n, d, 2 * ffn_local))
        else:
            ops.append(self._linear("mlp_up", n, d, ffn_local))
        ops.append(self._linear("mlp_down", n, ffn_local, d))
        # Prefill attention: each chunk attends causally to itself and re-reads the KV of its earlier chunks.
        fl = by = 0.0
        for start, length, _ in batch.chunks:
            pairs = length * start + length * (length + 1) / 2
            fl += 4.0 * m.head_dim * self.heads_local * pairs
            by += b * (2 * length * self.q_local + 2 * (start + length) * self.kv_local + 2 * length * self.kv_local)
        if batch.chunks:
            ops.append(self._roof("prefill_attention", fl, by))
        if batch.decodes:
            ctx = sum(batch.decodes)
            k = len(batch.decodes)
            ops.append(self._roof(
                "decode_attention",
                4.0 * m.head_dim * self.heads_local * ctx,
                b * (2 * ctx * self.kv_local + 2 * k * self.q_local + 2 * k * self.kv_local),
                self.gpu.decode_attention_fraction,
            ))
        # Norms, residual adds, rotary, activation: memory-bound elementwise passes.
        act = (3 if m.gated_mlp else 2) * ffn_local
        ops.append(self._roof("norms_elementwise", 10.0 * n * d, b * n * (10 * d + act + 2 * (self.q_local + self.kv_local))))
        if tp > 1:
            per_reduce = 2.0 * (tp - 1) / tp * n * d * b
            ar = self._link("tp_allreduce", per_reduce, self.gpu.interconnect_bw)
            ops.append(Op(ar.name, 0.0, 2 * ar.bytes, 2 * ar.seconds, "link"))
        return ops

    # ---- stages and steps -------------------------------------------------------
    def stage_cost(self, batch: Batch, stage: int, layer_ops: list[Op] | None = None) -> StageCost:
        m, b = self.model, self.model.dtype_bytes
        n = batch.n_tokens
        layer_ops = self.layer_ops(batch) if layer_ops is None else layer_ops
        ops: list[Op] = []
        if stage == 0:
            ops.append(self._roof("embedding", 0.0, 2.0 * n * m.hidden * b))
            if self.gpu.step_overhead_s:
                ops.append(Op("step_overhead", 0.0, 0.0, self.gpu.step_overhead_s, "overhead"))
        ops += [op.scaled(self.stage_layers[stage]) for op in layer_ops]
        if stage == self.pp - 1:
            if batch.n_emit:
                vocab_local = -(-m.vocab // self.tp)
                ops.append(self._linear("lm_head", batch.n_emit, m.hidden, vocab_local))
        else:
            ops.append(self._link("pp_send", n * m.hidden * b, self.send_bw[stage]))
        if batch.chunks and batch.decodes and self.gpu.mixed_step_factor != 1.0:
            ops.append(Op("mixed_step", 0.0, 0.0, (self.gpu.mixed_step_factor - 1.0) * sum(op.seconds for op in ops), "overhead"))
        return StageCost(ops)

    def step_cost(self, batch: Batch) -> StepCost:
        layer_ops = self.layer_ops(batch)
        return StepCost([self.stage_cost(batch, k, layer_ops) for k in range(self.pp)])

    def seconds(self, batch: Batch) -> float:
        return self.step_cost(batch).seconds

    # ---- the same time, fast -----------------------------------------------------
    # A capacity search prices hundreds of thousands of steps; building every Op of every step was half of the
    # sim's time (benchmarks.sim.steps --profile). Without pipeline stages a step's time is a sum whose terms
    # depend on the token count alone (embedding, overhead, linears, elementwise passes, all-reduce), on the
    # emitting rows (LM head), or on the attention shapes: the first two are priced once per count and cached,
    # and the sum keeps step_cost's order of terms, so the two give the same float.
    def fast_seconds(self, chunks: list[tuple[int, int]], n_decodes: int, decode_ctx: int, n_emit: int) -> float:
        """step_cost(batch).seconds for pp == 1, from (start, computed tokens) per chunk and the decode totals."""
        n = n_decodes
        for _, length in chunks:
            n += length
        parts = self._by_tokens.get(n)
        if parts is None:
            parts = self._by_tokens[n] = self._token_terms(n)
        head, norms, reduce = parts
        total = head
        layers = self.stage_layers[0]
        if chunks:
            m, b = self.model, self.model.dtype_bytes
            fl = by = 0.0
            for start, length in chunks:
                pairs = length * start + length * (length + 1) / 2
                fl += 4.0 * m.head_dim * self.heads_local * pairs
                by += b * (2 * length * self.q_local + 2 * (start + length) * self.kv_local + 2 * length * self.kv_local)
            total += self._roof_seconds(fl, by) * layers
        if n_decodes:
            m, b = self.model, self.model.dtype_bytes
            total += self._roof_seconds(4.0 * m.head_dim * self.heads_local * decode_ctx,
                                        b * (2 * decode_ctx * self.kv_local + 2 * n_decodes * self.q_local
                                             + 2 * n_decodes * self.kv_local), self.gpu.decode_attention_fraction) * layers
        total += norms
        if reduce is not None:
            total += reduce
        if n_emit:
            lm = self._lm_head.get(n_emit)
            if lm is None:
                lm = self._lm_head[n_emit] = self._linear("lm_head", n_emit, self.model.hidden, -(-self.model.vocab // self.tp)).seconds
            total += lm
        if chunks and n_decodes and self.gpu.mixed_step_factor != 1.0:
            total += (self.gpu.mixed_step_factor - 1.0) * total
        return total

    def _roof_seconds(self, flops: float, nbytes: float, share: float = 1.0) -> float:
        return max(flops / (self.gpu.flops * self.gpu.compute_fraction * share),
                   nbytes / (self.gpu.mem_bw * self.gpu.memory_fraction * share))

    def _token_terms(self, n: int) -> tuple[float, float, float | None]:
        """The terms of a step of n tokens that its shape does not change: (the partial sum up to and including
        the linears, the elementwise passes, the all-reduce or None), each as stage_cost adds it."""
        if self.pp != 1:
            raise ValueError("fast_seconds prices single-stage steps; pipeline stages go through step_cost")
        ops = self.stage_cost(Batch(((0, n, False),)), 0)
        by_name = {op.name: op.seconds for op in ops.ops}
        total = 0.0
        for op in ops.ops:
            if op.name in ("prefill_attention", "decode_attention", "norms_elementwise"):
                break
            total += op.seconds
        return total, by_name["norms_elementwise"], by_name.get("tp_allreduce")

    def stage_seconds(self, batch: Batch) -> list[float]:
        return [s.seconds for s in self.step_cost(batch).stages]

    # ---- memory -----------------------------------------------------------------
    def weight_bytes_per_gpu(self) -> float:
        """Weights on the most loaded GPU (first or last stage, which hold the embedding / LM head)."""
        m = self.model
        layer = m.layer_params / self.tp
        emb = m.embedding_params / self.tp
        per_stage = [layers * layer for layers in self.stage_layers]
        per_stage[0] += emb
        if not m.tied_embeddings or self.pp > 1:
            per_stage[-1] += emb  # untied head, or a tied one that must live on the last stage too
        return max(per_stage) * m.weight_bytes

    def kv_bytes_per_token_per_gpu(self) -> float:
        return 2 * max(self.stage_layers) * self.kv_local * self.model.dtype_bytes

    def activation_bytes(self, max_step_tokens: int) -> float:
        m = self.model
        width = max(m.hidden, (2 if m.gated_mlp else 1) * m.ffn // self.tp, self.q_local + 2 * self.kv_local)
        return 4.0 * max_step_tokens * width * m.dtype_bytes

    def free_bytes(self, max_step_tokens: int = 0) -> float:
        return self.gpu.mem_bytes - self.gpu.memory_reserve_bytes - self.weight_bytes_per_gpu() - self.activation_bytes(max_step_tokens)

    def check_fits(self) -> None:
        free = self.free_bytes(0)
        if free <= 0:
            need = (self.weight_bytes_per_gpu() + self.gpu.memory_reserve_bytes) / GiB
            raise SimConfigError(
                f"{self.model.name} does not fit on {self.gpu.name} (tp={self.tp}, pp={self.pp}): it needs {need:.1f} GiB "
                f"per GPU for weights and reserve, the GPU has {self.gpu.mem_bytes / GiB:.1f} GiB, short by "
                f"{-free / GiB:.1f} GiB before any KV cache; raise --tp or --pp"
            )

    def kv_capacity_tokens(self, max_step_tokens: int = 0) -> int:
        return max(0, int(self.free_bytes(max_step_tokens) // self.kv_bytes_per_token_per_gpu()))

    def max_sequences(self, max_seq_len: int, max_step_tokens: int = 0) -> int:
        return self.kv_capacity_tokens(max_step_tokens) // max(max_seq_len, 1)


def check_parallel(model: ModelSpec, tp: int, pp: int) -> None:
    if tp < 1 or pp < 1:
        raise SimConfigError(f"--tp and --pp must be at least 1, got tp={tp}, pp={pp}")
    if model.n_heads % tp:
        raise SimConfigError(f"--tp {tp} does not divide {model.name}'s {model.n_heads} attention heads")
    if model.n_kv_heads % tp and tp % model.n_kv_heads:
        raise SimConfigError(f"--tp {tp} and {model.name}'s {model.n_kv_heads} KV heads: neither divides the other")
    if model.ffn % tp:
        raise SimConfigError(f"--tp {tp} does not divide {model.name}'s FFN size {model.ffn}")
    if pp > model.n_layers:
        raise SimConfigError(f"--pp {pp} is more stages than {model.name}'s {model.n_layers} layers")


__all__ = ["Batch", "CostModel", "Op", "StageCost", "StepCost", "check_parallel", "field"]

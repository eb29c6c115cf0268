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

Beyond the dense decoder (docs/sim.md has the formulas and their sources):
- Mixture of experts: per MoE layer a router, the routed experts and any shared
  expert. FLOPs are the k experts each token computes; bytes are the weights of
  the experts the step's T tokens touch, E·(1 − (1 − k/E)^T) in expectation
  under uniform, independent routing (exact for that assumption; real routers
  are skewed, so a small batch touches fewer, and a prompt's tokens are
  correlated, so a chunk touches fewer than T independent tokens would).
- Expert parallelism (`ep` > 1, a multiple of `tp`): each GPU holds E/ep whole
  experts; attention runs in ep/tp data-parallel groups of `tp` GPUs, each on
  1/(ep/tp) of the step's tokens (balanced); tokens reach their experts and come
  back by two all-to-alls over NVLink (and the network past one node).
- Multi-head latent attention: the cache holds kv_lora_rank + qk_rope_head_dim per
  token and layer, the same on every TP rank; prefill up-projects the context's
  latent to keys and values (kv_b_proj over every position a chunk attends), decode
  runs absorbed (queries and outputs through kv_b's halves, attention over the latent).
- Sliding windows: a layer with window W attends at most W positions, so its
  attention FLOPs and KV reads, and the KV a sequence holds there, stop at W.
- Precision: weights, experts, embedding/head and KV cache each at their own
  bytes (ModelSpec); FP8 weights run on the GPU's FP8 tensor rate where it has one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple

from prefillbench.backends.sim.breakdown import Batch, Op, Parallel, StageCost, StepCost
from prefillbench.backends.sim.footprint import Footprint, check_parallel
from prefillbench.backends.sim.pricing import ALLREDUCE_ENGINE_OF, ELEMENTWISE_KERNELS
from prefillbench.backends.sim.specs import GPUSpec, ModelSpec

if TYPE_CHECKING:  # loading the presets fits Vidur's CPU profile: only a sim that names an engine pays for it
    from prefillbench.backends.sim.measured.overheads import EngineOverheads
    from prefillbench.backends.sim.pricing import MeasuredPricing


#: A layer operator's count key: every layer, layers with a dense FFN, MoE layers, or attention layers of a window.
LAYER, DENSE_FFN, MOE = "layer", "dense_ffn", "moe"


class Term(NamedTuple):
    """An operator before it is priced. rows and diag are prefill attention's, for measured pricing: the launch's
    query rows (heads x chunk tokens) and the FLOPs on the chunks' causal diagonal blocks."""

    name: str
    flops: float
    bytes: float
    share: float  # of the roofs (decode attention's calibrated fraction)
    fp8: bool  # on FP8 tensor cores
    key: object  # count key: on how many of a stage's layers it runs
    rows: float = 0.0
    diag: float = 0.0


def expected_experts(n_experts: int, k: int, tokens: float) -> float:
    """Distinct experts `tokens` tokens touch in expectation, each routed to k of n_experts uniformly at random:
    an expert is missed by one token with probability 1 - k/E, by all T independent tokens with (1 - k/E)^T."""
    if tokens <= 0:
        return 0.0
    return n_experts * (1.0 - (1.0 - k / n_experts) ** tokens)


def window_pairs(start: int, length: int, window: int) -> float:
    """Query-key pairs of a causal chunk of `length` at `start` (each position attends itself and what precedes
    it, at most `window` positions; 0: no window)."""
    if window == 0 or start + length <= window:
        return length * start + length * (length + 1) / 2
    lo, hi = start + 1, start + length  # keys each query attends, before the cap
    if lo >= window:
        return float(length * window)
    return (lo + window) * (window - lo + 1) / 2 + (hi - window) * window


class CostModel(Footprint):
    """A step's time on a layout. pricing: None for the spec sheet's roofline, or measured curves
    (pricing.MeasuredPricing); overheads: an engine's host time, launches and CUDA graphs per step (None: the GPU's
    work alone)."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int = 1, pp: int = 1, ep: int = 1,
                 pricing: MeasuredPricing | None = None, overheads: EngineOverheads | None = None) -> None:
        check_parallel(model, tp, pp, ep)
        self.model, self.gpu, self.tp, self.pp, self.ep = model, gpu, tp, pp, ep
        self.pricing = pricing
        self.overheads = overheads if overheads is not None and overheads.name != "none" else None
        self.dp = ep // tp if ep > 1 else 1  # data-parallel attention groups beside expert parallelism
        # whose all-reduce kernel the TP all-reduces run (measured/allreduce.py): the engine's, NCCL without one
        self.allreduce_engine = ALLREDUCE_ENGINE_OF.get(self.overheads.name if self.overheads else "none", "nccl")
        base, extra = divmod(model.n_layers, pp)
        self.stage_layers = [base + (1 if i < extra else 0) for i in range(pp)]
        self.stage_ranges = []
        lo = 0
        for n in self.stage_layers:
            self.stage_ranges.append((lo, lo + n))
            lo += n
        self.stage_counts = [self._counts(lo, hi) for lo, hi in self.stage_ranges]
        self.q_local = model.q_dim // tp
        self.kv_local = max(model.n_kv_heads // tp, 1) * model.head_dim  # KV heads replicate when tp > kv heads
        self.heads_local = model.n_heads // tp
        # Window groups in a fixed order (full attention first): the order the attention operators are summed in.
        self.attention_windows = tuple(sorted({model.window(i) for i in range(model.n_layers)}))
        self.windows = tuple(w for w in self.attention_windows if w)
        self.fp8 = bool(model.fp8_compute and gpu.fp8_flops)
        self.approximations: list[str] = []
        if model.fp8_compute and not gpu.fp8_flops:
            self.approximations.append(
                f"{gpu.name} has no FP8 tensor cores: {model.name}'s FP8 weights are priced weight-only (1 byte each, "
                "bf16 math), as vLLM runs them there (FP8 Marlin)")
        gpn = max(1, gpu.gpus_per_node)
        stages_per_node = max(1, gpn // (tp * self.dp))
        self.send_bw = [
            (gpu.interconnect_bw if k // stages_per_node == (k + 1) // stages_per_node else gpu.network_bw)
            for k in range(pp - 1)
        ]
        self._by_tokens: dict[int, tuple[float, list[float]]] = {}
        self._lm_head: dict[int, float] = {}
        # fast_seconds' attention written out, where shape_terms is grouped-query attention with one KV precision
        # on one data-parallel group: (window, layers) of stage 0 in shape_terms' order.
        plain = (not model.is_mla and self.dp == 1 and model.kv_elem_bytes == model.dtype_bytes
                 and pricing is None)
        self._plain_groups = ([(w, self.stage_counts[0][("attn", w)]) for w in self.attention_windows
                               if self.stage_counts[0].get(("attn", w))] if plain else None)

    # ---- the engine's per-step costs (--sim-overheads) ------------------------------------------------------------
    @cached_property
    def kernels(self) -> tuple[int, int, int]:
        """(kernels, graph pieces, eager kernels) of a step on the most loaded stage: each linear, expert group and
        collective of a layer one kernel, its elementwise passes as Vidur's profile lists them, one attention
        kernel (FlashAttention's varlen call takes prefills and decodes together), and the embedding, LM head and
        sampling; a piecewise CUDA graph (vLLM) is split at each layer's attention."""
        layers = max(self.stage_layers)
        per_layer = (len(self.token_terms(1)) + ELEMENTWISE_KERNELS + 1 + (2 if self.tp > 1 else 0)
                     + (2 if self.dp > 1 else 0))
        return layers * per_layer + 3, layers + 1, layers

    def engine_terms(self, gpu_s: float, n_seqs: int, n_tokens: int, decode_only: bool,
                     after_idle: bool = False) -> dict[str, float]:
        """What the engine's overheads make of a step whose kernels take gpu_s (EngineOverheads.terms)."""
        n_kernels, pieces, eager = self.kernels
        return self.overheads.terms(gpu_s, n_seqs, n_tokens, self.tp, n_kernels, decode_only, after_idle,
                                    eager_kernels=eager, graph_pieces=pieces)

    def _counts(self, lo: int, hi: int) -> dict[object, int]:
        m = self.model
        counts: dict[object, int] = {LAYER: hi - lo, DENSE_FFN: 0, MOE: 0}
        for i in range(lo, hi):
            counts[MOE if m.is_moe_layer(i) else DENSE_FFN] += 1
            key = ("attn", m.window(i))
            counts[key] = counts.get(key, 0) + 1
        return counts

    @property
    def n_gpus(self) -> int:
        return self.tp * self.dp * self.pp

    # ---- roofline primitives ------------------------------------------------
    def _time(self, flops: float, nbytes: float, share: float = 1.0, fp8: bool = False) -> float:
        peak = self.gpu.fp8_flops if fp8 and self.fp8 else self.gpu.flops
        return max(flops / (peak * self.gpu.compute_fraction * share),
                   nbytes / (self.gpu.mem_bw * self.gpu.memory_fraction * share))

    def _roof(self, name: str, flops: float, nbytes: float, share: float = 1.0, fp8: bool = False,
              rows: float = 0.0, diag: float = 0.0) -> Op:
        if self.pricing is not None:
            return self._measured(name, flops, nbytes, fp8 and self.fp8, rows, diag)
        fp8 = fp8 and self.fp8
        peak = self.gpu.fp8_flops if fp8 else self.gpu.flops
        t_c = flops / (peak * self.gpu.compute_fraction * share)
        t_m = nbytes / (self.gpu.mem_bw * self.gpu.memory_fraction * share)
        return Op(name, flops, nbytes, max(t_c, t_m), "compute" if t_c >= t_m else "memory", fp8)

    def _measured(self, name: str, flops: float, nbytes: float, fp8: bool, rows: float, diag: float) -> Op:
        """An operator priced by its class's measured curve (pricing.py); its bound is the class's."""
        seconds = self._measured_seconds(name, flops, nbytes, fp8, rows, diag)
        if name == "prefill_attention":
            return Op(name, flops, nbytes, seconds, "compute")
        if name in ("decode_attention", "norms_elementwise", "embedding"):
            return Op(name, flops, nbytes, seconds, "memory")
        ridge = (self.gpu.fp8_flops if fp8 else self.gpu.flops) / self.gpu.mem_bw
        return Op(name, flops, nbytes, seconds, "compute" if flops >= ridge * nbytes else "memory", fp8)

    def _measured_seconds(self, name: str, flops: float, nbytes: float, fp8: bool, rows: float, diag: float) -> float:
        """_measured's seconds alone: fast_seconds prices every simulated step's attention by it, with no Op built."""
        p = self.pricing
        if name == "prefill_attention":
            return p.prefill_attention(flops, nbytes, rows, diag)
        if name == "decode_attention":
            return p.decode_attention(flops, nbytes)
        if name == "norms_elementwise":
            return p.elementwise(nbytes, ELEMENTWISE_KERNELS)
        if name == "embedding":
            return p.elementwise(nbytes)
        return p.linear(flops, nbytes, fp8)

    def _link(self, name: str, nbytes: float, bw: float) -> Op:
        return Op(name, 0.0, nbytes, nbytes / (bw * self.gpu.network_fraction) + self.gpu.collective_latency_s, "link")

    def _linear_term(self, name: str, n: float, d_in: int, d_out: float, wb: float | None = None,
                     fp8: bool = True) -> tuple[str, float, float, float, bool]:
        """A layer's linear: n rows through a d_in x d_out weight of wb bytes per parameter (the layers' own by
        default, which run on FP8 tensor cores when they are FP8)."""
        b = self.model.dtype_bytes
        wb = self.model.weight_bytes if wb is None else wb
        return name, 2.0 * n * d_in * d_out, wb * d_in * d_out + b * (n * d_in + n * d_out), 1.0, fp8

    def _linear(self, name: str, n: int, d_in: int, d_out: int) -> Op:
        """The LM head's kind of linear (bf16 math, the head's bytes)."""
        b = self.model.dtype_bytes
        return self._roof(name, 2.0 * n * d_in * d_out, self.model.head_bytes * d_in * d_out + b * (n * d_in + n * d_out))

    def _local(self, n: int) -> float:
        """Tokens one GPU's attention sees: all of them, or its data-parallel group's share."""
        return n if self.dp == 1 else n / self.dp

    # ---- one layer: the operators of a step of n tokens that only its token count sets --------------
    def token_terms(self, n: int) -> list[Term]:
        """Projections, FFN or experts: their cost depends on the step's token count alone."""
        m, tp = self.model, self.tp
        nl = self._local(n)
        d = m.hidden
        terms: list[Term] = []
        if m.is_mla:
            h = self.heads_local
            if m.q_lora_rank:
                terms.append((*self._linear_term("q_a_proj", nl, d, m.q_lora_rank), LAYER))
                terms.append((*self._linear_term("q_b_proj", nl, m.q_lora_rank, h * m.head_dim), LAYER))
            else:
                terms.append((*self._linear_term("q_proj", nl, d, h * m.head_dim), LAYER))
            terms.append((*self._linear_term("kv_a_proj", nl, d, m.latent_dim), LAYER))
            terms.append((*self._linear_term("attn_out_proj", nl, h * m.v_head_dim, d), LAYER))
        else:
            terms.append((*self._linear_term("qkv_proj", nl, d, self.q_local + 2 * self.kv_local), LAYER))
            terms.append((*self._linear_term("attn_out_proj", nl, self.q_local, d), LAYER))
        if not m.is_moe or m.dense_layers:
            ffn_local = m.ffn // tp
            if m.gated_mlp:
                terms.append((*self._linear_term("mlp_gate_up", nl, d, 2 * ffn_local), DENSE_FFN))
            else:
                terms.append((*self._linear_term("mlp_up", nl, d, ffn_local), DENSE_FFN))
            terms.append((*self._linear_term("mlp_down", nl, ffn_local, d), DENSE_FFN))
        if m.is_moe:
            terms.append((*self._linear_term("moe_router", nl, d, m.n_experts, wb=m.dtype_bytes, fp8=False), MOE))
            terms.append((*self._experts_term(n), MOE))
            if m.shared_ffn:
                s_local = m.shared_ffn // tp
                terms.append((*self._linear_term("shared_expert_gate_up", nl, d, (m.mlp_matrices - 1) * s_local), MOE))
                terms.append((*self._linear_term("shared_expert_down", nl, s_local, d), MOE))
        return terms

    def _experts_term(self, n: int) -> tuple[str, float, float, float, bool]:
        """The routed experts of one MoE layer, on one GPU: its share of the n·k token-expert pairs, and the
        weights of the distinct experts those touch among the ones it holds."""
        m = self.model
        e, k, g, d = m.n_experts, m.experts_per_tok, m.mlp_matrices, m.hidden
        if self.ep > 1:
            held, f_local, pairs = e / self.ep, m.expert_ffn, n * k / self.ep
        else:
            held, f_local, pairs = e, m.expert_ffn / self.tp, n * k
        touched = held * expected_experts(e, k, n) / e
        flops = 2.0 * pairs * g * d * f_local
        act = m.dtype_bytes * pairs * (d + (g - 1) * f_local + f_local + d)  # up/gate in and out, down in and out
        return "moe_experts", flops, touched * g * d * f_local * m.expert_bytes + act, 1.0, True

    # ---- one layer: attention, whose cost depends on the step's shape --------------------------------------
    def shape_terms(self, chunks, n_decodes: int, decode_ctx: int,
                    window_ctx: dict[int, int] | None = None) -> list[Term]:
        """Attention of chunks [(start, computed tokens)] and of n_decodes decodes over decode_ctx positions in all
        (window_ctx: per window W, the sum of min(context, W); without it, min(decode_ctx, n_decodes·W), exact when
        every context is on one side of W)."""
        m = self.model
        b, kvb = m.dtype_bytes, m.kv_elem_bytes
        h, hd = self.heads_local, m.head_dim
        split = self.dp if self.dp > 1 else 0
        terms: list[Term] = []
        if chunks:
            if m.is_mla:
                rows = 0
                for start, length in chunks:
                    rows += start + length
                width = h * (m.qk_nope_head_dim + m.v_head_dim)
                terms.append(("mla_kv_b_proj", 2.0 * rows * m.kv_lora_rank * width,
                              m.weight_bytes * m.kv_lora_rank * width + kvb * rows * m.kv_lora_rank + b * rows * width,
                              1.0, True, LAYER))
            per_pair = 2.0 * h * (hd + m.v_head_dim) if m.is_mla else 4.0 * hd * h
            rows = h * sum(length for _, length in chunks)  # query rows of the launch (measured pricing)
            for w in self.attention_windows:
                fl = by = 0.0
                diag = 0.0  # the chunks on themselves (measured pricing: the causal diagonal's dearer FLOPs)
                for start, length in chunks:
                    pairs = window_pairs(start, length, w)
                    diag += per_pair * window_pairs(0, length, w)
                    ctx = start + length if w == 0 else min(start, w - 1) + length
                    if m.is_mla:
                        fl += 2.0 * h * pairs * (hd + m.v_head_dim)
                        by += b * (length * h * hd + length * h * m.v_head_dim + ctx * h * (hd + m.v_head_dim)) + kvb * length * m.latent_dim
                    else:
                        fl += 4.0 * hd * h * pairs
                        if kvb == b:
                            by += b * (2 * length * self.q_local + 2 * ctx * self.kv_local + 2 * length * self.kv_local)
                        else:
                            by += b * 2 * length * self.q_local + kvb * (2 * ctx * self.kv_local + 2 * length * self.kv_local)
                if split:
                    fl, by, diag = fl / split, by / split, diag / split
                terms.append(Term("prefill_attention", fl, by, 1.0, False, ("attn", w), rows / split if split else rows,
                                  diag))
        if n_decodes:
            k = n_decodes
            if m.is_mla:
                r = m.kv_lora_rank
                fl = 2.0 * k * h * (m.qk_nope_head_dim * r + r * m.v_head_dim)
                by = b * h * r * (m.qk_nope_head_dim + m.v_head_dim) + b * k * h * (m.qk_nope_head_dim + 2 * r + m.v_head_dim)
                terms.append(("mla_absorb", fl / split if split else fl, by, 1.0, False, LAYER))
            for w in self.attention_windows:
                if w == 0:
                    ctx = decode_ctx
                elif window_ctx is not None:
                    ctx = window_ctx[w]
                else:
                    ctx = min(decode_ctx, k * w)
                if m.is_mla:
                    fl = 2.0 * h * ctx * (m.latent_dim + m.kv_lora_rank)
                    by = kvb * ctx * m.latent_dim + b * k * h * (m.latent_dim + m.kv_lora_rank) + kvb * k * m.latent_dim
                else:
                    fl = 4.0 * hd * h * ctx
                    if kvb == b:
                        by = b * (2 * ctx * self.kv_local + 2 * k * self.q_local + 2 * k * self.kv_local)
                    else:
                        by = kvb * (2 * ctx * self.kv_local + 2 * k * self.kv_local) + b * 2 * k * self.q_local
                if split:
                    fl, by = fl / split, by / split
                terms.append(("decode_attention", fl, by, self.gpu.decode_attention_fraction, False, ("attn", w)))
        return terms

    # ---- one layer: what follows attention, set by the token count ------------------------------------------------
    def tail_ops(self, n: int) -> list[tuple[Op, object]]:
        m, b, tp = self.model, self.model.dtype_bytes, self.tp
        nl = self._local(n)
        d = m.hidden
        # Norms, residual adds, rotary, activation: memory-bound elementwise passes.
        if m.is_moe:
            act = m.mlp_matrices * (m.experts_per_tok * m.expert_ffn + m.shared_ffn) // tp
        else:
            act = (3 if m.gated_mlp else 2) * (m.ffn // tp)
        qkv = self.q_local + (m.latent_dim if m.is_mla else self.kv_local)
        ops = [(self._roof("norms_elementwise", 10.0 * nl * d, b * nl * (10 * d + act + 2 * qkv)), LAYER)]
        if tp > 1:
            per_reduce = 2.0 * (tp - 1) / tp * nl * d * b
            ar = self._link("tp_allreduce", per_reduce, self.gpu.interconnect_bw)
            seconds = (ar.seconds if self.pricing is None  # measured: the engine's all-reduce at the message's size
                       else self.pricing.all_reduce(nl * d * b, tp * self.dp, self.allreduce_engine))
            ops.append((Op(ar.name, 0.0, 2 * ar.bytes, 2 * seconds, "link"), LAYER))
        if self.dp > 1:
            ops.append((self._all_to_all(n), MOE))
        return ops

    def _all_to_all(self, n: int) -> Op:
        """Dispatch and combine of one MoE layer: each GPU sends the k copies of its 1/ep of the step's tokens to the
        GPUs holding their experts, and takes as many back; in a node over NVLink, past it over the network."""
        m, g = self.model, self.gpu
        out = n / self.ep * m.experts_per_tok * m.hidden * m.dtype_bytes  # token copies one GPU sends, each way
        gpn = max(1, g.gpus_per_node)
        near = out * (min(self.ep, gpn) - 1) / self.ep
        far = out * max(self.ep - gpn, 0) / self.ep
        if self.pricing is not None:  # NCCL's all-to-all of the token copies among the ep GPUs, past a node or in one
            one_way = self.pricing.collective("all_to_all", out, self.ep, across_nodes=self.ep > gpn)
        else:
            one_way = (max(near / (g.interconnect_bw * g.network_fraction), far / (g.network_bw * g.network_fraction))
                       + g.collective_latency_s)
        return Op("ep_all_to_all", 0.0, 2 * (near + far), 2 * one_way, "link")

    def layer_ops(self, batch: Batch) -> list[tuple[Op, object]]:
        """One layer's operators, each with the count key that says on how many of a stage's layers it runs."""
        n = batch.n_tokens
        decodes = batch.decodes
        window_ctx = {w: sum(min(c, w) for c in decodes) for w in self.windows} if decodes and self.windows else None
        terms = self.token_terms(n) + self.shape_terms([(s, length) for s, length, _ in batch.chunks] + list(batch.verify),
                                                       len(decodes), sum(decodes), window_ctx)
        ops = [(self._roof(t.name, t.flops, t.bytes, t.share, t.fp8, t.rows, t.diag), t.key) for t in (Term(*x) for x in terms)]
        return ops + self.tail_ops(n)

    # ---- stages and steps -------------------------------------------------------
    def stage_cost(self, batch: Batch, stage: int, layer_ops: list[tuple[Op, object]] | None = None) -> StageCost:
        m, b = self.model, self.model.dtype_bytes
        n = batch.n_tokens
        layer_ops = self.layer_ops(batch) if layer_ops is None else layer_ops
        counts = self.stage_counts[stage]
        ops: list[Op] = []
        if stage == 0:
            ops.append(self._roof("embedding", 0.0, 2.0 * self._local(n) * m.hidden * b))
            if self.gpu.step_overhead_s:
                ops.append(Op("step_overhead", 0.0, 0.0, self.gpu.step_overhead_s, "overhead"))
        ops += [op.scaled(counts[key]) for op, key in layer_ops if counts.get(key)]
        if stage == self.pp - 1:
            if batch.n_emit:
                vocab_local = -(-m.vocab // self.tp)
                ops.append(self._linear("lm_head", self._local(batch.n_emit), m.hidden, vocab_local))
        else:
            nbytes = self._local(n) * m.hidden * b
            if self.pricing is None:
                ops.append(self._link("pp_send", nbytes, self.send_bw[stage]))
            else:
                far = self.send_bw[stage] != self.gpu.interconnect_bw
                ops.append(Op("pp_send", 0.0, nbytes, self.pricing.collective("send_recv", nbytes, 2, far), "link"))
        if batch.chunks and (batch.decodes or batch.verify) and self.gpu.mixed_step_factor != 1.0:
            ops.append(Op("mixed_step", 0.0, 0.0, (self.gpu.mixed_step_factor - 1.0) * sum(op.seconds for op in ops), "overhead"))
        return StageCost(ops)

    def step_cost(self, batch: Batch, after_idle: bool = False) -> StepCost:
        """after_idle: the step follows a wait with nothing running (EngineOverheads.terms)."""
        layer_ops = self.layer_ops(batch)
        cost = StepCost([self.stage_cost(batch, k, layer_ops) for k in range(self.pp)])
        if self.overheads is not None and (batch.chunks or batch.decodes or batch.verify):
            # the host's part of the step comes before the first stage's kernels can run
            t = self.engine_terms(cost.seconds, len(batch.chunks) + len(batch.decodes) + len(batch.verify), batch.n_tokens,
                                  not batch.chunks, after_idle)
            cost.stages[0].ops += [Op(f"engine_{k}", 0.0, 0.0, t[k], "overhead") for k in ("launch", "cpu", "exposed")]
        return cost

    def seconds(self, batch: Batch) -> float:
        return self.step_cost(batch).seconds

    # ---- the same time, fast -----------------------------------------------------
    # A capacity search prices hundreds of thousands of steps; building every Op of every step was half of the
    # sim's time (benchmarks.sim.steps --profile). Without pipeline stages a step's time is a sum whose terms
    # depend on the token count alone (embedding, overhead, linears, experts, elementwise passes, collectives), on
    # the emitting rows (LM head), or on the attention shapes: the first two are priced once per count and cached,
    # and the sum keeps step_cost's order of terms, so the two give the same float.
    def fast_seconds(self, chunks: list[tuple[int, int]], n_decodes: int, decode_ctx: int, n_emit: int,
                     window_ctx: dict[int, int] | None = None, after_idle: bool = False,
                     verify: list[tuple[int, int]] = ()) -> float:
        """step_cost(batch).seconds for pp == 1, from (start, computed tokens) per chunk and the decode totals
        (window_ctx: see shape_terms); `verify`: decodes with drafts as (position, 1 + drafts), Batch.verify."""
        n = n_decodes
        for _, length in chunks:
            n += length
        if verify:
            n_seqs = len(chunks) + n_decodes + len(verify)
            decoding = True
            for _, length in verify:
                n += length
            attend = [*chunks, *verify]
        else:
            n_seqs = len(chunks) + n_decodes
            decoding = n_decodes
            attend = chunks
        parts = self._by_tokens.get(n)
        if parts is None:
            parts = self._by_tokens[n] = self._token_terms(n)
        head, tail = parts
        total = head
        if attend or n_decodes:
            if self._plain_groups is not None:  # shape_terms' grouped-query attention, written out: the hot path
                m, b = self.model, self.model.dtype_bytes
                per_pair = 4.0 * m.head_dim * self.heads_local
                q, kv = self.q_local, self.kv_local
                if attend:
                    for w, count in self._plain_groups:
                        fl = by = 0.0
                        for start, length in attend:
                            fl += per_pair * window_pairs(start, length, w)
                            ctx = start + length if w == 0 else min(start, w - 1) + length
                            by += b * (2 * length * q + 2 * ctx * kv + 2 * length * kv)
                        total += self._time(fl, by) * count
                if n_decodes:
                    share = self.gpu.decode_attention_fraction
                    for w, count in self._plain_groups:
                        ctx = decode_ctx if w == 0 else window_ctx[w] if window_ctx is not None else min(decode_ctx, n_decodes * w)
                        total += self._time(per_pair * ctx, b * (2 * ctx * kv + 2 * n_decodes * q + 2 * n_decodes * kv),
                                            share) * count
            else:
                counts = self.stage_counts[0]
                for t in (Term(*x) for x in self.shape_terms(attend, n_decodes, decode_ctx, window_ctx)):
                    count = counts.get(t.key)
                    if count:
                        total += self._term_seconds(t) * count
        for seconds in tail:
            total += seconds
        if n_emit:
            lm = self._lm_head.get(n_emit)
            if lm is None:
                lm = self._lm_head[n_emit] = self._linear("lm_head", self._local(n_emit), self.model.hidden,
                                                          -(-self.model.vocab // self.tp)).seconds
            total += lm
        if chunks and decoding and self.gpu.mixed_step_factor != 1.0:
            total += (self.gpu.mixed_step_factor - 1.0) * total
        if self.overheads is not None and (chunks or decoding):
            n_kernels, pieces, eager = self.kernels  # engine_terms(...)["step"], with no dict built
            total = self.overheads.step_seconds(total, n_seqs, n, self.tp, n_kernels, not chunks, after_idle,
                                                eager_kernels=eager, graph_pieces=pieces)
        return total

    def _term_seconds(self, t: Term) -> float:
        if self.pricing is not None:  # _roof's seconds, with no Op built
            return self._measured_seconds(t.name, t.flops, t.bytes, t.fp8 and self.fp8, t.rows, t.diag)
        return self._time(t.flops, t.bytes, t.share, t.fp8)

    def _roof_seconds(self, flops: float, nbytes: float, share: float = 1.0) -> float:
        return self._time(flops, nbytes, share)

    def _token_terms(self, n: int) -> tuple[float, list[float]]:
        """The terms of a step of n tokens that its shape does not change, each as stage_cost adds it: the partial
        sum up to and including the linears and experts, then each term after attention (elementwise passes,
        collectives) on its own."""
        if self.pp != 1:
            raise ValueError("fast_seconds prices single-stage steps; pipeline stages go through step_cost")
        m = self.model
        counts = self.stage_counts[0]
        head = 0.0
        head += self._roof("embedding", 0.0, 2.0 * self._local(n) * m.hidden * m.dtype_bytes).seconds
        if self.gpu.step_overhead_s:
            head += self.gpu.step_overhead_s
        for name, fl, by, share, fp8, key, *_ in self.token_terms(n):
            if counts.get(key):
                head += self._roof(name, fl, by, share, fp8).scaled(counts[key]).seconds
        tail = [op.scaled(counts[key]).seconds for op, key in self.tail_ops(n) if counts.get(key)]
        return head, tail

    def stage_seconds(self, batch: Batch) -> list[float]:
        return [s.seconds for s in self.step_cost(batch).stages]



__all__ = ["Batch", "CostModel", "Op", "Parallel", "StageCost", "StepCost", "Term", "check_parallel", "expected_experts", "window_pairs",
           "field"]

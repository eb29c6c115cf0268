"""What a layout holds on its GPUs: weights on the most loaded one, the KV cache's room beside them, and whether
the layout divides the model at all (check_parallel). A base of CostModel, which prices the steps."""
from __future__ import annotations

from prefillbench.backends.sim.specs import GiB, ModelSpec, SimConfigError


class Footprint:
    """Memory of a CostModel's layout (model, gpu, tp, pp, dp, stage_layers, stage_ranges, q_local, kv_local)."""

    def weight_bytes_per_gpu(self) -> float:
        """Weights on the most loaded GPU (first or last stage, which hold the embedding / LM head)."""
        m = self.model
        if not (m.is_moe or m.is_mla) and m.head_bytes == m.weight_bytes:
            layer = m.layer_params / self.tp
            emb = m.embedding_params / self.tp
            per_stage = [layers * layer for layers in self.stage_layers]
            per_stage[0] += emb
            if not m.tied_embeddings or self.pp > 1:
                per_stage[-1] += emb  # untied head, or a tied one that must live on the last stage too
            return max(per_stage) * m.weight_bytes
        emb = m.embedding_params / self.tp * m.head_bytes
        per_stage = [sum(self._layer_weight_bytes(i) for i in range(lo, hi)) for lo, hi in self.stage_ranges]
        per_stage[0] += emb
        if not m.tied_embeddings or self.pp > 1:
            per_stage[-1] += emb
        return max(per_stage)

    def _layer_weight_bytes(self, i: int) -> float:
        m, tp = self.model, self.tp
        wb = m.weight_bytes
        if m.is_mla:  # q_a and kv_a are replicated on every TP rank (vLLM's ReplicatedLinear), the rest split
            attn = (m.mla_q_a_params + m.mla_kv_a_params) * wb + (m.mla_q_b_params + m.mla_kv_b_params
                                                                   + m.v_dim * m.hidden) / tp * wb
        else:
            attn = m.attn_params / tp * wb
        norms = 2 * m.hidden / tp * wb
        if not m.is_moe_layer(i):
            return attn + norms + m.dense_ffn_params / tp * wb
        experts = m.n_experts * m.expert_params / (self.ep if self.ep > 1 else tp) * m.expert_bytes
        return attn + norms + experts + m.shared_params / tp * wb + m.router_params * m.dtype_bytes

    def kv_bytes_per_token_per_gpu(self) -> float:
        """One token's KV cache on the most loaded GPU, every layer of its stage holding it (no window cap)."""
        m = self.model
        if m.is_mla:  # the latent is not split by heads: every TP rank holds all of it
            return max(self.stage_layers) * m.latent_dim * m.kv_elem_bytes
        return 2 * max(self.stage_layers) * self.kv_local * m.kv_elem_bytes

    def activation_bytes(self, max_step_tokens: int) -> float:
        m = self.model
        width = max(m.hidden, (2 if m.gated_mlp else 1) * m.ffn // self.tp, self.q_local + 2 * self.kv_local)
        if m.is_moe:
            f_local = m.expert_ffn if self.ep > 1 else m.expert_ffn // self.tp
            width = max(width, (m.mlp_matrices - 1) * m.experts_per_tok * f_local)
        return 4.0 * max_step_tokens * width * m.dtype_bytes

    def free_bytes(self, max_step_tokens: int = 0) -> float:
        return self.gpu.mem_bytes - self.gpu.memory_reserve_bytes - self.weight_bytes_per_gpu() - self.activation_bytes(max_step_tokens)

    def check_fits(self) -> None:
        free = self.free_bytes(0)
        if free <= 0:
            need = (self.weight_bytes_per_gpu() + self.gpu.memory_reserve_bytes) / GiB
            more = "raise --tp, --pp or --ep" if self.model.is_moe else "raise --tp or --pp"
            raise SimConfigError(
                f"{self.model.name} does not fit on {self.gpu.name} ({self.layout}): it needs {need:.1f} GiB "
                f"per GPU for weights and reserve, the GPU has {self.gpu.mem_bytes / GiB:.1f} GiB, short by "
                f"{-free / GiB:.1f} GiB before any KV cache; {more}"
            )

    @property
    def layout(self) -> str:
        return f"tp={self.tp}, pp={self.pp}" + (f", ep={self.ep}" if self.ep > 1 else "")

    def kv_capacity_tokens(self, max_step_tokens: int = 0) -> int:
        """Tokens of KV cache that fit (on every layer; a sliding window's layers hold fewer of a long sequence's,
        which kv_capacity_positions counts), over all data-parallel groups."""
        per_gpu = max(0, int(self.free_bytes(max_step_tokens) // self.kv_bytes_per_token_per_gpu()))
        return per_gpu * self.dp if self.dp > 1 else per_gpu

    def kv_capacity_positions(self, max_step_tokens: int = 0) -> int:
        """The same room counted in positions summed over layers (ModelSpec.kv_positions), as a windowed model's
        sequences are held."""
        return self.kv_capacity_tokens(max_step_tokens) * self.model.n_layers

    def max_sequences(self, max_seq_len: int, max_step_tokens: int = 0) -> int:
        if self.model.windows:
            return self.kv_capacity_positions(max_step_tokens) // max(self.model.kv_positions(max(max_seq_len, 1)), 1)
        return self.kv_capacity_tokens(max_step_tokens) // max(max_seq_len, 1)


def check_parallel(model: ModelSpec, tp: int, pp: int, ep: int = 1) -> None:
    if tp < 1 or pp < 1 or ep < 1:
        raise SimConfigError(f"--tp, --pp and --ep must be at least 1, got tp={tp}, pp={pp}, ep={ep}")
    if model.n_heads % tp:
        raise SimConfigError(f"--tp {tp} does not divide {model.name}'s {model.n_heads} attention heads")
    if not model.is_mla and model.n_kv_heads % tp and tp % model.n_kv_heads:
        raise SimConfigError(f"--tp {tp} and {model.name}'s {model.n_kv_heads} KV heads: neither divides the other")
    if (not model.is_moe or model.dense_layers) and model.ffn % tp:
        raise SimConfigError(f"--tp {tp} does not divide {model.name}'s FFN size {model.ffn}")
    if pp > model.n_layers:
        raise SimConfigError(f"--pp {pp} is more stages than {model.name}'s {model.n_layers} layers")
    if model.is_moe:
        if ep == 1 and model.expert_ffn % tp:
            raise SimConfigError(f"--tp {tp} does not divide {model.name}'s expert FFN size {model.expert_ffn}")
        if model.shared_ffn % tp:
            raise SimConfigError(f"--tp {tp} does not divide {model.name}'s shared-expert FFN size {model.shared_ffn}")
    if ep > 1:
        if not model.is_moe:
            raise SimConfigError(f"--ep {ep}: {model.name} is dense, it has no experts to spread")
        if ep % tp:
            raise SimConfigError(f"--ep {ep} is not a multiple of --tp {tp} (expert-parallel GPUs are the tensor-parallel "
                                 "groups times the data-parallel attention groups)")
        if model.n_experts % ep:
            raise SimConfigError(f"--ep {ep} does not divide {model.name}'s {model.n_experts} experts")

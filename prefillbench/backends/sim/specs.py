"""What the sim knows about a model (its shapes) and a GPU (its spec sheet).

Models are shapes only: layers, hidden size, heads, KV heads, FFN size and
vocabulary, from a preset or a transformers config.json; and what changes a
step's cost beyond those: routed experts, latent attention, sliding windows, the
bytes of weights and KV cache. GPUs are spec sheets: dense bf16 (and FP8)
FLOP/s, memory bandwidth and size, interconnect bandwidth, plus the fractions of
those peaks that real kernels attain. Sources of every preset are listed next to
it and in docs/sim.md.

A config.json is read for the fields that change a model's cost (SHAPE_FAMILIES):
a family the sim models is priced, one it approximates says so on stderr, and
one it does not model is refused in one line naming the field. Nothing is ever
priced as a different model.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from prefillbench.errors import BackendError

GiB = 1 << 30


class SimConfigError(BackendError):
    """A preset, config file or parallel layout the sim cannot use: one line for the user."""


#: Bytes per weight of each precision the sim prices (`--sim-dtype`), and what it applies to. int4 is weight-only
#: with a 16-bit scale per group of 128 (GPTQ / AWQ, 4.125 bits); MXFP4 is OCP microscaling FP4 (blocks of 32
#: with an 8-bit shared scale, 4.25 bits), which gpt-oss ships for its experts only.
WEIGHT_FORMATS: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5 + 2 / 128,
                                    "mxfp4": 0.5 + 1 / 32}
KV_FORMATS: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
FORMAT_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float8": "fp8", "fp8_e4m3": "fp8",
                  "fp8_e5m2": "fp8", "e4m3": "fp8", "w8a8": "fp8", "w8a16": "int8", "w4a16": "int4", "gptq": "int4",
                  "awq": "int4", "fp4": "mxfp4"}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    ffn: int  # a dense layer's FFN size (in a mixture-of-experts model: its dense layers', if any)
    vocab: int
    head_dim: int = 0  # 0: hidden // n_heads (latent attention: qk_nope_head_dim + qk_rope_head_dim)
    gated_mlp: bool = True  # SwiGLU (3 matrices) vs GELU MLP (2); experts alike
    tied_embeddings: bool = False
    max_context: int = 2048
    dtype_bytes: float = 2  # bf16 / fp16 activations (and KV cache unless kv_bytes says otherwise)
    weight_bytes: float = 0  # per parameter of the layers' linears; 0: dtype_bytes (quantized: e.g. 0.625 for Q4_1)
    source: str = ""
    # ---- mixture of experts (n_experts 0: a dense model)
    n_experts: int = 0  # routed experts per MoE layer
    experts_per_tok: int = 0  # k: experts each token is routed to
    moe_ffn: int = 0  # each routed expert's FFN size; 0: ffn
    shared_ffn: int = 0  # FFN size of the shared expert(s) every token passes through, summed; 0: none
    dense_layers: tuple[int, ...] = ()  # layers of an MoE model whose FFN is dense (ffn): first_k_dense_replace...
    # ---- multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank 0: ordinary grouped-query attention
    kv_lora_rank: int = 0
    q_lora_rank: int = 0  # 0: queries projected from the hidden state directly
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # ---- sliding windows: one per layer, 0 for full attention; (): every layer attends its whole context
    windows: tuple[int, ...] = ()
    # ---- precision beyond weight_bytes (0: as weight_bytes / dtype_bytes)
    kv_bytes: float = 0  # per element of the KV cache
    expert_weight_bytes: float = 0  # per parameter of the routed experts
    head_weight_bytes: float = 0  # per parameter of the embedding and LM head
    fp8_compute: bool = False  # the layers' linears run W8A8 on FP8 tensor cores (where the GPU has them)
    precision: str = ""  # what the bytes above are, in words; "" for the default (bf16 or the GGUF file's)
    approximations: tuple[str, ...] = ()  # named approximations, printed on stderr when the sim loads the model

    def __post_init__(self) -> None:
        for key in ("dense_layers", "windows", "approximations"):  # lists when read back from a calibration file
            object.__setattr__(self, key, tuple(getattr(self, key)))
        if self.kv_lora_rank:
            object.__setattr__(self, "head_dim", self.qk_nope_head_dim + self.qk_rope_head_dim)
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden // self.n_heads)
        if self.weight_bytes == 0:
            object.__setattr__(self, "weight_bytes", self.dtype_bytes)
        if self.windows and len(self.windows) != self.n_layers:
            raise SimConfigError(f"{self.name}: {len(self.windows)} sliding windows for {self.n_layers} layers")
        if self.windows and self.is_mla:
            raise SimConfigError(f"{self.name}: sliding windows with latent attention: a combination the sim does not model")
        if self.is_moe and not 0 < self.experts_per_tok <= self.n_experts:
            raise SimConfigError(f"{self.name}: {self.experts_per_tok} experts per token of {self.n_experts}")
        # kv_positions' terms, once: (layers with full attention, ((window, layers), ...)).
        groups = tuple((w, self.windows.count(w)) for w in sorted({w for w in self.windows if w}))
        object.__setattr__(self, "_kv_groups", (self.n_layers - sum(n for _, n in groups), groups))

    # ---- shapes ---------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn or self.ffn

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    @property
    def kv_elem_bytes(self) -> float:
        return self.kv_bytes or self.dtype_bytes

    @property
    def expert_bytes(self) -> float:
        return self.expert_weight_bytes or self.weight_bytes

    @property
    def head_bytes(self) -> float:
        return self.head_weight_bytes or self.weight_bytes

    def is_moe_layer(self, i: int) -> bool:
        return self.is_moe and i not in self.dense_layers

    def window(self, i: int) -> int:
        """Layer i's sliding window in positions; 0: it attends the whole context."""
        return self.windows[i] if self.windows else 0

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def v_dim(self) -> int:
        """Width of the attention output (what the output projection reads)."""
        return self.n_heads * (self.v_head_dim if self.is_mla else self.head_dim)

    @property
    def latent_dim(self) -> int:
        """Latent attention's cached width per token per layer: the compressed KV and the shared rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def mla_q_a_params(self) -> int:
        return self.hidden * self.q_lora_rank + self.q_lora_rank if self.q_lora_rank else 0

    @property
    def mla_q_b_params(self) -> int:
        return (self.q_lora_rank or self.hidden) * self.q_dim

    @property
    def mla_kv_a_params(self) -> int:
        return self.hidden * self.latent_dim + self.kv_lora_rank

    @property
    def mla_kv_b_params(self) -> int:
        return self.kv_lora_rank * self.n_heads * (self.qk_nope_head_dim + self.v_head_dim)

    @property
    def attn_params(self) -> int:
        if self.is_mla:
            return self.mla_q_a_params + self.mla_q_b_params + self.mla_kv_a_params + self.mla_kv_b_params + self.v_dim * self.hidden
        return self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden

    @property
    def dense_ffn_params(self) -> int:
        return self.mlp_matrices * self.hidden * self.ffn

    @property
    def expert_params(self) -> int:
        """One routed expert's."""
        return self.mlp_matrices * self.hidden * self.expert_ffn

    @property
    def shared_params(self) -> int:
        return self.mlp_matrices * self.hidden * self.shared_ffn

    @property
    def router_params(self) -> int:
        return self.hidden * self.n_experts

    @property
    def layer_params(self) -> int:
        """A dense layer's (every layer's, in a dense model)."""
        attn = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.ffn
        return attn + mlp + 2 * self.hidden  # two norms

    def params_of_layer(self, i: int, active: bool = False) -> int:
        """Layer i's parameters; `active`: those one token computes with (its k routed experts, not all)."""
        if not (self.is_moe or self.is_mla):
            return self.layer_params
        if not self.is_moe_layer(i):
            return self.attn_params + self.dense_ffn_params + 2 * self.hidden
        experts = self.experts_per_tok if active else self.n_experts
        return (self.attn_params + experts * self.expert_params + self.shared_params + self.router_params
                + 2 * self.hidden)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def n_params(self) -> int:
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        if not (self.is_moe or self.is_mla):
            return self.n_layers * self.layer_params + self.embedding_params + head + self.hidden
        return sum(self.params_of_layer(i) for i in range(self.n_layers)) + self.embedding_params + head + self.hidden

    @property
    def n_active_params(self) -> int:
        """Parameters a token computes with: all but the routed experts it is not sent to (embeddings included)."""
        if not self.is_moe:
            return self.n_params
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return (sum(self.params_of_layer(i, active=True) for i in range(self.n_layers)) + self.embedding_params + head
                + self.hidden)

    @property
    def kv_layer_bytes(self) -> float:
        """KV cache of one token in one layer, whole model (before any parallel split)."""
        if self.is_mla:
            return self.latent_dim * self.kv_elem_bytes
        return 2 * self.kv_dim * self.kv_elem_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers, whole model (before any parallel split or window cap)."""
        if self.is_mla or self.kv_bytes:
            return self.n_layers * self.kv_layer_bytes
        return 2 * self.n_layers * self.kv_dim * self.dtype_bytes

    def kv_positions(self, length: int) -> int:
        """Positions of a sequence of `length` the KV cache holds, summed over layers (a window caps its layer's)."""
        full, groups = self._kv_groups
        if not groups:
            return full * length
        held = full * length
        for w, n in groups:
            held += n * (length if length < w else w)
        return held

    def describe(self) -> str:
        """Its architecture in a few words (for stderr and the metadata)."""
        parts = []
        if self.is_moe:
            parts.append(f"{self.n_experts} experts, top-{self.experts_per_tok}"
                         + (f", shared FFN {self.shared_ffn}" if self.shared_ffn else "")
                         + (f", {len(self.dense_layers)} dense layers" if self.dense_layers else ""))
        if self.is_mla:
            parts.append(f"latent attention ({self.kv_lora_rank} + {self.qk_rope_head_dim} cached per token and layer)")
        if self.windows:
            sliding = sorted({w for w in self.windows if w})
            n = sum(1 for w in self.windows if w)
            parts.append(f"sliding window {'/'.join(map(str, sliding))} on {n} of {self.n_layers} layers")
        return "; ".join(parts) or "dense"


def _format(name: str, table: dict[str, float], what: str) -> str:
    key = FORMAT_ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in table:
        raise SimConfigError(f"{what} {name!r}: the sim prices {', '.join(table)}"
                             + (" (float32 is not a serving precision on these GPUs)" if key in ("float32", "fp32") else ""))
    return key


def weight_format(name: str) -> str:
    return _format(name, WEIGHT_FORMATS, "sim weight dtype")


def kv_format(name: str) -> str:
    return _format(name, KV_FORMATS, "sim KV cache dtype")


def with_precision(model: ModelSpec, weights: str | None = None, kv: str | None = None) -> ModelSpec:
    """The model with its weights and/or KV cache priced at another precision.

    bf16 / fp16: every weight 2 bytes. fp8: the layers' linears (experts included) 1 byte, run W8A8 on FP8 tensor
    cores where the GPU has them; embedding, LM head and router stay bf16, as FP8 checkpoints keep them (DeepSeek-V3,
    vLLM's fp8). int8 / int4: the same linears weight-only (bf16 math). mxfp4: the routed experts only, the rest
    bf16, as gpt-oss ships. kv: the KV cache's element (fp8: 1 byte; attention still computes in bf16)."""
    changes: dict[str, Any] = {}
    words = []
    if weights is not None:
        fmt = weight_format(weights)
        wb = WEIGHT_FORMATS[fmt]
        if fmt == "mxfp4":
            if not model.is_moe:
                raise SimConfigError(f"sim weight dtype mxfp4 prices a mixture-of-experts model's expert weights "
                                     f"(as gpt-oss ships them); {model.name} is dense: use int4 for 4-bit weights")
            changes.update(weight_bytes=2.0, expert_weight_bytes=wb, head_weight_bytes=2.0, fp8_compute=False)
            words.append(f"experts mxfp4 ({wb * 8:g} bits), other weights bf16")
        else:
            changes.update(weight_bytes=wb, expert_weight_bytes=0, head_weight_bytes=2.0, fp8_compute=fmt == "fp8")
            if wb == 2.0:
                words.append(f"weights {fmt}")
            else:
                math = "W8A8 on FP8 tensor cores" if fmt == "fp8" else "weight-only, bf16 math"
                words.append(f"weights {fmt} ({wb * 8:g} bits, {math}; embedding, LM head and router bf16)")
    else:
        words.append(model.precision.split("; KV cache")[0] if model.precision else precision_words(model).split("; ")[0])
    if kv is not None:
        fmt = kv_format(kv)
        changes["kv_bytes"] = KV_FORMATS[fmt]
        words.append(f"KV cache {fmt}")
    else:
        words.append(f"KV cache {_kv_word(model.kv_elem_bytes)}")
    if not changes:
        return model
    return replace(model, **changes, precision="; ".join(words))


def _kv_word(nbytes: float) -> str:
    return {2.0: "bf16", 1.0: "fp8", 4.0: "fp32"}.get(float(nbytes), f"{nbytes:g} bytes")


def precision_words(model: ModelSpec) -> str:
    """What the sim prices, in words: the model's own note, or its bytes."""
    if model.precision:
        return model.precision
    w = {2.0: "bf16", 4.0: "fp32"}.get(float(model.weight_bytes))
    weights = f"weights {w}" if w else f"weights {model.weight_bytes:.3g} bytes each"
    return f"{weights}; KV cache {_kv_word(model.kv_elem_bytes)}"


def _alternating(window: int, n: int, first_sliding: bool = True) -> tuple[int, ...]:
    return tuple(window if (i % 2 == 0) == first_sliding else 0 for i in range(n))


MIXTRAL_SOURCE = ("Mixtral paper (arXiv 2401.04088); https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json "
                  "(num_local_experts 8, num_experts_per_tok 2, sliding_window null)")
DEEPSEEK_V3_MTP = ("DeepSeek-V3's multi-token-prediction layer (num_nextn_predict_layers 1) is not priced: it is served "
                   "only for speculative decoding, which the sim does not model (vLLM and SGLang skip it by default)")
GPT_OSS_SOURCE = ("https://huggingface.co/openai/gpt-oss-{size}/blob/main/config.json; gpt-oss model card (arXiv 2508.10925): "
                  "experts in MXFP4 (quantization_config mxfp4, attention, router, embedding and head bf16), alternating "
                  "128-token sliding-window and full attention (layer_types); attention sinks and biases not priced")

# Shapes from the papers and the published config.json files named in `source`.
MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama-13b", 40, 5120, 40, 40, 13824, 32000, max_context=2048,
                  source="LLaMA paper (arXiv 2302.13971) Table 2; huggyllama/llama-13b config.json"),
        ModelSpec("llama-33b", 60, 6656, 52, 52, 17920, 32000, max_context=2048,
                  source="LLaMA paper (arXiv 2302.13971) Table 2; huggyllama/llama-30b config.json"),
        ModelSpec("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, max_context=4096,
                  source="Llama 2 paper (arXiv 2307.09288); meta-llama/Llama-2-70b-hf config.json"),
        ModelSpec("mistral-7b", 32, 4096, 32, 8, 14336, 32000, max_context=32768, windows=(4096,) * 32,
                  source="Mistral 7B paper (arXiv 2310.06825) Table 1; mistralai/Mistral-7B-v0.1 config.json "
                  "(sliding_window 4096 on every layer)"),
        ModelSpec("gpt3-175b", 96, 12288, 96, 96, 4 * 12288, 50257, gated_mlp=False, tied_embeddings=True,
                  max_context=2048, source="GPT-3 paper (arXiv 2005.14165) Table 2.1"),
        # ---- models deployed today
        ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, max_context=131072,
                  source="https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json"),
        ModelSpec("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, max_context=131072,
                  source="https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json"),
        ModelSpec("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, head_dim=128, max_context=40960,
                  source="https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json (head_dim 128, q/k norms not priced)"),
        ModelSpec("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, head_dim=128, max_context=40960,
                  n_experts=128, experts_per_tok=8, moe_ffn=768,
                  source="https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json (num_experts 128, "
                  "num_experts_per_tok 8, moe_intermediate_size 768, decoder_sparse_step 1, no shared expert)"),
        ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, max_context=32768, n_experts=8, experts_per_tok=2,
                  source=MIXTRAL_SOURCE),
        ModelSpec("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, max_context=163840,
                  n_experts=256, experts_per_tok=8, moe_ffn=2048, shared_ffn=2048, dense_layers=(0, 1, 2),
                  kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                  weight_bytes=1.0, head_weight_bytes=2.0, fp8_compute=True,
                  precision="weights fp8 as released (W8A8; embedding, LM head and router bf16); KV cache bf16",
                  approximations=(DEEPSEEK_V3_MTP,),
                  source="DeepSeek-V3 report (arXiv 2412.19437); https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/"
                  "config.json (n_routed_experts 256, n_shared_experts 1, num_experts_per_tok 8, moe_intermediate_size "
                  "2048, first_k_dense_replace 3, kv_lora_rank 512, q_lora_rank 1536, qk_rope_head_dim 64, "
                  "qk_nope_head_dim 128, v_head_dim 128, quantization_config fp8 e4m3 128x128 blocks; group-limited "
                  "routing priced as uniform)"),
        ModelSpec("gpt-oss-20b", 24, 2880, 64, 8, 2880, 201088, head_dim=64, max_context=131072,
                  n_experts=32, experts_per_tok=4, windows=_alternating(128, 24),
                  weight_bytes=2.0, expert_weight_bytes=WEIGHT_FORMATS["mxfp4"], head_weight_bytes=2.0,
                  precision="experts mxfp4 as released (4.25 bits), other weights bf16; KV cache bf16",
                  source=GPT_OSS_SOURCE.format(size="20b")),
        ModelSpec("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, head_dim=64, max_context=131072,
                  n_experts=128, experts_per_tok=4, windows=_alternating(128, 36),
                  weight_bytes=2.0, expert_weight_bytes=WEIGHT_FORMATS["mxfp4"], head_weight_bytes=2.0,
                  precision="experts mxfp4 as released (4.25 bits), other weights bf16; KV cache bf16",
                  source=GPT_OSS_SOURCE.format(size="120b")),
    )
}
MODEL_ALIASES = {"llama-30b": "llama-33b", "llama2-70b": "llama-2-70b", "gpt3": "gpt3-175b", "gpt-3": "gpt3-175b",
                 "llama-3.1-8b-instruct": "llama-3.1-8b", "llama-3-8b": "llama-3.1-8b", "llama-3.1-70b-instruct": "llama-3.1-70b",
                 "mixtral-8x7b-instruct": "mixtral-8x7b", "mixtral": "mixtral-8x7b",
                 "qwen3-30b": "qwen3-30b-a3b"}


@dataclass(frozen=True)
class GPUSpec:
    name: str
    flops: float  # dense bf16/fp16 tensor-core FLOP/s, no sparsity
    mem_bw: float  # bytes/s
    mem_bytes: float
    interconnect_bw: float  # bytes/s per GPU per direction, within a node (tensor parallel, in-node pipeline)
    network_bw: float = 25e9  # bytes/s per GPU across nodes (pipeline stages on other nodes)
    fp8_flops: float = 0.0  # dense FP8 tensor-core FLOP/s; 0: no FP8 tensor cores (FP8 weights run weight-only)
    gpus_per_node: int = 8
    # What real kernels attain of the peaks: generic figures, not fitted to any paper.
    compute_fraction: float = 0.8  # large cuBLAS GEMMs reach ~80% of tensor peak
    memory_fraction: float = 0.85  # streaming kernels reach ~85% of DRAM peak
    network_fraction: float = 0.8
    step_overhead_s: float = 0.0  # per step (scheduling, launches); 0 on spec sheets alone
    # Fitted by a calibration, 1 on spec sheets. Decode attention (one query row against a whole context) runs
    # other kernels than the GEMMs: on a CPU's llama.cpp it attained 1/20 of what they did (tune's calibration).
    decode_attention_fraction: float = 1.0  # share of the other operators' attained roofs it attains
    # A step carrying prompt chunks and decodes together can cost more than its operators: llama.cpp with one KV
    # stream per sequence cuts it into micro-batches, one more pass over the weights (backends/gguf.py).
    mixed_step_factor: float = 1.0  # such a step's time over its operators' sum
    # A real device's step times spread around their price (threads, caches, a shared host); a P99 TBT near one
    # step's time is that spread's tail, which a sim of exact prices never reaches. 0 on spec sheets: exact.
    step_jitter: float = 0.0  # std of log(step time / price), from a calibration's repeats; single-stage sims
    collective_latency_s: float = 10e-6  # per all-reduce / send
    memory_reserve_bytes: float = 1 * GiB  # CUDA context, library workspaces
    source: str = ""

    def with_calibration(self, cal: dict[str, Any]) -> "GPUSpec":
        keys = {f.name for f in fields(self)}
        return replace(self, **{k: v for k, v in cal.items() if k in keys})


GPU_PRESETS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("A6000", 154.8e12, 768e9, 48 * GiB, 32e9,
                source="NVIDIA RTX A6000 datasheet: 154.8 TFLOPS tensor (FP16, dense), 768 GB/s GDDR6, 48 GB; PCIe 4.0 x16"),
        GPUSpec("A100-SXM", 312e12, 2039e9, 80 * GiB, 300e9, network_bw=25e9,
                source="NVIDIA A100 datasheet (80GB SXM): 312 TFLOPS BF16 dense, 2,039 GB/s HBM2e, 600 GB/s NVLink "
                "(300 per direction); 200 Gb/s HDR InfiniBand per GPU (DGX A100)"),
        GPUSpec("A100-PCIe", 312e12, 1935e9, 80 * GiB, 32e9, network_bw=25e9,
                source="NVIDIA A100 datasheet (80GB PCIe): 312 TFLOPS BF16 dense, 1,935 GB/s HBM2e; PCIe 4.0 x16"),
        GPUSpec("H100-SXM", 989e12, 3.35e12, 80 * GiB, 450e9, network_bw=50e9, fp8_flops=1979e12,
                source="NVIDIA H100 datasheet (SXM): 989 TFLOPS BF16 dense (1,979 with sparsity), 1,979 FP8 dense "
                "(3,958 with sparsity), 80 GB HBM3 at 3.35 TB/s, 900 GB/s NVLink (450 per direction); 400 Gb/s NDR "
                "InfiniBand per GPU (DGX H100); https://www.nvidia.com/en-us/data-center/h100/"),
        # NVIDIA's "141 GB" and "180 GB" are GiB, as its "80 GB" are: nvidia-smi reports 143,771 MiB (140.4 GiB) on
        # an H200 (NVIDIA/TensorRT-LLM#9554) and 183,359 MiB (179.1 GiB) on a B200 (NVIDIA/TensorRT-LLM#10278); 141e9
        # and 180e9 bytes would be 131.3 and 167.6 GiB, 7% less than the devices hold.
        GPUSpec("H200", 989e12, 4.8e12, 141 * GiB, 450e9, network_bw=50e9, fp8_flops=1979e12,
                source="NVIDIA H200 datasheet (SXM): 989 TFLOPS BF16 dense, 1,979 FP8 dense (3,958 with sparsity), "
                "4.8 TB/s HBM3e, 141 GB, 900 GB/s NVLink; https://www.nvidia.com/en-us/data-center/h200/; the 141 GB "
                "are GiB: nvidia-smi reports 143,771 MiB total (140.4 GiB), NVIDIA/TensorRT-LLM issue #9554"),
        GPUSpec("B200", 2.25e15, 8e12, 180 * GiB, 900e9, network_bw=50e9, fp8_flops=4.5e15,
                source="NVIDIA DGX B200 / HGX B200 datasheets, per GPU (the 8-GPU figures / 8): 2.25 PFLOPS BF16 dense "
                "(36 PF sparse / 8 / 2), 4.5 PFLOPS FP8 dense (72 PF sparse / 8 / 2), 180 GB HBM3e (1,440 GB / 8), "
                "8 TB/s (64 TB/s / 8), NVLink 5 1.8 TB/s (900 GB/s per direction), 400 Gb/s ConnectX-7 per GPU; "
                "https://www.nvidia.com/en-us/data-center/dgx-b200/ (FP4 tensor cores not priced); the 180 GB are GiB: "
                "nvidia-smi reports 183,359 MiB total (179.1 GiB), NVIDIA/TensorRT-LLM issue #10278"),
        GPUSpec("MI300X", 1307.4e12, 5.3e12, 192 * GiB, 448e9, network_bw=50e9, fp8_flops=2614.9e12,
                source="AMD Instinct MI300X datasheet: 1,307.4 TFLOPS BF16 dense (2,614.9 with sparsity), 2,614.9 "
                "FP8 dense, 192 GB HBM3, 5.3 TB/s, 7 Infinity Fabric links of 128 GB/s (896 GB/s aggregate, 448 per "
                "direction) in an 8-GPU platform, 400 Gb/s per GPU; https://www.amd.com/content/dam/amd/en/documents/"
                "instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf; the 192 GB are GiB: AMD's "
                "https://rocm.docs.amd.com/en/latest/reference/gpu-specs.html lists VRAM 192 GiB (the generic "
                "attained fractions are NVIDIA's; measured MI300X GEMMs reach less of their peak)"),
        GPUSpec("L40S", 362.05e12, 864e9, 48 * GiB, 32e9, fp8_flops=733e12,
                source="NVIDIA L40S datasheet: 362.05 TFLOPS BF16 tensor dense (733 with sparsity), 733 FP8 dense "
                "(1,466 with sparsity), 48 GB GDDR6 at 864 GB/s, PCIe 4.0 x16 (no NVLink); "
                "https://www.nvidia.com/en-us/data-center/l40s/"),
        # For calibrating against a CPU backend: nominal figures, the fit supplies what is attained.
        GPUSpec("CPU", 1e12, 50e9, 16 * GiB, 10e9, compute_fraction=0.1, memory_fraction=0.5, memory_reserve_bytes=0,
                source="nominal placeholder for calibration on a CPU; meaningless uncalibrated"),
    )
}
GPU_ALIASES = {"a100": "A100-SXM", "a100-80gb": "A100-SXM", "h100": "H100-SXM", "h200-sxm": "H200", "b200-sxm": "B200",
               "mi300": "MI300X"}


def _lookup(name: str, presets: dict, aliases: dict) -> Any | None:
    key = name.strip().lower()
    key = aliases.get(key, key).lower()
    for k, v in presets.items():
        if k.lower() == key:
            return v
    return None


def _read_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise SimConfigError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001 - any parse error is one line for the user
        raise SimConfigError(f"cannot parse {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not isinstance(data, dict):
        raise SimConfigError(f"{path} does not hold a mapping of fields")
    return data


NON_GATED_TYPES = {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "gpt_bigcode", "starcoder2"}


@dataclass(frozen=True)
class ShapeFamily:
    """Config fields that change what a step costs beyond the dense decoder's shapes, and what the sim does with them."""

    name: str
    fields: tuple[str, ...]
    handling: str  # modelled | approximated | refused
    note: str = ""
    model_types: tuple[str, ...] = ()  # families known by their model_type alone


#: The shape-changing families the sim knows of. A config with a truthy field of a refused family is refused in one
#: line naming the field; an approximated one loads with the approximation named on stderr. Fields that do not change
#: the cost (rope scaling, norms' epsilon, dropout, routing's loss coefficients) are not listed and not read.
SHAPE_FAMILIES: tuple[ShapeFamily, ...] = (
    ShapeFamily("mixture of experts", ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
                                       "experts_per_token", "moe_intermediate_size", "n_shared_experts",
                                       "shared_expert_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
                                       "decoder_sparse_step", "mlp_only_layers"), "modelled",
                "routed experts under uniform routing, shared experts, dense first layers"),
    ShapeFamily("expert layouts the sim does not read", ("moe_num_experts", "ffn_config", "interleave_moe_layer_step",
                                                         "moe_layer_frequency", "intermediate_size_mlp",
                                                         "num_experts_per_token", "moe_every_k_layers"), "refused",
                "DBRX's ffn_config, Llama 4's interleaved MoE layers, Arctic's residual MoE"),
    ShapeFamily("multi-head latent attention", ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                                                "v_head_dim"), "modelled",
                "compressed KV cache; absorbed decode, up-projected prefill"),
    ShapeFamily("sliding-window attention", ("sliding_window", "layer_types", "sliding_window_pattern",
                                             "use_sliding_window", "max_window_layers"), "modelled",
                "attention and KV capped at each layer's window"),
    ShapeFamily("sliding windows whose per-layer pattern is in the model's code", (), "refused",
                "no layer_types in the config: add them", model_types=("gemma2", "cohere2")),
    ShapeFamily("chunked local attention", ("attention_chunk_size",), "refused", "Llama 4"),
    ShapeFamily("linear-attention and state-space layers", ("ssm_state_size", "mamba_d_state", "mamba_expand",
                                                            "attn_layer_period", "attn_layer_offset",
                                                            "linear_num_value_heads", "linear_num_key_heads",
                                                            "full_attention_interval", "hybrid_override_pattern",
                                                            "layers_block_type", "block_types", "time_step_rank"),
                "refused", "Mamba, Jamba, Qwen3-Next, Nemotron-H, RWKV, or layer_types naming such layers",
                model_types=("mamba", "mamba2", "falcon_mamba", "rwkv", "jamba", "zamba", "zamba2", "falcon_h1",
                             "recurrent_gemma", "qwen3_next", "lfm2", "nemotron_h", "bamba", "granitemoehybrid",
                             "minimax", "xlstm")),
    ShapeFamily("extra prediction layers", ("num_nextn_predict_layers",), "approximated",
                "multi-token prediction serves speculative decoding only, which the sim does not model: not priced"),
    ShapeFamily("encoder-decoder", ("is_encoder_decoder", "cross_attention_layers", "encoder_layers"), "refused",
                "prefillbench benchmarks decoder-only LMs"),
)
#: layer_types values the sim prices (anything else names a layer it does not model).
ATTENTION_LAYER_TYPES = {"full_attention": False, "sliding_attention": True}
#: Quantization methods of a config's quantization_config, as the --sim-dtype they price as.
QUANT_METHODS = {"fp8": "fp8", "fbgemm_fp8": "fp8", "mxfp4": "mxfp4", "gptq": None, "awq": None}


def _truthy(v: Any) -> bool:
    return v not in (None, False, 0, "", [], {})


def shape_check(config: dict[str, Any], name: str) -> list[str]:
    """Refuse a config with a field of a family the sim does not model; the approximations of those it approximates."""
    model_type = str(config.get("model_type", ""))
    notes = []
    for fam in SHAPE_FAMILIES:
        if fam.handling == "modelled":
            continue
        if model_type in fam.model_types:
            raise SimConfigError(f"{name}: model_type {model_type!r} has {fam.name}, which the sim does not model ({fam.note})")
        for f in fam.fields:
            if _truthy(config.get(f)):
                if fam.handling == "refused":
                    raise SimConfigError(f"{name}: {f} = {config[f]!r}: {fam.name}, which the sim does not model ({fam.note})")
                notes.append(f"{name}: {f} = {config[f]!r}: {fam.name} ({fam.note})")
    return notes


def _windows(config: dict[str, Any], name: str, n_layers: int, max_context: int) -> tuple[int, ...]:
    """Each layer's sliding window (0: full attention), from layer_types or the families' window fields."""
    window = config.get("sliding_window")
    layer_types = config.get("layer_types")
    if layer_types:
        bad = sorted({t for t in layer_types if t not in ATTENTION_LAYER_TYPES})
        if bad:
            raise SimConfigError(f"{name}: layer_types names {', '.join(map(repr, bad))} layers: linear-attention or "
                                 "state-space layers, which the sim does not model")
        if len(layer_types) != n_layers:
            raise SimConfigError(f"{name}: layer_types lists {len(layer_types)} layers, num_hidden_layers is {n_layers}")
        sliding = [ATTENTION_LAYER_TYPES[t] for t in layer_types]
        if any(sliding) and not _truthy(window):
            raise SimConfigError(f"{name}: layer_types has sliding_attention layers but sliding_window is not set")
        out = tuple(int(window) if s else 0 for s in sliding)
    elif config.get("use_sliding_window") is False or not _truthy(window):
        return ()
    elif _truthy(config.get("sliding_window_pattern")):  # Gemma 3: every Nth layer global
        n = int(config["sliding_window_pattern"])
        out = tuple(0 if (i + 1) % n == 0 else int(window) for i in range(n_layers))
    elif config.get("use_sliding_window") and config.get("max_window_layers") is not None:  # Qwen2's
        out = tuple(int(window) if i >= int(config["max_window_layers"]) else 0 for i in range(n_layers))
    else:
        out = (int(window),) * n_layers
    # A window as long as the context is full attention: nothing to price.
    out = tuple(w if w < max_context else 0 for w in out)
    return out if any(out) else ()


def _quantization(config: dict[str, Any], name: str) -> str | None:
    """The --sim-dtype a config's quantization_config prices as; refused where the sim does not know the method."""
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method", "")).lower()
    if method in QUANT_METHODS:
        fmt = QUANT_METHODS[method]
        if fmt is None:
            bits = q.get("bits") or q.get("w_bit")
            fmt = {4: "int4", 8: "int8"}.get(int(bits)) if bits else None
        if fmt is not None:
            return fmt
    raise SimConfigError(f"{name}: quantization_config.quant_method = {q.get('quant_method')!r} with these settings is "
                         "not one the sim prices (fp8, mxfp4, 4- or 8-bit gptq/awq): name the precision to price "
                         "(sim weight dtype) instead")


def model_from_config(config: dict[str, Any], name: str, *, precision_given: bool = False) -> ModelSpec:
    """Shapes from a transformers config.json (nested text_config is followed). `precision_given`: the caller prices
    its own weight precision, so a quantization_config the sim does not know is not a refusal."""
    if isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}

    def first(*keys: str):
        for k in keys:
            if config.get(k) is not None:
                return config[k]
        return None

    hidden = first("hidden_size", "n_embd", "d_model")
    layers = first("num_hidden_layers", "n_layer", "num_layers")
    heads = first("num_attention_heads", "n_head")
    vocab = first("vocab_size")
    missing = [k for k, v in (("hidden_size", hidden), ("num_hidden_layers", layers), ("num_attention_heads", heads),
                              ("vocab_size", vocab)) if v is None]
    if missing:
        raise SimConfigError(f"{name}: config has no {', '.join(missing)}; the sim needs the model's shapes")
    approximations = shape_check(config, name)
    model_type = str(config.get("model_type", ""))
    gated = model_type not in NON_GATED_TYPES
    ffn = first("intermediate_size", "n_inner", "ffn_dim")
    if ffn is None:
        if gated:
            raise SimConfigError(f"{name}: config has no intermediate_size; the sim needs the model's shapes")
        ffn = 4 * hidden
    n_layers = int(layers)
    max_context = int(first("max_position_embeddings", "n_positions", "max_sequence_length") or 2048)
    extra: dict[str, Any] = {}
    # Mixture of experts.
    n_experts = int(first("num_local_experts", "num_experts", "n_routed_experts") or 0)
    if n_experts > 1:
        k = first("num_experts_per_tok", "experts_per_token")
        if not k:
            raise SimConfigError(f"{name}: {n_experts} experts but no num_experts_per_tok; the sim needs how many a token uses")
        moe_ffn = int(first("moe_intermediate_size") or ffn)
        shared = int(config.get("n_shared_experts") or 0) * moe_ffn + int(config.get("shared_expert_intermediate_size") or 0)
        k_dense = int(config.get("first_k_dense_replace") or 0)
        freq = int(config.get("moe_layer_freq") or 1)
        step = int(config.get("decoder_sparse_step") or 1)
        mlp_only = {int(i) for i in config.get("mlp_only_layers") or ()}
        dense = tuple(i for i in range(n_layers)
                      if i < k_dense or i % freq or (i + 1) % step or i in mlp_only)
        extra.update(n_experts=n_experts, experts_per_tok=int(k), moe_ffn=moe_ffn, shared_ffn=shared, dense_layers=dense)
        if config.get("shared_expert_intermediate_size"):
            approximations.append(f"{name}: the shared expert's sigmoid gate (hidden x 1) is not priced")
    # Multi-head latent attention.
    if _truthy(config.get("kv_lora_rank")):
        need = ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
        lacking = [f for f in need if not _truthy(config.get(f))]
        if lacking:
            raise SimConfigError(f"{name}: kv_lora_rank without {', '.join(lacking)}; the sim needs latent attention's shapes")
        extra.update(kv_lora_rank=int(config["kv_lora_rank"]), q_lora_rank=int(config.get("q_lora_rank") or 0),
                     **{f: int(config[f]) for f in need})
    windows = _windows(config, name, n_layers, max_context)
    spec = ModelSpec(
        name=name,
        n_layers=n_layers,
        hidden=int(hidden),
        n_heads=int(heads),
        n_kv_heads=int(first("num_key_value_heads", "n_head_kv") or heads),
        ffn=int(ffn),
        vocab=int(vocab),
        head_dim=0 if "kv_lora_rank" in extra else int(first("head_dim") or 0),
        gated_mlp=gated,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_context=max_context,
        source=f"config file {name}",
        windows=windows,
        approximations=tuple(approximations),
        **extra,
    )
    try:
        quant = _quantization(config, name)
    except SimConfigError:
        if precision_given:
            return spec
        raise
    if quant is not None:
        spec = with_precision(spec, weights=quant)
        spec = replace(spec, precision=f"{spec.precision} (quantization_config)")
    return spec


def model_from_gguf(path: Path) -> ModelSpec:
    """Shapes from a GGUF file's metadata; weight bytes per parameter from its tensors (quantization included)."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - any reader failure is one line for the user
        raise SimConfigError(f"cannot read GGUF metadata from {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None

    def value(key: str):
        f = reader.fields.get(key)
        if f is None or not f.data:
            return None
        part = f.parts[f.data[0]]
        return part.tobytes().decode() if part.dtype.kind == "u" and part.dtype.itemsize == 1 else part.tolist()[0]

    arch = value("general.architecture") or "llama"
    keys = {"hidden_size": f"{arch}.embedding_length", "num_hidden_layers": f"{arch}.block_count",
            "num_attention_heads": f"{arch}.attention.head_count", "intermediate_size": f"{arch}.feed_forward_length"}
    config = {k: value(v) for k, v in keys.items()}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    config.update(model_type=arch, num_key_value_heads=value(f"{arch}.attention.head_count_kv"),
                  vocab_size=value(f"{arch}.vocab_size") or (len(tokens.data) if tokens is not None else None),
                  max_position_embeddings=value(f"{arch}.context_length"))
    # The shape-changing metadata llama.cpp writes, as the config fields SHAPE_FAMILIES knows them by.
    shaped = {"num_local_experts": "expert_count", "num_experts_per_tok": "expert_used_count",
              "moe_intermediate_size": "expert_feed_forward_length", "n_shared_experts": "expert_shared_count",
              "shared_expert_intermediate_size": "expert_shared_feed_forward_length",
              "first_k_dense_replace": "leading_dense_block_count", "num_nextn_predict_layers": "nextn_predict_layers",
              "ssm_state_size": "ssm.state_size"}
    config.update({k: v for k, key in shaped.items() if (v := value(f"{arch}.{key}")) is not None})
    # Which layers a window covers, and latent attention's head shapes, are not all in the metadata: refused.
    for key in ("attention.sliding_window", "attention.kv_lora_rank"):
        if value(f"{arch}.{key}"):
            raise SimConfigError(f"{path.name}: {arch}.{key} = {value(f'{arch}.{key}')}: the GGUF metadata does not hold "
                                 "all the sim needs to price it; pass the model's config.json as --sim-model")
    spec = model_from_config(config, path.stem)
    n_elements = sum(int(t.n_elements) for t in reader.tensors)
    n_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    extra: dict[str, Any] = {}
    if spec.is_moe:  # experts, embedding/head and the rest each at their own bytes (a mix of quantizations)
        groups: dict[str, list[int]] = {"experts": [0, 0], "head": [0, 0], "rest": [0, 0]}
        for t in reader.tensors:
            g = "experts" if "_exps" in t.name else "head" if t.name in ("token_embd.weight", "output.weight") else "rest"
            groups[g][0] += int(t.n_bytes)
            groups[g][1] += int(t.n_elements)
        per = {g: b / e for g, (b, e) in groups.items() if e}
        n_bytes, n_elements = groups["rest"][0] or n_bytes, groups["rest"][1] or n_elements
        extra = {"expert_weight_bytes": per.get("experts", 0), "head_weight_bytes": per.get("head", 0)}
    # llama.cpp keeps the KV cache in f16 by default; the weights are whatever the file holds.
    return replace(spec, tied_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
                   dtype_bytes=2, weight_bytes=n_bytes / max(n_elements, 1), source=f"GGUF metadata of {path.name}",
                   **extra)


def load_model_spec(name_or_path: str, *, precision_given: bool = False) -> ModelSpec:
    """A preset by name, a GGUF file, or a config.json (or its folder). `precision_given`: the caller will price its
    own weight precision (with_precision), so a config's quantization the sim does not know is no refusal."""
    preset = _lookup(name_or_path, MODEL_PRESETS, MODEL_ALIASES)
    if preset is not None:
        return preset
    path = Path(name_or_path)
    if path.suffix.lower() == ".gguf" and path.is_file():
        return model_from_gguf(path)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        return model_from_config(_read_mapping(path), path.parent.name if path.name == "config.json" else path.stem,
                                 precision_given=precision_given)
    raise SimConfigError(f"unknown sim model {name_or_path!r}: not a preset ({', '.join(MODEL_PRESETS)}) nor a config.json")


GPU_REQUIRED = ("flops", "mem_bw", "mem_bytes")


def gpu_from_mapping(data: dict[str, Any], name: str) -> GPUSpec:
    data = dict(data)
    # Friendlier units in hand-written spec files.
    for unit_key, key, scale in (("tflops", "flops", 1e12), ("mem_bw_gbs", "mem_bw", 1e9), ("mem_gb", "mem_bytes", 1e9),
                                 ("mem_gib", "mem_bytes", GiB), ("interconnect_gbs", "interconnect_bw", 1e9),
                                 ("network_gbs", "network_bw", 1e9), ("fp8_tflops", "fp8_flops", 1e12)):
        if unit_key in data:
            data[key] = float(data.pop(unit_key)) * scale
    missing = [k for k in GPU_REQUIRED if k not in data]
    if missing:
        raise SimConfigError(f"{name}: GPU spec has no {', '.join(missing)} (or tflops / mem_bw_gbs / mem_gb)")
    known = {f.name for f in fields(GPUSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SimConfigError(f"{name}: unknown GPU spec field(s) {', '.join(unknown)}")
    data.setdefault("name", name)
    data.setdefault("interconnect_bw", 32e9)
    try:
        return GPUSpec(**data)
    except TypeError as e:
        raise SimConfigError(f"{name}: {e}") from None


def load_gpu_spec(name_or_path: str) -> GPUSpec:
    preset = _lookup(name_or_path, GPU_PRESETS, GPU_ALIASES)
    if preset is not None:
        return preset
    path = Path(name_or_path)
    if path.is_file():
        return gpu_from_mapping(_read_mapping(path), path.stem)
    raise SimConfigError(f"unknown sim GPU {name_or_path!r}: not a preset ({', '.join(GPU_PRESETS)}) nor a spec file")


def spec_dict(spec) -> dict[str, Any]:
    return asdict(spec)


__all__ = ["GiB", "GPUSpec", "KV_FORMATS", "ModelSpec", "GPU_PRESETS", "MODEL_PRESETS", "SHAPE_FAMILIES", "SimConfigError",
           "WEIGHT_FORMATS", "load_gpu_spec", "load_model_spec", "model_from_config", "gpu_from_mapping", "precision_words",
           "shape_check", "spec_dict", "with_precision", "field"]

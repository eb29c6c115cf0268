"""What the sim knows about a model (its shapes) and a GPU (its spec sheet), and at what precision it prices them.

Models are shapes only: layers, hidden size, heads, KV heads, FFN size and
vocabulary; and what changes a step's cost beyond those: routed experts, latent
attention, sliding windows, the bytes of weights and KV cache. GPUs are spec
sheets: dense bf16 (and FP8) FLOP/s, memory bandwidth and size, interconnect
bandwidth, plus the fractions of those peaks that real kernels attain.

The named models and GPUs are in presets; reading one from a name or a file
(config.json, GGUF, a GPU spec file) is configs' job. Both build on the types
here, never the other way.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
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
    # The link interconnect_bw is (links.py, --sim-link): pcie4 | pcie5 | nvlink3/4/5 (through NVSwitch) |
    # nvlink-bridge | another fabric's name; "" unnamed (a spec file's). The card's PCIe generation (0: unknown) and
    # its NVLink bridge's bandwidth per direction (0: it takes none) say which others it can have.
    link: str = ""
    pcie_gen: int = 0
    bridge_bw: float = 0.0
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


def spec_dict(spec) -> dict[str, Any]:
    return asdict(spec)


__all__ = ["FORMAT_ALIASES", "GiB", "GPUSpec", "KV_FORMATS", "ModelSpec", "SimConfigError", "WEIGHT_FORMATS",
           "kv_format", "precision_words", "spec_dict", "weight_format", "with_precision"]

"""What the sim knows about a model (its shapes) and a GPU (its spec sheet).

Models are shapes only: layers, hidden size, heads, KV heads, FFN size and
vocabulary, from a preset or a transformers config.json. GPUs are spec sheets:
dense bf16 FLOP/s, memory bandwidth and size, interconnect bandwidth, plus the
fractions of those peaks that real kernels attain. Sources of every preset are
listed next to it and in docs/sim.md.
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


@dataclass(frozen=True)
class ModelSpec:
    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    ffn: int
    vocab: int
    head_dim: int = 0  # 0: hidden // n_heads
    gated_mlp: bool = True  # SwiGLU (3 matrices) vs GELU MLP (2)
    tied_embeddings: bool = False
    max_context: int = 2048
    dtype_bytes: float = 2  # bf16 / fp16 activations and KV cache
    weight_bytes: float = 0  # per parameter; 0: dtype_bytes (quantized weights: e.g. 0.625 for Q4_1)
    source: str = ""

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden // self.n_heads)
        if self.weight_bytes == 0:
            object.__setattr__(self, "weight_bytes", self.dtype_bytes)

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        attn = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.ffn
        return attn + mlp + 2 * self.hidden  # two norms

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def n_params(self) -> int:
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.n_layers * self.layer_params + self.embedding_params + head + self.hidden

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers, whole model (before any parallel split)."""
        return 2 * self.n_layers * self.kv_dim * self.dtype_bytes


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
        ModelSpec("mistral-7b", 32, 4096, 32, 8, 14336, 32000, max_context=32768,
                  source="Mistral 7B paper (arXiv 2310.06825) Table 1; mistralai/Mistral-7B-v0.1 config.json "
                  "(sliding-window attention not modelled: every token attends its whole context)"),
        ModelSpec("gpt3-175b", 96, 12288, 96, 96, 4 * 12288, 50257, gated_mlp=False, tied_embeddings=True,
                  max_context=2048, source="GPT-3 paper (arXiv 2005.14165) Table 2.1"),
    )
}
MODEL_ALIASES = {"llama-30b": "llama-33b", "llama2-70b": "llama-2-70b", "gpt3": "gpt3-175b", "gpt-3": "gpt3-175b"}


@dataclass(frozen=True)
class GPUSpec:
    name: str
    flops: float  # dense bf16/fp16 tensor-core FLOP/s, no sparsity
    mem_bw: float  # bytes/s
    mem_bytes: float
    interconnect_bw: float  # bytes/s per GPU per direction, within a node (tensor parallel, in-node pipeline)
    network_bw: float = 25e9  # bytes/s per GPU across nodes (pipeline stages on other nodes)
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
        GPUSpec("H100-SXM", 989e12, 3.35e12, 80 * GiB, 450e9, network_bw=50e9,
                source="NVIDIA H100 datasheet (SXM): 989 TFLOPS BF16 dense (1,979 with sparsity), 3.35 TB/s HBM3, "
                "900 GB/s NVLink (450 per direction); 400 Gb/s NDR InfiniBand per GPU (DGX H100)"),
        GPUSpec("H200", 989e12, 4.8e12, 141e9, 450e9, network_bw=50e9,
                source="NVIDIA H200 datasheet (SXM): 989 TFLOPS BF16 dense, 4.8 TB/s HBM3e, 141 GB, 900 GB/s NVLink"),
        # For calibrating against a CPU backend: nominal figures, the fit supplies what is attained.
        GPUSpec("CPU", 1e12, 50e9, 16 * GiB, 10e9, compute_fraction=0.1, memory_fraction=0.5, memory_reserve_bytes=0,
                source="nominal placeholder for calibration on a CPU; meaningless uncalibrated"),
    )
}
GPU_ALIASES = {"a100": "A100-SXM", "a100-80gb": "A100-SXM", "h100": "H100-SXM", "h200-sxm": "H200"}


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


def model_from_config(config: dict[str, Any], name: str) -> ModelSpec:
    """Shapes from a transformers config.json (nested text_config is followed)."""
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
    model_type = str(config.get("model_type", ""))
    gated = model_type not in NON_GATED_TYPES
    ffn = first("intermediate_size", "n_inner", "ffn_dim")
    if ffn is None:
        if gated:
            raise SimConfigError(f"{name}: config has no intermediate_size; the sim needs the model's shapes")
        ffn = 4 * hidden
    return ModelSpec(
        name=name,
        n_layers=int(layers),
        hidden=int(hidden),
        n_heads=int(heads),
        n_kv_heads=int(first("num_key_value_heads", "n_head_kv") or heads),
        ffn=int(ffn),
        vocab=int(vocab),
        head_dim=int(first("head_dim") or 0),
        gated_mlp=gated,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_context=int(first("max_position_embeddings", "n_positions", "max_sequence_length") or 2048),
        source=f"config file {name}",
    )


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
    spec = model_from_config(config, path.stem)
    n_elements = sum(int(t.n_elements) for t in reader.tensors)
    n_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    # llama.cpp keeps the KV cache in f16 by default; the weights are whatever the file holds.
    return replace(spec, tied_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
                   dtype_bytes=2, weight_bytes=n_bytes / max(n_elements, 1), source=f"GGUF metadata of {path.name}")


def load_model_spec(name_or_path: str) -> ModelSpec:
    preset = _lookup(name_or_path, MODEL_PRESETS, MODEL_ALIASES)
    if preset is not None:
        return preset
    path = Path(name_or_path)
    if path.suffix.lower() == ".gguf" and path.is_file():
        return model_from_gguf(path)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        return model_from_config(_read_mapping(path), path.parent.name if path.name == "config.json" else path.stem)
    raise SimConfigError(f"unknown sim model {name_or_path!r}: not a preset ({', '.join(MODEL_PRESETS)}) nor a config.json")


GPU_REQUIRED = ("flops", "mem_bw", "mem_bytes")


def gpu_from_mapping(data: dict[str, Any], name: str) -> GPUSpec:
    data = dict(data)
    # Friendlier units in hand-written spec files.
    for unit_key, key, scale in (("tflops", "flops", 1e12), ("mem_bw_gbs", "mem_bw", 1e9), ("mem_gb", "mem_bytes", 1e9),
                                 ("mem_gib", "mem_bytes", GiB), ("interconnect_gbs", "interconnect_bw", 1e9),
                                 ("network_gbs", "network_bw", 1e9)):
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


__all__ = ["GiB", "GPUSpec", "ModelSpec", "GPU_PRESETS", "MODEL_PRESETS", "SimConfigError", "load_gpu_spec",
           "load_model_spec", "model_from_config", "gpu_from_mapping", "spec_dict", "field"]

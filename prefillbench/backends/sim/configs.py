"""A model or a GPU for the sim from a name or a file: a preset, a transformers config.json (or its folder), a
GGUF file's metadata, or a GPU spec file (JSON or YAML).

A config.json is read for the fields that change a model's cost (SHAPE_FAMILIES):
a family the sim models is priced, one it approximates says so on stderr, and
one it does not model is refused in one line naming the field. Nothing is ever
priced as a different model.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from prefillbench.backends.sim.presets import GPU_ALIASES, GPU_PRESETS, MODEL_ALIASES, MODEL_PRESETS
from prefillbench.backends.sim.specs import GiB, GPUSpec, ModelSpec, SimConfigError, with_precision

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
                                 ("network_gbs", "network_bw", 1e9), ("fp8_tflops", "fp8_flops", 1e12),
                                 ("bridge_gbs", "bridge_bw", 1e9)):
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


__all__ = ["ATTENTION_LAYER_TYPES", "GPU_REQUIRED", "NON_GATED_TYPES", "QUANT_METHODS", "SHAPE_FAMILIES",
           "ShapeFamily", "gpu_from_mapping", "load_gpu_spec", "load_model_spec", "model_from_config",
           "model_from_gguf", "shape_check"]

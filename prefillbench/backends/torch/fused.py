"""A Llama-family decoder run layer by layer, with its projections fused.

transformers runs q, k and v as three products and gate and up as two. For one
or a few rows every product is its own pass over memory and its own dispatch;
fused, a layer has four products instead of seven, as in vLLM's and nano-vllm's
QKV and merged gate-up layers. Measured on this project's 2-core CPU, fp32,
SmolLM2-135M, a decode step at 32 positions: one sequence 36.0 -> 31.4 ms,
four 45.5 -> 41.1 ms (medians of 21 interleaved steps), logits unchanged.

On the CPU in float32 or bfloat16 a layer's elementwise work (residual adds,
RMSNorms, rotary, SiLU gate) goes through cpu_layer_ops' compiled loops, four
calls a layer; on CUDA (`compile_ops`) through four functions inductor compiles
into one kernel a call (`CompiledLayerOps`: an RMSNorm is 8 ops eager, rotary
10, and under a CUDA graph every kernel is a launch the replay pays, some 35-40
a layer); elsewhere through transformers' own modules, in the same loop.

Whether the decode layer as a whole should be compiled under the graphs, as
gpt-fast does: not here. The layer's products already run through the linear
tuner's chosen kernels and attention through the flex route's compiled calls;
what inductor adds is the fusion of the elementwise work between them, which
these four functions give without tracing the tuner, the route's per-step
lists or transformers' modules. backends/torch/compiled.py (`--compile`, the
CPU's whole-step graph with attention as an opaque op) stays the CPU's and is
not extended to CUDA.

The transformers modules keep their weights, as views into the fused tensors,
so nothing is stored twice and the model still runs as transformers' own (the
reference the parity tests compare against). A model whose layers do not have
exactly this shape runs through transformers' forward instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from prefillbench.backends.torch.cpu import layer_ops as cpu_layer_ops
from prefillbench.backends.torch.linear import LinearKernels, TunedWeight

#: Norms computing weight * x / sqrt(mean(x^2) + eps) (in float32, rounded to the input dtype before the
#: weight), the formula cpu_layer_ops.add_rms_norm implements.
RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")

#: Families whose decoder layer is: RMSNorm, attention (q, k, v, o; optional q/k/v bias), residual,
#: RMSNorm, SiLU-gated MLP (gate, up, down), residual. Others (qk-norm, fused weights of their
#: own, extra norms, scaled embeddings) keep transformers' forward.
FUSABLE_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass
class FusedLayer:
    """One decoder layer's fused weights; o_proj, down_proj and the norms stay the layer's own modules."""

    module: nn.Module  # the transformers decoder layer
    qkv: TunedWeight
    gate_up: TunedWeight
    qkv_sizes: tuple[int, int, int]


def _fuse(linears: list[nn.Linear]) -> TunedWeight:
    """One weight (and bias) for several linear layers; each layer keeps a view of its rows."""
    weight = torch.cat([m.weight.detach() for m in linears])
    bias = torch.cat([m.bias.detach() for m in linears]) if linears[0].bias is not None else None
    row = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight.data = weight[row : row + n]
        if bias is not None:
            m.bias.data = bias[row : row + n]
        row += n
    return TunedWeight(weight, bias)


def _fusable_layer(layer: nn.Module) -> bool:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None or hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
        return False
    names = [(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")] + [(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")]
    if not all(type(getattr(owner, n, None)) is nn.Linear for owner, n in names):
        return False
    if attn.o_proj.bias is not None or mlp.down_proj.bias is not None or mlp.gate_proj.bias is not None:
        return False
    if len({attn.q_proj.bias is None, attn.k_proj.bias is None, attn.v_proj.bias is None}) > 1:
        return False  # q, k and v fuse into one product only if all or none have a bias
    extra_norms = {n for n, _ in layer.named_children()} - {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
    return not extra_norms and hasattr(attn, "scaling")


class FusedDecoder:
    """The decoder's layers with fused projections; `forward` returns the last hidden state."""

    def __init__(self, decoder: nn.Module, layers: list[FusedLayer], attention) -> None:
        self.decoder = decoder
        self.layers = layers
        self.attention = attention  # packed_attention: (module, q, k, v, mask, scaling=, pb_layout=)
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        self.rotary = apply_rotary_pos_emb
        norms = [n for f in layers for n in (f.module.input_layernorm, f.module.post_attention_layernorm)] + [decoder.norm]
        # Other norms (an offset weight, another eps name) keep their own modules.
        self.rms_norms = all(type(n).__name__ in RMS_NORMS and hasattr(n, "variance_epsilon") for n in norms)
        self.c_layer_ops = self.rms_norms and all(
            f.module.self_attn.head_dim <= cpu_layer_ops.MAX_HEAD_DIM and f.module.self_attn.head_dim % 2 == 0 for f in layers)
        #: Whether the elementwise work runs through CompiledLayerOps (set by the backend: on CUDA by default).
        self.compile_ops = False

    @classmethod
    def build(cls, model: nn.Module, attention) -> "FusedDecoder | None":
        """Fuse `model`'s projections in place if it is a plain Llama-family decoder; else None."""
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        decoder = model.get_decoder()
        if config.model_type not in FUSABLE_MODEL_TYPES or getattr(config, "hidden_act", None) != "silu" or not all(
                hasattr(decoder, n) for n in ("embed_tokens", "rotary_emb", "norm", "layers")):
            return None
        if not all(_fusable_layer(layer) for layer in decoder.layers):
            return None
        layers = []
        for layer in decoder.layers:
            attn, mlp = layer.self_attn, layer.mlp
            sizes = tuple(m.weight.shape[0] for m in (attn.q_proj, attn.k_proj, attn.v_proj))
            layers.append(FusedLayer(layer, _fuse([attn.q_proj, attn.k_proj, attn.v_proj]),
                                     _fuse([mlp.gate_proj, mlp.up_proj]), sizes))
        return cls(decoder, layers, attention)

    @property
    def replaced(self) -> set[nn.Module]:
        """The linear layers the fused products stand in for: never called, so not worth tuning."""
        return {m for f in self.layers for m in (f.module.self_attn.q_proj, f.module.self_attn.k_proj,
                                                 f.module.self_attn.v_proj, f.module.mlp.gate_proj, f.module.mlp.up_proj)}

    def register(self, kernels: LinearKernels) -> None:
        """Let the kernel tuner time the fused weights alongside their peers of the same shape."""
        for f in self.layers:
            for tuned in (f.qkv, f.gate_up):
                kernels.layers.setdefault(tuned.kind, []).append(tuned)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, layout, linear: LinearKernels) -> torch.Tensor:
        d = self.decoder
        residual = d.embed_tokens(input_ids)  # a fresh tensor: the residual stream is added to in place
        cos, sin = d.rotary_emb(residual, position_ids=position_ids)
        if self.compile_ops:
            ops: TorchLayerOps = CompiledLayerOps(cos, sin, self.rotary)
        elif self.c_layer_ops and cpu_layer_ops.applies(residual):
            ops = CLayerOps(cos, sin)
        else:
            ops = TorchLayerOps(cos, sin, self.rotary)
        n_tokens = residual.shape[1]
        x = ops.add_norm(residual, None, self.layers[0].module.input_layernorm)
        for i, f in enumerate(self.layers):
            layer, attn = f.module, f.module.self_attn
            qkv = linear.forward(x, f.qkv)
            q, k, v = ops.rotate(qkv, f.qkv_sizes, attn.head_dim)
            rotated = qkv if ops.rotates_in_place and qkv.is_contiguous() else None
            out, _ = self.attention(attn, q, k, v, None, scaling=attn.scaling, pb_layout=layout, pb_qkv=rotated)
            x = ops.add_norm(residual, attn.o_proj(out.reshape(1, n_tokens, -1)), layer.post_attention_layernorm)
            mlp_out = layer.mlp.down_proj(ops.silu_mul(linear.forward(x, f.gate_up)))
            following = self.layers[i + 1].module.input_layernorm if i + 1 < len(self.layers) else d.norm
            x = ops.add_norm(residual, mlp_out, following)
        return x


def split_heads(qkv: torch.Tensor, sizes: tuple[int, int, int], head_dim: int) -> tuple[torch.Tensor, ...]:
    """q, k, v [1, heads, tokens, head_dim], views of a fused qkv product [1, tokens, width]."""
    shape = (1, qkv.shape[1], -1, head_dim)
    return tuple(t.view(shape).transpose(1, 2) for t in qkv.split(sizes, dim=-1))


class TorchLayerOps:
    """A layer's elementwise work through transformers' modules and torch ops."""

    #: Whether `rotate` leaves q and k rotated inside the qkv product it was given (else in new tensors).
    rotates_in_place = False

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, rotary) -> None:
        self.cos, self.sin, self.rotary = cos, sin, rotary

    @staticmethod
    def add_norm(residual: torch.Tensor, delta: torch.Tensor | None, norm: nn.Module) -> torch.Tensor:
        if delta is not None:
            residual.add_(delta)
        return norm(residual)

    def rotate(self, qkv: torch.Tensor, sizes: tuple[int, int, int], head_dim: int):
        """q, k, v [1, heads, tokens, head_dim] from a fused qkv product [1, tokens, width], q and k rotated."""
        q, k, v = split_heads(qkv, sizes, head_dim)
        q, k = self.rotary(q, k, self.cos, self.sin)
        return q, k, v

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class CLayerOps(TorchLayerOps):
    """The same work through cpu_layer_ops' compiled loops (CPU, float32 or bfloat16)."""

    rotates_in_place = True

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        super().__init__(cos.contiguous(), sin.contiguous(), None)

    @staticmethod
    def add_norm(residual: torch.Tensor, delta: torch.Tensor | None, norm: nn.Module) -> torch.Tensor:
        # A norm weight kept in another dtype (some checkpoints keep norms in float32) is cast, not refused.
        weight = norm.weight.to(residual.dtype)
        return cpu_layer_ops.add_rms_norm(residual, None if delta is None else delta.contiguous(), weight, norm.variance_epsilon)

    def rotate(self, qkv: torch.Tensor, sizes: tuple[int, int, int], head_dim: int):
        qkv = qkv.contiguous()
        cpu_layer_ops.rotary_(qkv, self.cos, self.sin, (sizes[0] + sizes[1]) // head_dim, head_dim)
        return split_heads(qkv, sizes, head_dim)

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        return cpu_layer_ops.silu_mul(gate_up.contiguous())


# ------------------------------------------------------------------ compiled by inductor (CUDA)
def _add_rms_norm(residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += delta, then weight * residual / sqrt(mean(residual^2) + eps), as RMS_NORMS compute it."""
    if delta is not None:
        residual.add_(delta)
    x = residual.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(residual.dtype)


def _rotate(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sizes: tuple[int, int, int], head_dim: int):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, k, _ = split_heads(qkv, sizes, head_dim)
    return apply_rotary_pos_emb(q, k, cos, sin)


def _silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


_COMPILED: dict[str, object] = {}


def _compiled(name: str):
    """One compiled function per process (every layer and every backend shares its graphs): static in the widths
    and constants, dynamic in the tokens where `CompiledLayerOps.marking` marked them (a single token is a
    graph of its own: dynamo specialises a dimension of 1)."""
    if name not in _COMPILED:
        fn = {"add_norm": _add_rms_norm, "rotate": _rotate, "silu_mul": _silu_mul}[name]
        _COMPILED[name] = torch.compile(fn, dynamic=False, fullgraph=True)
    return _COMPILED[name]


def _tokens_dynamic(*tensors: torch.Tensor | None) -> None:
    import torch._dynamo

    for t in tensors:
        if t is not None and t.shape[1] > 1:
            torch._dynamo.mark_dynamic(t, 1)


class CompiledLayerOps(TorchLayerOps):
    """The same work as TorchLayerOps (same formulas), each call one inductor-compiled kernel or two."""

    #: While True (the backend's warm-up), calls mark their token dimension dynamic, so that one graph serves
    #: every step length; after it a call that would compile is a shape class the warm-up missed.
    marking = True

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, rotary) -> None:
        super().__init__(cos, sin, rotary)

    @staticmethod
    def add_norm(residual: torch.Tensor, delta: torch.Tensor | None, norm: nn.Module) -> torch.Tensor:
        delta = None if delta is None else delta.contiguous()  # a tuned product may hand back a transposed view
        if CompiledLayerOps.marking:
            _tokens_dynamic(residual, delta)
        return _compiled("add_norm")(residual, delta, norm.weight, norm.variance_epsilon)

    def rotate(self, qkv: torch.Tensor, sizes: tuple[int, int, int], head_dim: int):
        qkv = qkv.contiguous()
        if CompiledLayerOps.marking:
            _tokens_dynamic(qkv, self.cos, self.sin)
        q, k = _compiled("rotate")(qkv, self.cos, self.sin, tuple(sizes), head_dim)
        return q, k, split_heads(qkv, sizes, head_dim)[2]

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        gate_up = gate_up.contiguous()
        if CompiledLayerOps.marking:
            _tokens_dynamic(gate_up)
        return _compiled("silu_mul")(gate_up)

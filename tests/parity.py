"""How far two float32 evaluations of a tiny model's logits may differ, derived from float32 rounding.

A float32 sum y = p_1 + ... + p_K in any order (another ISA's blocking, a C kernel, another library) is off from the
exact sum by sum_k d_k s_k: one rounding |d_k| <= u = 2**-24 (variance <= u**2/3) per partial sum s_k, and over an
order unrelated to the data sum_k E[s_k**2] <= K (y**2 + sum p_i**2) / 3, so the error has
sigma = u/3 * sqrt(K (y**2 + sum p_i**2)) (probabilistic rounding analysis, as Higham and Mary's; the worst-case
bound K u sum|p_i| is some K times this and is not met). `logit_sigma` adds errors of that size to every sum in a
float64 copy of the reference (each projection, attention score, softmax total and P.V sum, each norm), u to each
elementwise op (2u to exp and silu), and takes each logit's spread over DRAWS draws. Two float32 evaluations differ by
sqrt(2) sigma per logit; `assert_logits_match` accepts LAMBDA = 6 times that, logit by logit. Against a float64
forward, the float32 reference's own error stays under 2 sigma (the model overstates blocked and SIMD sums).

In these models the attention scores dominate: an error in a score moves its softmax weight by as much, relatively,
and with tiny_model's wide init (0.2) the scores reach tens at hidden size 256. There the last position's
tolerances run from 4e-5 to 9e-4 (the prompt's and decode's logits in test_kernel_choice); at hidden size 64 from
5e-6 to 1.4e-4, inside the 2e-4 + 1e-4 |logit| that the rest of the suite allows against transformers.
"""
from __future__ import annotations

import copy
import hashlib
import math

import numpy as np
import torch
import torch.nn as nn

#: float32's unit roundoff.
U = 2.0**-24
#: The bound, in standard deviations of the difference of two evaluations. With sigma estimated from DRAWS draws
#: the ratio is t-distributed: P(|t_64| > 6) ~ 1e-7 a logit, ~5e-5 for a row of 512 logits.
LAMBDA = 6.0
#: Monte Carlo draws, run as one batch.
DRAWS = 64
_ATTENTION = "prefillbench_rounding_noise"
_CACHE: dict[str, np.ndarray] = {}


def _sum_sigma(total: torch.Tensor, squares: torch.Tensor, k: int) -> torch.Tensor:
    """The rounding error's sigma for sums of k terms, given the sums and the sums of their terms' squares."""
    return U / 3 * torch.sqrt(k * (total**2 + squares))


class _Noise:
    """Each hooked op's rounding error: its sigma worked out in a clean pass (first order: from the exact values),
    then a seeded draw of it added, in the same order, to every row of a batch of draws."""

    def __init__(self, seed: int) -> None:
        self.sigmas: list[torch.Tensor] = []
        self.replay: int | None = None  # None: the clean pass, recording
        self.gen = torch.Generator().manual_seed(seed)

    def add(self, x: torch.Tensor, sigma) -> torch.Tensor:
        """x plus a draw of its error; sigma() gives the error's standard deviation from x's exact values."""
        if self.replay is None:
            self.sigmas.append(sigma())
            return x
        self.replay += 1
        return x + torch.randn(x.shape, generator=self.gen).to(x.dtype) * self.sigmas[self.replay - 1]

    def relative(self, x: torch.Tensor, ulps: float = 1.0) -> torch.Tensor:
        return self.add(x, lambda: ulps * U * x.abs())


def _attention(noise: _Noise):
    """Eager attention (a transformers attention function) with each sum's rounding error added."""

    def attend(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        def rotated(x):  # each rotary output is a two-product sum of a pair (x_i, x_i+d/2), of norm |pair|
            half = x.shape[-1] // 2
            return noise.add(x, lambda: math.sqrt(2) * U * torch.sqrt(x[..., :half] ** 2 + x[..., half:] ** 2).repeat(1, 1, 1, 2))

        query, key = rotated(query), rotated(key)
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        dim, length = query.shape[-1], key.shape[-2]
        raw = query @ key.transpose(-1, -2)
        raw = noise.add(raw, lambda: _sum_sigma(raw, query**2 @ (key**2).transpose(-1, -2), dim))
        scores = noise.relative(raw * scaling)
        if attention_mask is not None:
            scores = scores + attention_mask
        elif query.shape[-2] > 1:  # transformers makes no mask for an attention it does not know: causal, no cache
            assert query.shape[-2] == length
            scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
        weights = noise.relative(torch.exp(scores - scores.amax(-1, keepdim=True)), 2.0)
        total = weights.sum(-1, keepdim=True)
        total = noise.add(total, lambda: _sum_sigma(total, (weights**2).sum(-1, keepdim=True), length))
        probs = noise.relative(weights / total)
        out = probs @ value
        out = noise.add(out, lambda: _sum_sigma(out, probs**2 @ value**2, length))
        return out.transpose(1, 2).contiguous(), None

    return attend


def _hook(model: nn.Module, noise: _Noise) -> None:
    """Every nn.Linear, RMSNorm, activation and decoder layer of `model` adds its rounding error while noise is on."""

    def linear(module, args, out):
        def sigma():
            squares = args[0] ** 2 @ (module.weight**2).T + (0 if module.bias is None else module.bias**2)
            return _sum_sigma(out, squares, module.in_features)

        return noise.add(out, sigma)

    def norm(module, args, out):
        # The mean of squares is a sum of H terms: its error, and rsqrt's rounding, scale the row by 1 + e;
        # then x * rsqrt * weight, two roundings of each element.
        x = args[0]
        squares = (x**2).sum(-1, keepdim=True)

        def row():
            return torch.sqrt((_sum_sigma(squares, (x**4).sum(-1, keepdim=True), x.shape[-1]) / (2 * squares)) ** 2 + U**2)

        return noise.relative(out * (1 + noise.add(torch.zeros_like(squares), row)), math.sqrt(2))

    def layer(module, args, out):  # its two residual adds
        if isinstance(out, tuple):
            return (noise.relative(out[0], math.sqrt(2)), *out[1:])
        return noise.relative(out, math.sqrt(2))

    for name, module in model.named_modules():
        kind = type(module).__name__
        if isinstance(module, nn.Linear):
            module.register_forward_hook(linear)
            if name.endswith("down_proj"):  # its input, act(gate) * up, rounded once more
                module.register_forward_pre_hook(lambda module, args: (noise.relative(args[0]),))
        elif kind.endswith("RMSNorm"):
            module.register_forward_hook(norm)
        elif name.endswith("act_fn"):  # silu: an exp, a division
            module.register_forward_hook(lambda module, args, out: noise.relative(out, 2.0))
        elif kind.endswith("DecoderLayer"):
            module.register_forward_hook(layer)


def _key(reference: nn.Module, tokens, draws: int, seed: int) -> str:
    digest = hashlib.sha256(repr((type(reference).__name__, reference.config.to_dict(), list(tokens), draws, seed)).encode())
    for tensor in reference.state_dict().values():
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


@torch.inference_mode()
def logit_sigma(reference: nn.Module, tokens, draws: int = DRAWS, seed: int = 0) -> np.ndarray:
    """Each last-position logit's float32 rounding error, as a standard deviation, for the reference's forward over
    `tokens` in any summation order: [vocab]. Deterministic (seeded), and kept per weights and tokens."""
    from transformers import AttentionInterface

    key = _key(reference, tokens, draws, seed)
    if key not in _CACHE:
        noise = _Noise(seed)
        AttentionInterface.register(_ATTENTION, _attention(noise))
        model = copy.deepcopy(reference).to(device="cpu", dtype=torch.float64)
        model.config._attn_implementation = _ATTENTION
        _hook(model, noise)
        ids = torch.tensor([list(tokens)])
        exact = model(input_ids=ids, logits_to_keep=1).logits[0, -1]
        noise.replay = 0
        moved = model(input_ids=ids.repeat(draws, 1), logits_to_keep=1).logits[:, -1] - exact
        _CACHE[key] = moved.pow(2).mean(0).sqrt().numpy()
    return _CACHE[key]


def logit_tolerance(reference: nn.Module, tokens) -> np.ndarray:
    """How far two float32 evaluations of the last position's logits for `tokens` may differ, logit by logit."""
    return LAMBDA * math.sqrt(2) * logit_sigma(reference, tokens)


def assert_logits_match(got, expected, reference: nn.Module, tokens) -> float:
    """`got` and `expected`, two float32 evaluations of the last position's logits for `tokens` (`reference`'s
    weights), differ by no more than rounding can move them. Returns the largest difference over its tolerance."""
    got, expected = (np.asarray(torch.as_tensor(a).detach().float().cpu()) for a in (got, expected))
    assert got.shape == expected.shape, (got.shape, expected.shape)
    tolerance = logit_tolerance(reference, tokens)
    diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    ratio = diff / tolerance
    worst = int(ratio.argmax())
    assert ratio[worst] <= 1.0, (
        f"logit {worst} differs by {diff[worst]:.3g} ({got[worst]:.6g} vs {expected[worst]:.6g}), past its rounding "
        f"tolerance {tolerance[worst]:.3g} ({LAMBDA:g} sigma of two float32 evaluations; largest difference "
        f"{diff.max():.3g}, {int((ratio > 1).sum())} of {len(ratio)} logits past)")
    return float(ratio[worst])

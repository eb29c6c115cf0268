"""Speculative decoding's settings: which drafter, how many draft tokens a step (K), and how often they are accepted.

A decode with K draft tokens feeds its newest token and the K drafts in one pass (K+1 query positions, a logit at
each); the engine accepts the longest prefix of the drafts the target agrees with, plus the target's own next token,
so a sequence advances 1..K+1 tokens a step. `ngram` drafts for real (vLLM's prompt lookup,
vllm/v1/spec_decode/ngram_proposer.py); the others (EAGLE heads, MTP layers, a draft model) only the sim prices, with
a fixed per-token acceptance rate.

Text form (`--spec`): `off` | `METHOD:K[:key=value]...`, keys `accept` (a rate in [0, 1]; required for every method
but ngram, which takes none), `min`/`max` (ngram's prompt_lookup_min/max, default 2 and 4), `batch` (K by batch size,
vLLM's num_speculative_tokens_per_batch_size: `lo-hi/k` ranges joined by `+`, e.g. `batch=1-8/3+9-64/1`).
"""
from __future__ import annotations

from dataclasses import dataclass

METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft")
#: The methods that draft real tokens on a backend that runs a model (torch, gguf); the rest only the sim prices.
REAL_METHODS = ("ngram",)


@dataclass(frozen=True)
class SpecConfig:
    method: str
    k: int  # draft tokens a step (vLLM's num_speculative_tokens)
    accept: float | None = None  # fixed per-token acceptance rate (sim-priced methods); None for ngram
    lookup_min: int = 2  # ngram: prompt_lookup_min
    lookup_max: int = 4  # ngram: prompt_lookup_max
    #: K by batch size: (lo, hi, k) rows, a batch of lo..hi running requests drafts k tokens each.
    k_by_batch: tuple[tuple[int, int, int], ...] = ()

    def k_for_batch(self, n_running: int) -> int:
        """Draft tokens a request gets when `n_running` requests decode together."""
        for lo, hi, k in self.k_by_batch:
            if lo <= n_running <= hi:
                return k
        return self.k

    @property
    def label(self) -> str:
        parts = [self.method, str(self.k)]
        if self.accept is not None:
            parts.append(f"accept={self.accept:g}")
        if self.method == "ngram" and (self.lookup_min, self.lookup_max) != (2, 4):
            parts += [f"min={self.lookup_min}", f"max={self.lookup_max}"]
        if self.k_by_batch:
            parts.append("batch=" + "+".join(f"{lo}-{hi}/{k}" for lo, hi, k in self.k_by_batch))
        return ":".join(parts)

    def __str__(self) -> str:
        return self.label


def spec_label(spec: SpecConfig | None) -> str:
    return "off" if spec is None else spec.label


def _int(text: str, what: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} must be an integer, not {text!r}") from None
    if value < low:
        raise ValueError(f"{what} must be at least {low}, not {value}")
    return value


def _batch_rows(text: str) -> tuple[tuple[int, int, int], ...]:
    rows = []
    for part in text.split("+"):
        span, _, k = part.partition("/")
        lo, _, hi = span.partition("-")
        if not (k and lo and hi):
            raise ValueError(f"batch= takes lo-hi/k ranges joined by '+', e.g. 1-8/3+9-64/1, not {text!r}")
        row = (_int(lo, "batch lo", 1), _int(hi, "batch hi", 1), _int(k, "batch k", 0))
        if row[1] < row[0]:
            raise ValueError(f"batch range {lo}-{hi} is empty")
        rows.append(row)
    return tuple(rows)


def parse_spec(text: str) -> SpecConfig | None:
    """`off`/`none` -> None; `ngram:3`, `ngram:3:min=1:max=5`, `eagle:3:accept=0.7` -> a SpecConfig.
    Bad text: ValueError with a one-line message."""
    text = text.strip()
    if text.lower() in ("off", "none", ""):
        return None
    method, *rest = text.split(":")
    method = method.lower()
    if method not in METHODS:
        raise ValueError(f"--spec {text!r}: unknown method {method!r} (known: off, {', '.join(METHODS)})")
    if not rest:
        raise ValueError(f"--spec {text!r}: give the draft length, e.g. {method}:3")
    try:
        k = _int(rest[0], "the draft length K", 1)
        values: dict[str, str] = {}
        for item in rest[1:]:
            key, eq, value = item.partition("=")
            if not eq or key not in ("accept", "min", "max", "batch"):
                raise ValueError(f"unknown setting {item!r} (known: accept=, min=, max=, batch=)")
            values[key] = value
        accept = None
        if "accept" in values:
            try:
                accept = float(values["accept"])
            except ValueError:
                raise ValueError(f"accept= must be a number, not {values['accept']!r}") from None
            if not 0.0 <= accept <= 1.0:
                raise ValueError(f"accept= must be in [0, 1], not {accept:g}")
        if method == "ngram" and accept is not None:
            raise ValueError("ngram drafts real tokens: its acceptance is measured, not given (drop accept=)")
        if method != "ngram" and accept is None:
            raise ValueError(f"{method} is priced, not run: give its acceptance rate, e.g. {method}:{k}:accept=0.7")
        if method != "ngram" and ("min" in values or "max" in values):
            raise ValueError("min=/max= (prompt lookup lengths) apply to ngram only")
        lookup_min = _int(values.get("min", "2"), "min=", 1)
        lookup_max = _int(values.get("max", "4"), "max=", 1)
        if lookup_max < lookup_min:
            raise ValueError(f"max= ({lookup_max}) is below min= ({lookup_min})")
        k_by_batch = _batch_rows(values["batch"]) if "batch" in values else ()
    except ValueError as e:
        raise ValueError(f"--spec {text!r}: {e}") from None
    return SpecConfig(method, k, accept, lookup_min, lookup_max, k_by_batch)

"""A row's speculative-decoding columns, from what the engine counted per request (engine/loop.py take_verified).

- `spec`: the setting's label ("ngram:3"; "off");
- `spec_k`: the draft length K asked for;
- `spec_acceptance`: draft tokens accepted / draft tokens fed (vLLM's num_accepted_tokens / num_draft_tokens);
- `spec_accepted_len`: the mean tokens a verify step gave a request, its bonus or correction included
  (1 + accepted / verify steps: vLLM's mean acceptance length);
- `spec_tokens_per_step`: output tokens per decode step per request, steps without drafts included.
NaN where nothing was drafted (speculation off, or a served run: its engine counts them, not the engine here).
"""
from __future__ import annotations

import math

from prefillbench.engine import RequestRecord
from prefillbench.speculation import parse_spec


def spec_of(strategy: str) -> str:
    """The speculation part of a scheduler's spec ('vllm-v1 · spec ngram:3' -> 'ngram:3'); 'off' without one."""
    for part in strategy.split("·")[1:]:
        kind, _, value = part.strip().partition(" ")
        if kind == "spec":
            return value.strip()
    return "off"


def spec_columns(strategy: str, reqs: list[RequestRecord]) -> dict:
    label = spec_of(strategy)
    spec = parse_spec(label)
    if spec is None:
        return {}
    drafted = sum(r.drafted for r in reqs)
    accepted = sum(r.accepted for r in reqs)
    verify_steps = sum(r.verify_steps for r in reqs)
    decode_steps = sum(r.decode_steps for r in reqs)
    decoded = sum(max(len(r.tokens) - 1, 0) for r in reqs)
    return {"spec": label, "spec_k": spec.k,
            "spec_acceptance": accepted / drafted if drafted else math.nan,
            "spec_accepted_len": 1 + accepted / verify_steps if verify_steps else math.nan,
            "spec_tokens_per_step": decoded / decode_steps if decode_steps else math.nan}

"""A row's TTFT per request class: the head-of-line question, whether short requests wait behind long prompts.

Requests carry a class where the workload names one (a trace's `class` column, a `mix:` workload's classes).
`ttft_by_class` is JSON text, one column a CSV reader can parse:
`{"short": {"n": 180, "ttft_p50_ms": 95.3, "ttft_p99_ms": 640.2}, "long": {...}}`, the classes in order of their
mean prompt length (shortest first), `n` the finished requests of the class over every repetition (the
percentiles' samples, as the row's own TTFT percentiles pool the repetitions). Empty where no request has a class.
"""
from __future__ import annotations

import json

import numpy as np

from prefillbench.bench.stats import percentile
from prefillbench.engine import RequestRecord


def _ttft_ms(req: RequestRecord) -> float:
    # metrics.ttft_ms's definition (metrics imports this module, so it is not imported from there)
    return 1000 * (req.token_times[0] - req.arrival)


def ttft_by_class(reqs: list[RequestRecord]) -> dict[str, dict[str, float]]:
    """Each class's request count and TTFT p50 and p99 (ms), shortest prompts first; {} where none has a class."""
    by_class: dict[str, list[RequestRecord]] = {}
    for r in reqs:
        if r.length_class is not None and r.token_times:
            by_class.setdefault(r.length_class, []).append(r)
    order = sorted(by_class, key=lambda c: (float(np.mean([r.prompt_len for r in by_class[c]])), c))
    out = {}
    for name in order:
        ttft = [_ttft_ms(r) for r in by_class[name]]
        out[name] = {"n": len(ttft), "ttft_p50_ms": round(percentile(ttft, 50), 3),
                     "ttft_p99_ms": round(percentile(ttft, 99), 3)}
    return out


def class_columns(reqs: list[RequestRecord]) -> dict:
    """The row's `ttft_by_class` (JSON text); nothing where no request has a class (the field stays "")."""
    figures = ttft_by_class(reqs)
    return {"ttft_by_class": json.dumps(figures)} if figures else {}


def parse_ttft_by_class(text: str) -> dict[str, dict[str, float]]:
    """A row's `ttft_by_class` read back ({} where empty or not JSON of classes)."""
    if not isinstance(text, str) or not text.strip():
        return {}
    try:
        figures = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return figures if isinstance(figures, dict) else {}

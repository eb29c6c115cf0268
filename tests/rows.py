"""One builder for the report rows the tests feed to tables, plots, verdicts and gates."""
from __future__ import annotations

import math

from prefillbench.bench.metrics import ResultRow

#: A closed-loop pp64 row of three repetitions at concurrency 4: 50 t/s (20 ms a token), 100 tokens/s, no time
#: between tokens (a prompt-only test has one token a request). Spread and serving figures keep ResultRow's defaults
#: (NaN: not measured).
ROW_DEFAULTS = dict(model="m", backend="sim", strategy="sequential", test="pp64", n_prompt=64, n_gen=0, concurrency=4,
                    chunk_size=None, requests=4, repetitions=3, ts_mean=50.0, ts_std=1.0, ms_per_token=20.0,
                    throughput=100.0, ttft_p50_ms=100.0, ttft_p99_ms=200.0, tbt_p50_ms=math.nan, tbt_p99_ms=math.nan)


def make_row(**overrides) -> ResultRow:
    """A ResultRow of ROW_DEFAULTS with `overrides` (any ResultRow field) on top."""
    return ResultRow(**{**ROW_DEFAULTS, **overrides})

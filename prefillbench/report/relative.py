"""Each row against its reference strategy's row: the matching and the ratios (`run --relative-to`'s table is in compare_tables).

A row's reference is the row of the reference strategy under the same model,
backend, test, concurrency and load (arrival and rate). Where the reference
strategy ran at several chunk sizes, a row is matched to the one with its own
chunk size, and has none if it has no chunk size.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from prefillbench.bench.metrics import noisy_rows
from prefillbench.bench.stats import DEFAULT_NOISY_CV

LOAD_KEY = ["model", "backend", "test", "concurrency", "arrival", "rate"]


def ratio(value: Any, ref: Any) -> Any:
    """value/ref, NaN where ref is 0 or unknown; on numbers or on columns."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return value / np.where(ref == 0, np.nan, ref)


def reference_values(frame: pd.DataFrame, strategy: str, columns: list[str], noisy_cv: float = DEFAULT_NOISY_CV) -> pd.DataFrame:
    """For every row of the frame, its reference row's `columns` (NaN where it has none), whether it has
    one (has_ref) and whether that one is noisy (ref_noisy), on the frame's index."""
    refs = frame[frame["strategy"] == strategy]
    refs = refs[[*LOAD_KEY, "chunk_size", *columns]].assign(has_ref=1.0, ref_noisy=noisy_rows(refs, noisy_cv).astype(float))
    swept = refs.groupby(LOAD_KEY, dropna=False)["has_ref"].transform("size") > 1
    by_chunk = LOAD_KEY + ["chunk_size"]
    one = frame[LOAD_KEY].merge(refs[~swept].drop(columns="chunk_size"), on=LOAD_KEY, how="left")
    per_size = frame[by_chunk].merge(refs[swept].drop_duplicates(by_chunk, keep=False), on=by_chunk, how="left")
    ref = one.combine_first(per_size).set_index(frame.index)
    return ref[columns].assign(has_ref=ref["has_ref"].notna(), ref_noisy=ref["ref_noisy"] == 1.0)


def relative_frame(frame: pd.DataFrame, strategy: str, metrics: list[str], noisy_cv: float = DEFAULT_NOISY_CV) -> pd.DataFrame:
    """Every row's metrics divided by its reference row's (NaN where it has none), with has_ref and ref_noisy."""
    ref = reference_values(frame, strategy, metrics, noisy_cv)
    out = pd.DataFrame({m: ratio(frame[m], ref[m]) for m in metrics}, index=frame.index)
    return out.assign(has_ref=ref["has_ref"], ref_noisy=ref["ref_noisy"])

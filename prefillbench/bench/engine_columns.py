"""A row's columns from what the engine itself kept: the server's own clock (its /metrics, llama-server's per-token
timings) and the KV memory (preemptions, recomputed tokens, peak use)."""
from __future__ import annotations

import math

import numpy as np

from prefillbench.bench.stats import percentile
from prefillbench.engine import RequestRecord, RunRecord


def memory_columns(runs: list[RunRecord]) -> dict:
    """Preemptions and recomputed tokens per repetition (their means; finished requests', and with a stop only
    those), the KV memory's peak use in %, and how it was held; for a served run, what the engine itself said of
    its memory (server_memory_columns)."""
    kept = [run for run in runs if run.kv_policy]
    if not kept:
        return server_memory_columns(runs)
    peaks = [run.kv_peak_fraction for run in kept if not math.isnan(run.kv_peak_fraction)]
    return {"kv_policy": kept[0].kv_policy,
            "preemptions": float(np.mean([sum(r.preemptions for r in run.requests) for run in kept])),
            "retractions": float(np.mean([sum(r.retractions for r in run.requests) for run in kept])),
            "recomputed_tokens": float(np.mean([sum(r.recomputed for r in run.requests) for run in kept])),
            "kv_peak_pct": 100 * max(peaks) if peaks else math.nan, **block_cache_columns(kept)}


def block_cache_columns(runs: list[RunRecord]) -> dict:
    """With the engine's block cache (engine/block_cache.py): per repetition, the tokens preempted requests found
    again on resuming (so not recomputed) and the cached blocks evicted."""
    kept = [run for run in runs if getattr(run, "kv_cache", None) is not None]
    if not kept:
        return {}
    columns = {"found_again_tokens": float(np.mean([sum(r.found_again for r in run.requests) for run in kept])),
               "kv_evicted_blocks": float(np.mean([run.kv_cache.evicted_blocks for run in kept]))}
    hosted = [run.kv_cache.host for run in kept if run.kv_cache.host is not None]
    if hosted:  # a host tier (engine/host_tier.py): tokens loaded from it, their load time, per repetition
        columns["host_hit_tokens"] = float(np.mean([h.loaded_tokens for h in hosted]))
        columns["host_load_s"] = float(np.mean([h.load_seconds for h in hosted]))
    return columns


def server_memory_columns(runs: list[RunRecord]) -> dict:
    """A served row's KV memory as the engine reported it (backends/server/engine_metrics.py): where it was read
    (and what it did not export), how it holds it, its capacity in tokens, the largest sampled use in % and the
    requests it preempted (or retracted) per repetition; the tokens it computed again are not exported (NaN)."""
    told = [run.engine_kv for run in runs if getattr(run, "engine_kv", None) is not None]
    if not told:
        return {}

    def mean(values: list[float]) -> float:
        kept = [v for v in values if not math.isnan(v)]
        return float(np.mean(kept)) if kept else math.nan

    peaks = [m.peak_fraction for m in told if not math.isnan(m.peak_fraction)]
    capacities = [m.capacity_tokens for m in told if not math.isnan(m.capacity_tokens)]
    return {"kv_policy": told[0].policy, "kv_source": told[-1].note(),
            "kv_capacity_tokens": max(capacities) if capacities else math.nan,
            "preemptions": mean([m.preemptions for m in told]), "retractions": mean([m.retractions for m in told]),
            "kv_peak_pct": 100 * max(peaks) if peaks else math.nan}


#: KV memory at least this full at its peak (in %): memory may have decided what ran (the table's column, the
#: verdict's line and capacity's "limited by" say so).
MEMORY_BINDS_PCT = 90.0


def memory_note(row) -> str:
    """Where a row's KV memory bound, in words ('KV memory: peak 98%, 12 preempted'); '' where it did not."""
    if row is None:  # a probe kept without its row
        return ""
    preempted = row.preemptions if row.preemptions == row.preemptions else 0.0  # NaN: a served row
    if not (preempted > 0 or row.kv_peak_pct >= MEMORY_BINDS_PCT):
        return ""
    parts = [] if math.isnan(row.kv_peak_pct) else [f"peak {row.kv_peak_pct:.0f}%"]
    if preempted > 0:  # a server's count from its /metrics comes without the tokens it recomputed
        recomputed = "" if math.isnan(row.recomputed_tokens) else f" ({row.recomputed_tokens:,.0f} tokens recomputed)"
        found = getattr(row, "found_again_tokens", math.nan)
        if not math.isnan(found) and recomputed:  # the block cache's: what a resumed request did not compute again
            recomputed = recomputed[:-1] + f", {found:,.0f} found again)"
        retracted = row.retractions if row.retractions == row.retractions else 0.0
        word = "retracted" if retracted == preempted else "preempted" if not retracted else (
            f"preempted ({retracted:.0f} retracted)")
        parts.append(f"{preempted:.0f} {word}{recomputed}")
    if not preempted and row.kv_policy == "reserve":
        parts[-1] += " reserved at whole lengths"
    return "KV memory: " + ", ".join(parts)


def engine_columns(runs: list[RunRecord], reqs: list[RequestRecord]) -> dict:
    """The row's engine-clock columns: what the server's /metrics counted over the runs (their deltas summed), and
    where the engine sent its clock with every token (llama-server's timings), per request and per token, exact:
    its prefill (the prompt's start to its first token), its queue (arrival to the prompt's start, which its
    progress events date), their sum its TTFT, and the gaps between its times of the tokens."""
    from prefillbench.backends.server.engine_clock import figures

    readings = [run.engine_clock for run in runs if run.engine_clock is not None]
    per_token = [r.server_token_times for r in reqs if r.server_token_times]
    if not readings and not per_token:
        return {}
    total = None
    for reading in readings:
        total = reading if total is None else total.plus(reading)
    f = figures(total) if total is not None else None
    out = {}
    if f is not None and f.source:
        out = {"engine_clock": f.source, "engine_requests": f.requests, "engine_ttft_mean_ms": f.ttft_mean,
               "engine_itl_mean_ms": f.itl_mean, "engine_queue_mean_ms": f.queue_mean,
               "engine_prefill_mean_ms": f.prefill_mean, "engine_decode_mean_ms": f.decode_mean,
               "engine_e2e_mean_ms": f.e2e_mean}
        for name, (p50, low, high) in (("ttft", f.ttft_p50), ("itl", f.itl_p50)):
            out.update({f"engine_{name}_p50_ms": p50, f"engine_{name}_p50_low_ms": low,
                        f"engine_{name}_p50_high_ms": high})
        if not math.isnan(f.queue_mean) and not math.isnan(f.prefill_mean):
            out["engine_ttft_other_mean_ms"] = f.ttft_mean - f.queue_mean - f.prefill_mean
    if total is not None:  # what the engine preempted: its KV memory's columns (server_memory_columns)
        out["engine_net_ms"] = total.net_ms
    if per_token:
        # llama-server's clock starts when a prompt's first tokens enter a batch (update_slots); the wait before it
        # is dated only by its progress events, on the client's clock (the least delayed of them): its queue; its
        # prefill is its own.
        served = [r for r in reqs if r.server_token_times]
        prefill = [r.server_token_times[0] for r in served]
        queue = [1e3 * (r.first_scheduled - r.arrival) if r.first_scheduled is not None else 0.0 for r in served]
        ttfts = [q + p for q, p in zip(queue, prefill)]
        gaps = np.concatenate([np.diff(r.server_token_times) for r in served])
        out["engine_clock"] = " and ".join(filter(None, [out.get("engine_clock"), "per-token timings"]))
        if math.isnan(out.get("engine_requests", math.nan)):
            out["engine_requests"] = len(served)
        out["engine_ttft_mean_ms"] = float(np.mean(ttfts))
        out["engine_prefill_mean_ms"] = float(np.mean(prefill))
        if any(r.first_scheduled is not None for r in served):
            out["engine_queue_mean_ms"] = float(np.mean(queue))
        # by a histogram's rank rule, as vLLM's p50s are: one definition for every engine's p50 (ResultRow)
        for name, p50 in (("ttft", percentile(ttfts, 50, "inverted_cdf")), ("itl", percentile(gaps, 50, "inverted_cdf"))):
            out.update({f"engine_{name}_p50_ms": p50, f"engine_{name}_p50_low_ms": p50,
                        f"engine_{name}_p50_high_ms": p50})
        if math.isnan(out.get("engine_itl_mean_ms", math.nan)) and gaps.size:
            out["engine_itl_mean_ms"] = float(gaps.mean())
    return out

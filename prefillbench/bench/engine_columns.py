"""A row's columns from what the engine itself kept: the server's own clock (its /metrics, llama-server's per-token
timings) and the KV memory (preemptions, recomputed tokens, peak use)."""
from __future__ import annotations

import math

import numpy as np

from prefillbench.bench.stats import percentile
from prefillbench.engine import RequestRecord, RunRecord


def memory_columns(runs: list[RunRecord]) -> dict:
    """Preemptions and recomputed tokens per repetition (their means; finished requests', and with a stop only
    those), the KV memory's peak use in %, and how it was held; nothing for a served run (the engine keeps its own
    memory: its /metrics say what it did)."""
    kept = [run for run in runs if run.kv_policy]
    if not kept:
        return {}
    peaks = [run.kv_peak_fraction for run in kept if not math.isnan(run.kv_peak_fraction)]
    return {"kv_policy": kept[0].kv_policy,
            "preemptions": float(np.mean([sum(r.preemptions for r in run.requests) for run in kept])),
            "retractions": float(np.mean([sum(r.retractions for r in run.requests) for run in kept])),
            "recomputed_tokens": float(np.mean([sum(r.recomputed for r in run.requests) for run in kept])),
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
    if total is not None:
        out["engine_net_ms"] = total.net_ms
        preempted = total.delta.counters.get("vllm:num_preemptions_total")
        if preempted is not None:  # the engine keeps its own memory: what it preempted, per repetition
            out["preemptions"] = preempted / len(readings)
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

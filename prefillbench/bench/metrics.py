"""From timestamps to the figures in a row: t/s, throughput, TTFT, TBT, TPOT, end-to-end latency,
scheduling delay, request rates and goodput under SLOs.

Per request: TTFT = first token - arrival; TPOT = (last token - first token) /
(tokens - 1), the mean time per output token after the first; TBT = every gap
between two tokens; end-to-end = last token - arrival; scheduling delay =
start of the first step that carried the request - arrival (Sarathi-Serve's
second capacity criterion).

Goodput (DistServe's definition, as `vllm bench serve --goodput` has it): the
requests that met every given SLO, per second of the run. A request meets
`ttft`, `tpot` and `e2e` by its own value, and `tbt` when none of its gaps
between tokens exceeds it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, fields
from typing import ClassVar

import numpy as np
import pandas as pd

from strategies import strategy_label

from prefillbench.bench import stats
from prefillbench.errors import BackendError
from prefillbench.engine import RequestRecord, RunRecord
from prefillbench.bench.stats import mean_std, percentile
from prefillbench.bench.spec_columns import spec_columns
from prefillbench.bench.stalls import stall_columns
from prefillbench.bench.engine_columns import engine_columns, memory_columns
from prefillbench.bench.class_columns import class_columns
from prefillbench.bench.client_columns import client_columns
from prefillbench.bench.deployment_figures import deployment_columns
from prefillbench.bench.workloads import TestSpec
from prefillbench.backends.base import Backend
from prefillbench.backends.prefix_cache import implied_hits



HIGHER, LOWER = "higher", "lower"
# metric -> which way is better: the one record of it (compare, ab and the verdict read it)
METRICS: dict[str, str] = {
    "throughput": HIGHER,
    "ts_mean": HIGHER,
    "ms_per_token": LOWER,
    "ttft_p50_ms": LOWER,
    "ttft_p99_ms": LOWER,
    "tbt_p50_ms": LOWER,
    "tbt_p99_ms": LOWER,
    "tpot_p50_ms": LOWER,
    "tpot_p99_ms": LOWER,
    "e2e_p50_ms": LOWER,
    "e2e_p99_ms": LOWER,
    "sched_delay_p50_ms": LOWER,
    "sched_delay_p99_ms": LOWER,
    "request_throughput": HIGHER,
    "goodput_rps": HIGHER,
    "slo_met": HIGHER,
    "capacity_rps": HIGHER,
}


#: The strategy column of a row measured on a server prefillbench did not launch (--url): its own configuration,
#: whatever it is; no strategy of STRATEGIES, and never compared with another row of the same server.
AS_SERVED = "as served"


def row_strategy(backend, strategy: str) -> str:
    """The strategy a row names: the case's, or AS_SERVED on a server running as it was started (--url)."""
    return AS_SERVED if getattr(backend, "as_served", False) else strategy


def higher_is_better(metric: str) -> bool:
    return METRICS[metric] == HIGHER

@dataclass
class ResultRow:
    """One line of a report; field names are the export's column names."""

    model: str
    backend: str
    strategy: str
    test: str
    n_prompt: int
    n_gen: int
    concurrency: int
    chunk_size: int | None
    requests: int
    repetitions: int
    ts_mean: float
    ts_std: float
    ms_per_token: float
    throughput: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tbt_p50_ms: float
    tbt_p99_ms: float
    # Spread across repetitions (one value per timed run); NaN with one repetition.
    ts_cv: float = math.nan  # CV of the runs' mean t/s
    ts_ci95: float = math.nan  # 95% CI half-width of ts_mean: ts_mean ± ts_ci95
    throughput_cv: float = math.nan
    throughput_ci95: float = math.nan
    # Serving figures: latencies at p50/p90/p99, how requests arrived, and goodput under the SLOs.
    ttft_p90_ms: float = math.nan
    tbt_p90_ms: float = math.nan
    tpot_p50_ms: float = math.nan
    tpot_p90_ms: float = math.nan
    tpot_p99_ms: float = math.nan
    e2e_p50_ms: float = math.nan
    e2e_p90_ms: float = math.nan
    e2e_p99_ms: float = math.nan
    sched_delay_p50_ms: float = math.nan
    sched_delay_p90_ms: float = math.nan
    sched_delay_p99_ms: float = math.nan
    arrival_lag_p50_ms: float = math.nan  # how late requests were taken (RunRecord.arrival_lags): a server's send lag
    arrival_lag_p99_ms: float = math.nan  # open loop: how late requests were taken (RunRecord.arrival_lags)
    # A served row's client (bench/client_columns.py): its CPU in % of one core over the run (every worker's), its
    # worker processes, and why the row measured the client, not the engine ("" where it kept up)
    client_cpu_pct: float = math.nan
    client_workers: int = 0
    client_late: str = ""
    queue_growth: float = math.nan  # open loop: the wait's growth per second of arrivals, at least (queue_growth)
    request_throughput: float = math.nan  # completed requests per second of the run
    arrival: str = "closed"  # closed, poisson, gamma or trace
    rate: float | None = None  # the requested arrival rate, requests/s (None: closed loop or trace)
    burstiness: float | None = None  # gamma shape (gamma arrivals only)
    offered_rps: float = math.nan  # the arrival rate the requests really had
    achieved_rps: float = math.nan  # the rate they completed at, first to last completion
    slo: str = ""  # e.g. "tbt=200,ttft=1000"; empty: none given
    goodput_rps: float = math.nan  # requests per second that met every SLO
    slo_met: float = math.nan  # their share of the requests
    capacity_rps: float = math.nan  # `capacity`: the highest rate that met the capacity criteria
    capacity_sessions_per_s: float = math.nan  # multi-turn sessions: the capacity as sessions started a second
    capacity_probes: int = 0  # `capacity`: the runs its search took
    failed_requests: int = 0  # a server's requests that failed (HTTP error, dropped stream, short): in no figure
    # The client's means, beside the engine's (below): a histogram's mean is exact where its p50 is a bucket's.
    ttft_mean_ms: float = math.nan
    tbt_mean_ms: float = math.nan
    e2e_mean_ms: float = math.nan
    # The client's p50s by a histogram's rank rule (percentile's inverted_cdf), compared with an engine's histogram
    # p50 (which estimates that sample) rather than the interpolated p50 above: like with like.
    ttft_p50_rank_ms: float = math.nan
    tbt_p50_rank_ms: float = math.nan
    # A server's own clock over the row's runs (backends/server/engine_clock.py): where it comes from ("" none),
    # its TTFT and inter-token latency (mean; p50 with the bounds of the bucket it lies in, equal where exact), TTFT
    # split into queue, prefill and the rest (vLLM's API server: tokenizing, IPC), the decode time per request, the
    # requests it counted, and the network round trip measured beside it (what it can add to a client figure).
    engine_clock: str = ""
    engine_ttft_mean_ms: float = math.nan
    engine_ttft_p50_ms: float = math.nan
    engine_ttft_p50_low_ms: float = math.nan
    engine_ttft_p50_high_ms: float = math.nan
    engine_itl_mean_ms: float = math.nan
    engine_itl_p50_ms: float = math.nan
    engine_itl_p50_low_ms: float = math.nan
    engine_itl_p50_high_ms: float = math.nan
    engine_queue_mean_ms: float = math.nan
    engine_prefill_mean_ms: float = math.nan
    engine_ttft_other_mean_ms: float = math.nan
    engine_decode_mean_ms: float = math.nan
    engine_e2e_mean_ms: float = math.nan
    engine_requests: float = math.nan
    engine_net_ms: float = math.nan
    # Prefix caching: the share of prompt tokens the backend found cached (measured: the backend's own count, a
    # server's as it reported it), and the share the requests' own structure implies (every block an earlier
    # prompt had, never evicted, at the cache's block size). NaN: no cache, or none reported.
    prefix_hit_rate: float = math.nan
    prefix_hit_implied: float = math.nan
    # KV memory (engine/memory.py): how the engine held it ("reserve", "paged"; "" served), requests preempted or
    # retracted and tokens computed again for them (means per repetition), the most of it held at once in %.
    kv_policy: str = ""
    preemptions: float = math.nan
    retractions: float = math.nan  # of the preemptions, SGLang's retractions (to the waiting queue's tail)
    recomputed_tokens: float = math.nan
    kv_peak_pct: float = math.nan
    # The engine's block cache (engine/block_cache.py, vllm-v1 with a prefix cache): tokens preempted requests found
    # cached again on resuming (not recomputed), and cached blocks evicted, per repetition; NaN: no block cache.
    found_again_tokens: float = math.nan
    kv_evicted_blocks: float = math.nan
    # Its host tier (--kv-host-cache, engine/host_tier.py): tokens loaded from host memory at admission and the
    # loads' priced time, per repetition; NaN: no host tier.
    host_hit_tokens: float = math.nan
    host_load_s: float = math.nan
    kv_host_gib: float = math.nan  # the host tier's size in GiB (0: none, in a grid of sizes); NaN: no host tier asked
    # A server's KV memory as the engine reported it (backends/server/engine_metrics.py): where it was read ("vllm
    # /metrics", "sglang /metrics", "llama-server /slots", with what it did not export), its capacity in tokens.
    kv_source: str = ""
    kv_capacity_tokens: float = math.nan
    # Multi-turn sessions: the TTFT p50 of turns after the first (their prompts resend the history); NaN without.
    ttft_later_turns_p50_ms: float = math.nan
    # Request classes (bench/class_columns.py): JSON text, each class's n and TTFT p50/p99 ms; "" where none has one.
    ttft_by_class: str = ""
    # Decode stalls (bench/stalls.py): TBT p99 split into its time in steps that computed prompt tokens, in
    # decode-only steps and in no step (the three add up to it), the prompt tokens computed during it, the share of
    # the gaps at or above it that waited behind a prefill, and the p99s of the gaps without and with prompt tokens
    # in them. NaN where the steps are not known (a served run).
    tbt_p99_behind_prefill_ms: float = math.nan
    tbt_p99_decode_ms: float = math.nan
    tbt_p99_between_steps_ms: float = math.nan
    tbt_p99_prefill_tokens: float = math.nan
    tbt_tail_behind_prefill: float = math.nan
    tbt_p99_decode_only_ms: float = math.nan
    tbt_p99_with_prefill_ms: float = math.nan
    # Speculative decoding (bench/spec_columns.py): its setting, K, the share of draft tokens accepted, the tokens a
    # verify step gave a request, output tokens per decode step per request; "" and NaN with it off.
    spec: str = ""
    spec_k: float = math.nan
    spec_acceptance: float = math.nan
    spec_accepted_len: float = math.nan
    spec_tokens_per_step: float = math.nan
    # A disaggregated deployment (deploy/): its layout ("P:D 1:1"; "" one engine), the KV transfer per request, and
    # the share of the run each pool's instances spent in steps (their mean).
    deployment: str = ""
    kv_transfer_p50_ms: float = math.nan
    kv_transfer_p99_ms: float = math.nan
    prefill_busy: float = math.nan
    decode_busy: float = math.nan

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def cv(self) -> float:
        """The row's worst CV (t/s or throughput); NaN when unknown."""
        known = [c for c in (self.ts_cv, self.throughput_cv) if c is not None and not math.isnan(c)]
        return max(known) if known else math.nan

    def noisy(self, threshold: float = stats.DEFAULT_NOISY_CV) -> bool:
        return stats.is_noisy([self.ts_cv, self.throughput_cv], threshold)


#: Columns that are None where they do not apply: NaN in a frame.
OPTIONAL_NUMBERS = ["chunk_size", "rate", "burstiness"]


def results_frame(rows: list[ResultRow]) -> pd.DataFrame:
    """A run's rows as a DataFrame, one column per ResultRow field, None as NaN."""
    frame = pd.DataFrame([r.as_dict() for r in rows], columns=ResultRow.columns())
    return frame.astype({c: float for c in OPTIONAL_NUMBERS})


def noisy_rows(frame: pd.DataFrame, threshold: float = stats.DEFAULT_NOISY_CV) -> pd.Series:
    """ResultRow.noisy for every row of a frame."""
    return frame[["ts_cv", "throughput_cv"]].gt(threshold).any(axis=1)


@dataclass(frozen=True)
class SLO:
    """Latency objectives in milliseconds; None: not given."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    tbt_ms: float | None = None
    e2e_ms: float | None = None

    KEYS: ClassVar[tuple[str, ...]] = ("ttft", "tpot", "tbt", "e2e")

    @classmethod
    def parse(cls, text: str) -> "SLO":
        """`ttft=MS,tpot=MS,tbt=MS,e2e=MS`, any subset."""
        values: dict[str, float] = {}
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            key, eq, value = part.partition("=")
            key = key.strip().lower()
            if not eq or key not in cls.KEYS:
                raise ValueError(f"bad SLO {part!r}: expected KEY=MS with KEY one of {', '.join(cls.KEYS)}")
            if key in values:
                raise ValueError(f"SLO {key} given twice")
            try:
                ms = float(value)
            except ValueError:
                raise ValueError(f"bad SLO {part!r}: {value.strip()!r} is not a number of milliseconds") from None
            if not ms > 0 or math.isinf(ms):
                raise ValueError(f"bad SLO {part!r}: must be a positive number of milliseconds")
            values[key] = ms
        if not values:
            raise ValueError("an SLO needs at least one of ttft=MS, tpot=MS, tbt=MS, e2e=MS")
        return cls(**{f"{k}_ms": v for k, v in values.items()})

    def __str__(self) -> str:
        return ",".join(f"{k}={getattr(self, f'{k}_ms'):g}" for k in self.KEYS if getattr(self, f"{k}_ms") is not None)

    def met(self, req: RequestRecord) -> bool:
        """Whether one request met every objective given."""
        checks = [(self.ttft_ms, ttft_ms(req)), (self.tpot_ms, tpot_ms(req)), (self.e2e_ms, e2e_ms(req))]
        if self.tbt_ms is not None:
            gaps = request_tbts_ms(req)
            checks.append((self.tbt_ms, float(gaps.max()) if gaps.size else 0.0))
        # A one-token request has no TPOT (NaN): nothing to miss, as vLLM counts it.
        return all(value <= limit for limit, value in checks if limit is not None and not math.isnan(value))


def request_rate(test: TestSpec, req: RequestRecord) -> float:
    """Tokens per second of one request, by the kind of test.

    pp: prompt tokens over arrival-to-first-token; tg: decode steps over
    first-to-last token; pp+tg: all its tokens over its end-to-end time.
    """
    times = req.token_times
    tokens = test.request_tokens(req.prompt_len, len(req.tokens))
    if test.kind == "pp":
        return tokens / (times[0] - req.arrival)
    if test.kind == "tg":
        return tokens / (times[-1] - times[0])
    return tokens / (times[-1] - req.arrival)


def ttft_ms(req: RequestRecord) -> float:
    return 1000 * (req.token_times[0] - req.arrival)


def tpot_ms(req: RequestRecord) -> float:
    """Mean time per output token after the first; NaN for a one-token request."""
    n = len(req.token_times)
    return 1000 * (req.token_times[-1] - req.token_times[0]) / (n - 1) if n > 1 else math.nan


def e2e_ms(req: RequestRecord) -> float:
    return 1000 * (req.token_times[-1] - req.arrival)


def sched_delay_ms(req: RequestRecord) -> float:
    return math.nan if req.first_scheduled is None else 1000 * (req.first_scheduled - req.arrival)


def request_tbts_ms(req: RequestRecord) -> np.ndarray:
    """The gaps between a request's tokens, one per step that brought it tokens: a speculative verify step's tokens
    appear together, and vLLM bench serve's ITL counts them as one gap (one streamed chunk), never split (its
    endpoint_request_func.py: itl.append(timestamp - most_recent_timestamp) per chunk); TPOT still counts each."""
    gaps = 1000 * np.diff(req.token_times)
    return gaps[gaps > 0] if req.accepted else gaps


def ttfts_ms(run: RunRecord) -> list[float]:
    return [ttft_ms(r) for r in run.requests]


def tbts_ms(run: RunRecord) -> np.ndarray:
    """Every gap between two tokens of one request, in ms (arrays: a capacity probe has ~10^5 of them)."""
    return np.concatenate([request_tbts_ms(r) for r in run.requests]) if run.requests else np.zeros(0)


def offered_rate(run: RunRecord) -> float:
    """Arrivals per second between the first and the last arrival; NaN for one request or none."""
    arrivals = sorted(r.arrival for r in run.requests)
    span = arrivals[-1] - arrivals[0] if arrivals else 0.0
    return (len(arrivals) - 1) / span if span > 0 else math.nan


def achieved_rate(run: RunRecord) -> float:
    """Completions per second from the first arrival to the last completion.

    Not first to last completion: strategies that finish requests together (a
    batch's decodes end in the same step) would show near-infinite rates."""
    if not run.requests:
        return math.nan
    span = max(r.token_times[-1] for r in run.requests) - min(r.arrival for r in run.requests)
    return len(run.requests) / span if span > 0 else math.nan


#: Requests the queue-growth slope is fitted on at most (evenly by arrival): Theil-Sen takes every pair, n^2/2 slopes.
GROWTH_POINTS = 200


def queue_growth(run: RunRecord) -> float:
    """How fast the wait grows with arrival time, at least: the lower end of a 90% interval (95% one-sided) of the
    Theil-Sen slope, against the k-th arrival, of the k-th first token's lag behind it (both sorted: the horizontal
    distance between the arrival and first-token curves, the wait each request would have had served in order).
    Dimensionless: an open loop at a rate r a system serves at mu < r makes the request arriving at t wait about
    (r/mu - 1) t, so the slope is r/mu - 1, and below capacity it is 0 but for the queue filling to its steady state.
    What tells a short probe over capacity from one under it, where the median-delay bound cannot: a burst of 30
    requests drains in seconds, its median delay under any bound.
    Read on the curves, not on each request's own scheduling delay or TTFT, because a queue can sit where those
    cannot see it: llama-server gives every request a slot on arrival and interleaves their prompts, so no
    request's scheduling delay grows, and the TTFT of each falls with its arrival once they all finish together;
    the first tokens still come out at the rate the system serves, slower than requests arrive.
    NaN with fewer than 3 requests or all arriving at once."""
    arrivals = np.sort([r.arrival for r in run.requests])
    firsts = np.sort([r.token_times[0] for r in run.requests])
    if len(arrivals) > GROWTH_POINTS:
        picks = np.round(np.arange(GROWTH_POINTS) * (len(arrivals) - 1) / (GROWTH_POINTS - 1)).astype(int)
        arrivals, firsts = arrivals[picks], firsts[picks]
    if len(arrivals) < 3 or np.ptp(arrivals) <= 0:
        return math.nan
    from scipy.stats import theilslopes  # scipy's import is 0.3 s: only where a slope is fitted
    return float(theilslopes(firsts - arrivals, arrivals, alpha=0.90).low_slope)


def goodput(run: RunRecord, slo: SLO) -> float:
    return sum(slo.met(r) for r in run.requests) / run.wall


@dataclass(frozen=True)
class Load:
    """How the requests of a row arrived: the row's arrival columns."""

    arrival: str = "closed"
    rate: float | None = None
    burstiness: float | None = None


def _mean(values: list[float]) -> float:
    known = [v for v in values if not math.isnan(v)]
    return mean_std(known)[0] if known else math.nan


def summarize(
    test: TestSpec,
    runs: list[RunRecord],
    *,
    model: str,
    backend: str,
    strategy: str,
    concurrency: int,
    chunk_size: int | None,
    load: Load = Load(),
    slo: SLO | None = None,
    prefix_implied: float = math.nan,
    deployment: str = "",
    kv_host_gib: float | None = None,
) -> ResultRow:
    reqs = [r for run in runs for r in run.requests]
    failed = sum(len(run.failed) for run in runs)
    # A capacity probe stopped once its SLO had certainly failed may end before any request finished (a served
    # one, whose live requests' first tokens are late already): its row has no latencies, and the probe failed.
    if not reqs and not all(run.stopped for run in runs):
        raise BackendError(f"every one of the {failed} requests failed: {runs[0].failed[0].error}" if failed
                           else "a run finished no request")
    rates = [request_rate(test, r) for r in reqs]
    ts_mean, ts_std = mean_std(rates)
    run_rates = [mean_std([request_rate(test, r) for r in run.requests])[0] for run in runs]
    throughputs = [sum(test.request_tokens(r.prompt_len, len(r.tokens)) for r in run.requests) / run.wall for run in runs]
    ttft = [ttft_ms(r) for r in reqs]
    tbt = np.concatenate([tbts_ms(run) for run in runs])
    tpot = [tpot_ms(r) for r in reqs]
    e2e = [e2e_ms(r) for r in reqs]
    sched = [sched_delay_ms(r) for r in reqs]
    open_loop = load.arrival != "closed"
    return ResultRow(
        model=model,
        backend=backend,
        strategy=strategy,
        test=test.name,
        n_prompt=test.n_prompt,
        n_gen=test.n_gen,
        concurrency=concurrency,
        chunk_size=chunk_size,
        requests=len(runs[0].requests) + len(runs[0].failed),
        repetitions=len(runs),
        ts_mean=ts_mean,
        ts_std=ts_std,
        ms_per_token=1000.0 / ts_mean,
        throughput=mean_std(throughputs)[0],
        ttft_p50_ms=percentile(ttft, 50),
        ttft_p99_ms=percentile(ttft, 99),
        tbt_p50_ms=percentile(tbt, 50),
        tbt_p99_ms=percentile(tbt, 99),
        ts_cv=stats.cv(run_rates),
        ts_ci95=stats.ci_half_width(run_rates),
        throughput_cv=stats.cv(throughputs),
        throughput_ci95=stats.ci_half_width(throughputs),
        ttft_p90_ms=percentile(ttft, 90),
        tbt_p90_ms=percentile(tbt, 90),
        tpot_p50_ms=percentile(tpot, 50),
        tpot_p90_ms=percentile(tpot, 90),
        tpot_p99_ms=percentile(tpot, 99),
        e2e_p50_ms=percentile(e2e, 50),
        e2e_p90_ms=percentile(e2e, 90),
        e2e_p99_ms=percentile(e2e, 99),
        sched_delay_p50_ms=percentile(sched, 50),
        sched_delay_p90_ms=percentile(sched, 90),
        sched_delay_p99_ms=percentile(sched, 99),
        arrival_lag_p50_ms=percentile([1000 * lag for run in runs for lag in run.arrival_lags], 50),
        arrival_lag_p99_ms=percentile([1000 * lag for run in runs for lag in run.arrival_lags], 99),
        **client_columns(runs, percentile(ttft, 50)),
        queue_growth=_mean([queue_growth(run) for run in runs]) if open_loop else math.nan,
        request_throughput=_mean([len(run.requests) / run.wall for run in runs]),
        arrival=load.arrival,
        rate=load.rate,
        burstiness=load.burstiness,
        offered_rps=_mean([offered_rate(run) for run in runs]) if open_loop else math.nan,
        achieved_rps=_mean([achieved_rate(run) for run in runs]) if open_loop else math.nan,
        slo=str(slo) if slo else "",
        goodput_rps=_mean([goodput(run, slo) for run in runs]) if slo else math.nan,
        # A failed request is a miss: it is in the denominator, never among those that met the SLO.
        slo_met=sum(slo.met(r) for r in reqs) / (len(reqs) + failed) if slo and reqs else (0.0 if slo else math.nan),
        failed_requests=failed,
        ttft_mean_ms=_mean(ttft),
        tbt_mean_ms=float(tbt.mean()) if tbt.size else math.nan,
        e2e_mean_ms=_mean(e2e),
        ttft_p50_rank_ms=percentile(ttft, 50, "inverted_cdf"),
        tbt_p50_rank_ms=percentile(tbt, 50, "inverted_cdf"),
        **engine_columns(runs, reqs),
        **memory_columns(runs),
        prefix_hit_rate=prefix_hit_rate(reqs),
        prefix_hit_implied=prefix_implied,
        ttft_later_turns_p50_ms=percentile([ttft_ms(r) for r in reqs if r.turn > 0], 50),
        **class_columns(reqs),
        **stall_columns(runs),
        **spec_columns(strategy, reqs),
        deployment=deployment,
        **deployment_columns(runs),
        kv_host_gib=math.nan if kv_host_gib is None else kv_host_gib,
    )


def host_label(gib: float | None) -> str:
    """', host 128 GiB' where a host tier was sized (', no host tier' for a grid's 0); '' where none was asked (None,
    NaN): what a row or a configuration adds to its scheduler's label."""
    if gib is None or math.isnan(gib):
        return ""
    return f", host {gib:g} GiB" if gib else ", no host tier"


def prefix_hit_rate(reqs: list[RequestRecord]) -> float:
    """The share of the prompt tokens of `reqs` their backend found cached; NaN where none says."""
    known = [r for r in reqs if r.cached_tokens is not None]
    total = sum(r.prompt_len for r in known)
    return sum(r.cached_tokens for r in known) / total if known and total else math.nan


def implied_hit_rate(backend: Backend, prompts: list[tuple[int, ...]]) -> float:
    """The share of prompt tokens cached if every prompt found the blocks earlier ones left in a cache of the
    backend's block and capacity (prefix_cache.implied_hits); NaN where it runs no cache."""
    if backend.prefix_block is None:
        return math.nan
    return _implied_rate(tuple(prompts), backend.prefix_block, backend.prefix_capacity)


@functools.lru_cache(maxsize=8)
def _implied_rate(prompts: tuple[tuple[int, ...], ...], block: int, capacity: int | None) -> float:
    # Kept: every probe of a capacity search replays the same prompts (the seed's), only at another rate.
    cached, total = implied_hits(prompts, block, capacity)
    return cached / total if total else math.nan

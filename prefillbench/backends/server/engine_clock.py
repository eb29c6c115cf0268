"""The engine's own clock: a server's Prometheus `/metrics`, read before and after each run, and what the difference
says of that run as the engine timed it (its TTFT, inter-token latency, queue, prefill and decode times), beside what
the client timed. And what a server says of itself (`describe`): vLLM's /v1/models and /version, llama-server's
/props.

Parsed with prometheus_client's own text parser (no regular expressions). A histogram's delta gives an exact mean
(its sum over its count) and a p50 interpolated within the bucket that holds it, as Prometheus' histogram_quantile
does: the true median lies somewhere in that bucket, so its bounds are the p50's resolution and are kept with it.

vLLM (vllm/v1/metrics/loggers.py and stats.py, 0.32): `vllm:time_to_first_token_seconds` (the API server's first
token less the request's arrival there), `vllm:inter_token_latency_seconds` (engine-core timestamps of successive
tokens), `vllm:request_queue_time_seconds` (scheduled less queued), `vllm:request_prefill_time_seconds` (first token
less scheduled), `vllm:request_decode_time_seconds` (last token less first), `vllm:e2e_request_latency_seconds`
(the last token less the arrival). The arrival is stamped when the API server's input processor takes the request
(vllm/v1/engine/input_processor.py, `time.time()`), after its HTTP handling: the client's end-to-end time less the
engine's is what lay before that stamp and after the last token left. TTFT less queue and prefill is the rest:
the API server's tokenizing, its IPC with the engine core and the first token's detokenizing.

llama-server (tools/server/server-task.cpp, to_metrics) has counters, no histograms:
`llamacpp:tokens_predicted_total` (generated tokens, the first included) and
`llamacpp:tokens_predicted_seconds_total` (each request's first generated token to its last, summed), so its
mean time between tokens is the seconds over the tokens less one a request; `llamacpp:prompt_seconds_total` is its
prompt-processing time (prompts processed together share it). Its per-token clock (`timings_per_token`, kept by the
client) gives the rest, per request and per token, exactly.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from prefillbench.backends.server import engine_metrics

#: How long a scrape or a self-description may take before the engine's clock is left out (the run is not failed).
SCRAPE_TIMEOUT_S = engine_metrics.TIMEOUT_S
#: Round trips of the health check timed before each run: the slowest is what the network (and HTTP, and a busy
#: client) added at worst while it was measured.
NET_PROBES = 5

VLLM_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}
LLAMA_PREDICTED = "llamacpp:tokens_predicted_total"
LLAMA_PREDICTED_S = "llamacpp:tokens_predicted_seconds_total"
LLAMA_PROMPT_S = "llamacpp:prompt_seconds_total"


@dataclass(frozen=True)
class Histogram:
    """One histogram, every label set summed: cumulative counts at each upper bound (+Inf last), sum and count."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    total: float
    count: float

    def combine(self, other: "Histogram", sign: float = 1.0) -> "Histogram":
        if other.bounds != self.bounds:
            raise ValueError("histograms with different buckets")
        return Histogram(self.bounds, tuple(a + sign * b for a, b in zip(self.cumulative, other.cumulative)),
                         self.total + sign * other.total, self.count + sign * other.count)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count > 0 else math.nan

    def quantile(self, q: float) -> tuple[float, float, float]:
        """(estimate, bucket low, bucket high): linear within the bucket holding rank q * count, as Prometheus'
        histogram_quantile; in the +Inf bucket the estimate is its lower bound. NaNs with no observation."""
        if self.count <= 0:
            return math.nan, math.nan, math.nan
        rank = q * self.count
        low, below = 0.0, 0.0
        for bound, cum in zip(self.bounds, self.cumulative):
            if cum >= rank and cum > below:
                if math.isinf(bound):
                    return low, low, bound
                return low + (bound - low) * (rank - below) / (cum - below), low, bound
            low, below = bound, cum
        return low, low, math.inf


@dataclass(frozen=True)
class Snapshot:
    """A /metrics text as numbers: histograms by family name, counters and gauges by sample name, labels summed."""

    histograms: dict[str, Histogram] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)

    def minus(self, before: "Snapshot") -> "Snapshot":
        """What happened between `before` and this one (a family absent before counts from zero)."""
        hist = {n: h.combine(before.histograms[n], -1.0) if n in before.histograms else h
                for n, h in self.histograms.items()}
        counters = {n: v - before.counters.get(n, 0.0) for n, v in self.counters.items()}
        return Snapshot(hist, counters)

    def plus(self, other: "Snapshot") -> "Snapshot":
        hist = dict(self.histograms)
        for n, h in other.histograms.items():
            hist[n] = hist[n].combine(h) if n in hist else h
        counters = dict(self.counters)
        for n, v in other.counters.items():
            counters[n] = counters.get(n, 0.0) + v
        return Snapshot(hist, counters)


def parse(text: str) -> Snapshot:
    """A Prometheus text exposition as a Snapshot; ValueError where it is not one."""
    return snapshot_of(engine_metrics.families(text))


def snapshot_of(fams: list) -> Snapshot:
    """prometheus_client's metric families (engine_metrics.families) as a Snapshot."""
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    counters: dict[str, float] = {}
    for family in fams:
        if family.type == "histogram":
            mine = buckets.setdefault(family.name, {})
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    bound = float(s.labels["le"])
                    mine[bound] = mine.get(bound, 0.0) + s.value
                elif s.name.endswith("_sum"):
                    sums[family.name] = sums.get(family.name, 0.0) + s.value
                elif s.name.endswith("_count"):
                    counts[family.name] = counts.get(family.name, 0.0) + s.value
        elif family.type in ("counter", "gauge", "untyped"):
            for s in family.samples:
                if not s.name.endswith("_created"):
                    counters[s.name] = counters.get(s.name, 0.0) + s.value
    hist = {}
    for name, by_bound in buckets.items():
        bounds = tuple(sorted(by_bound))
        hist[name] = Histogram(bounds, tuple(by_bound[b] for b in bounds), sums.get(name, 0.0),
                               counts.get(name, by_bound.get(math.inf, 0.0)))
    return Snapshot(hist, counters)


@dataclass
class Reading:
    """The engine's clock over one run: what /metrics counted between before and after, the requests the client
    finished in it with tokens, and the network's round trip measured just before (ms)."""

    delta: Snapshot
    requests: int
    net_ms: float

    def plus(self, other: "Reading") -> "Reading":
        return Reading(self.delta.plus(other.delta), self.requests + other.requests, max(self.net_ms, other.net_ms))


@dataclass(frozen=True)
class Figures:
    """The engine's account of a case, ms; NaN where it reports nothing. p50 with its bucket's bounds."""

    source: str = ""
    requests: float = math.nan  # requests the engine counted (vLLM: its TTFT count); more than sent: other traffic
    ttft_mean: float = math.nan
    ttft_p50: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    itl_mean: float = math.nan
    itl_p50: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    queue_mean: float = math.nan
    prefill_mean: float = math.nan
    decode_mean: float = math.nan
    e2e_mean: float = math.nan  # arrival at the API server to the last token: beside the client's, what lies before


def _ms(t: tuple[float, float, float]) -> tuple[float, float, float]:
    return tuple(1e3 * v for v in t)  # type: ignore[return-value]


def figures(reading: Reading) -> Figures:
    """What the delta says, by the engine whose metrics it holds (vLLM's histograms or llama-server's counters)."""
    d = reading.delta
    h = {k: d.histograms.get(name) for k, name in VLLM_HISTOGRAMS.items()}
    if any(h[k] is not None and h[k].count > 0 for k in ("ttft", "itl")):
        mean = lambda k: 1e3 * h[k].mean if h[k] is not None else math.nan  # noqa: E731
        p50 = lambda k: _ms(h[k].quantile(0.5)) if h[k] is not None else (math.nan,) * 3  # noqa: E731
        return Figures("vllm /metrics", h["ttft"].count if h["ttft"] is not None else math.nan,
                       mean("ttft"), p50("ttft"), mean("itl"), p50("itl"), mean("queue"), mean("prefill"),
                       mean("decode"), mean("e2e"))
    if LLAMA_PREDICTED_S in d.counters and reading.requests:
        n = reading.requests
        gaps = d.counters.get(LLAMA_PREDICTED, 0.0) - n
        seconds = d.counters[LLAMA_PREDICTED_S]
        return Figures("llama-server /metrics", math.nan,
                       itl_mean=1e3 * seconds / gaps if gaps > 0 else math.nan,
                       prefill_mean=1e3 * d.counters.get(LLAMA_PROMPT_S, math.nan) / n,
                       decode_mean=1e3 * seconds / n)
    return Figures()


# ---------------------------------------------------------------- reading a server


def scrape(url: str, headers: dict[str, str] | None = None) -> Snapshot | None:
    """The server's /metrics now; None where it has none (llama-server without --metrics answers 501) or it is not
    Prometheus text (metrics_missing says which)."""
    snapshot, _ = read_metrics(url, headers)
    return snapshot


def read_metrics(url: str, headers: dict[str, str] | None = None) -> tuple[Snapshot | None, str]:
    """The server's /metrics now and, where there is none to read, why, in words for a one-line note: the HTTP status
    it answered (llama-server without --metrics: 501; a server with no such route: 404), no answer, or a body that
    is not Prometheus text."""
    fams, why = engine_metrics.read_families(url, headers)
    return (snapshot_of(fams) if fams is not None else None), why


def net_round_trip_ms(url: str, headers: dict[str, str] | None = None, probes: int = NET_PROBES) -> float:
    """The slowest of a few GETs of `url` (the health check), in ms, each on a fresh connection as the streaming
    client opens one a request (client_http.py; here aiohttp, a session of its own with its resolver), the answer
    read whole. A request in and an answer out over the path a token's event takes, HTTP and both ends'
    event loops included: what the network and the client can add to one client figure. A TTFT holds one request
    in and one event out; a gap between two events loses the delay both share and keeps at most its variation,
    less than a round trip."""
    import asyncio

    import aiohttp

    async def once() -> float | None:
        t0 = time.perf_counter()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as session:
                async with session.get(url, headers=headers or {}) as response:
                    await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return None
        return time.perf_counter() - t0

    async def all_of() -> list[float]:
        out = []
        for _ in range(probes):
            t = await once()
            if t is None:
                break
            out.append(t)
        return out

    times = asyncio.run(all_of())
    return 1e3 * max(times) if times else math.nan


def describe(url: str, api: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """What the server says of itself, as metadata: vLLM's served models and version; llama-server's /props
    (context per slot, slots, model, build). llama-server's /props does not report n_batch (get_res_props in
    tools/server/server-context.cpp): only its log does, which a --url cannot read; it is said so."""
    out: dict[str, Any] = {}

    def doc(path: str) -> dict[str, Any] | None:
        text, _ = engine_metrics.get_text(url + path, headers, SCRAPE_TIMEOUT_S)
        try:
            value = json.loads(text) if text else None
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None

    if api == "llama":
        props = doc("/props")
        if props is not None:
            settings = props.get("default_generation_settings")
            settings = settings if isinstance(settings, dict) else {}
            out["server_n_ctx_per_slot"] = settings.get("n_ctx")
            out["server_total_slots"] = props.get("total_slots")
            out["server_model_path"] = props.get("model_path")
            if props.get("build_info"):
                out["server_build"] = props.get("build_info")
            out["server_n_batch"] = props.get("n_batch", "not reported by /props")
    else:
        models = doc("/v1/models")
        if models is not None:
            data = models.get("data")
            data = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
            out["server_models"] = ",".join(str(m.get("id")) for m in data)
            lengths = {m.get("max_model_len") for m in data if m.get("max_model_len") is not None}
            if lengths:
                out["server_max_model_len"] = max(lengths)
        version = doc("/version")
        if version is not None and version.get("version"):
            out["server_version"] = str(version["version"])
    return {k: v for k, v in out.items() if v is not None}

"""A serving engine's KV memory as the engine itself reports it: its capacity in tokens, how full it ran during a run
and how many requests it preempted, read from its own endpoints and named as the engine names them. The one place a
server's /metrics families (labels included) and /slots are read for what they say of memory and caching: the
engine's clock (engine_clock.py) reads the same /metrics for its times.

Parsed with prometheus_client's text parser (`families`); llama-server's /slots is JSON.

* vLLM (vllm/v1/metrics/loggers.py, PrometheusStatLogger, 0.32): `vllm:cache_config_info` is a gauge of value 1
  whose labels are the CacheConfig's fields, the profiled (or --num-gpu-blocks-override) `num_gpu_blocks` and
  `block_size` among them: capacity = num_gpu_blocks x block_size tokens (0.32 also labels their product,
  `kv_cache_size_tokens`). One of those blocks is BlockPool's null block, never given to a request, and
  `vllm:kv_cache_usage_perc` (a share, 0 to 1, despite its name) is BlockPool.get_usage: the blocks in use over
  num_gpu_blocks - 1 (vllm/v1/core/block_pool.py). It is set from the scheduler's stats of each engine step, and is
  a gauge: only its value when scraped is seen, so the run samples it (KVSampler) and keeps the largest sample, a
  lower bound of the true peak within one sampling interval. `vllm:num_preemptions_total` counts the scheduler's
  preemptions (Scheduler._preempt_request): its delta over the run is exact.
* SGLang 0.5.23 (sglang/srt/observability/metrics_collector.py, SchedulerMetricsCollector; --enable-metrics):
  `sglang:max_total_num_tokens` (the token pool's size), `sglang:token_usage` (the fullest pool's use, rounded to
  hundredths: scheduler_components/pool_stats_observer.py; set when the scheduler reports, each prefill batch and
  every --decode-log-interval decode steps, 40 by default: metrics_reporter.py, so coarser than the sampling),
  `sglang:num_retracted_requests_total` (retractions, a counter; the gauge `sglang:num_retracted_reqs` holds only
  the last report's, which no delta can be taken of: not read).
* llama-server (tools/server/server-context.cpp, server_slot::to_json): `/slots` lists each slot's `n_ctx` and, for
  a slot processing a request, `n_prompt_tokens` (its cache's tokens: the prompt, then each generated token as it is
  appended). Capacity = the slots' n_ctx summed (each slot's own cache: the launch gives -np and no --kv-unified);
  use = the processing slots' tokens summed over it, sampled. Its /metrics export no KV figure in this build (no
  `llamacpp:kv_cache_usage_ratio` or `kv_cache_tokens`; `n_tokens_max` is one slot's longest since start), and it
  never preempts: a full cache halves its batch or fails the request.

A figure an engine does not export is NaN, and `missing` names it ("not exported: ..."): never an error.
"""
from __future__ import annotations

import json
import math
import select
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

#: Seconds between samples of a KV use gauge during a run: the peak's resolution in time. Each sample asks for the
#: one family (prometheus_client's `name[]` filter); vLLM 0.32 renders every family all the same (its
#: instrumentator's /metrics route comes before the prometheus_client app that filters:
#: entrypoints/serve/instrumentator/metrics.py), so only the family's lines are handed to the parser.
SAMPLE_INTERVAL_S = 0.5
#: How long one request to the engine may take before it is given up (the sample or figure is left out).
TIMEOUT_S = 5.0

VLLM_INFO, VLLM_USAGE, VLLM_PREEMPTED = "vllm:cache_config_info", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"
SGLANG_CAPACITY, SGLANG_USAGE = "sglang:max_total_num_tokens", "sglang:token_usage"
SGLANG_RETRACTED = "sglang:num_retracted_requests_total"


# ---------------------------------------------------------------- reading an engine's endpoints


def get_text(url: str, headers: dict[str, str] | None = None, timeout: float = TIMEOUT_S) -> tuple[str | None, str]:
    """The body of a GET of `url`, or None and why in words (the HTTP status, or no answer)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as r:
            return r.read().decode("utf-8", "replace"), ""
    except urllib.error.HTTPError as e:
        return None, f"{url} answered HTTP {e.code}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return None, f"{url} did not answer ({getattr(e, 'reason', e)})"


def families(text: str) -> list:
    """A Prometheus text exposition as prometheus_client's metric families; ValueError where it is not one."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise ValueError(f"not Prometheus text ({e})") from None


def read_families(url: str, headers: dict[str, str] | None = None) -> tuple[list | None, str]:
    """The server's /metrics now as metric families and, where there are none to read, why in words (the HTTP status
    it answered: llama-server without --metrics 501, no such route 404; no answer; not Prometheus text)."""
    text, why = get_text(metrics_url(url), headers)
    if text is None:
        return None, why
    try:
        return families(text), ""
    except ValueError:
        return None, f"{url}/metrics is not Prometheus text"


def sample_values(fams: list, name: str) -> list[float]:
    """Every value of the samples named `name` (one a label set: an engine each, or a rank), finite ones only."""
    return [s.value for f in fams for s in f.samples if s.name == name and math.isfinite(s.value)]


def sample_labels(fams: list, name: str) -> list[dict[str, str]]:
    """The label sets of the samples named `name` (an *_info gauge's fields)."""
    return [dict(s.labels) for f in fams for s in f.samples if s.name == name]


def metrics_url(url: str, names: tuple[str, ...] = ()) -> str:
    """The /metrics address, asking for only `names` where given (prometheus_client's `name[]` filter; a server
    that ignores it sends everything, which parses the same)."""
    return f"{url}/metrics" + (f"?{urllib.parse.urlencode([('name[]', n) for n in names])}" if names else "")


# ---------------------------------------------------------------- what each engine says of its memory


@dataclass(frozen=True)
class KVMemory:
    """An engine's KV memory over one run, as it reported it. NaN where it reports nothing; `missing` says what."""

    source: str = ""  # where it was read: "vllm /metrics", "sglang /metrics", "llama-server /slots"
    policy: str = ""  # how the engine holds it: "paged" (blocks as computed, preempting), "slots" (a cache a slot)
    capacity_tokens: float = math.nan
    peak_fraction: float = math.nan  # the largest sampled use, a share of the capacity
    preemptions: float = math.nan  # requests preempted (vLLM) or retracted (SGLang) during the run
    retractions: float = math.nan  # of those, SGLang's retractions
    samples: int = 0  # use samples taken during the run
    interval_s: float = math.nan  # between them
    missing: tuple[str, ...] = ()  # the figures the engine did not export (or that could not be read)

    def note(self) -> str:
        """'vllm /metrics' or 'vllm /metrics; not exported: vllm:num_preemptions_total': the row's kv_source."""
        return self.source + (f"; not exported: {', '.join(self.missing)}" if self.missing else "")


@dataclass(frozen=True)
class Engine:
    """What one engine exports of its memory: where its use is read and how (a /metrics gauge, or /slots)."""

    name: str
    source: str
    policy: str
    usage_path: str  # the path polled during the run

    def use(self, body: str) -> float | None:
        """The share of the capacity in use in one sample's body; None where it holds none."""
        if self.name == "llama-server":
            slots = _slots(body)
            capacity = sum(s["n_ctx"] for s in slots) if slots else 0
            return sum(s["tokens"] for s in slots if s["busy"]) / capacity if capacity > 0 else None
        name = VLLM_USAGE if self.name == "vllm" else SGLANG_USAGE
        # the family's own lines (its HELP, TYPE and samples) out of a whole exposition, for the parser
        mine = "".join(line for line in body.splitlines(keepends=True)
                       if line.startswith(name) or line.startswith((f"# HELP {name} ", f"# TYPE {name} ")))
        values = sample_values(families(mine or body), name)
        return max(values) if values else None  # an engine each (data parallel): the fullest

    def capacity(self, fams: list, slots_body: str | None) -> float | None:
        if self.name == "vllm":
            return vllm_capacity(fams)
        if self.name == "sglang":
            values = sample_values(fams, SGLANG_CAPACITY)
            return float(max(values)) if values and max(values) > 0 else None  # every rank holds the same pool
        slots = _slots(slots_body) if slots_body else []
        return float(sum(s["n_ctx"] for s in slots)) if slots else None

    @property
    def preempted_counter(self) -> str | None:
        return {"vllm": VLLM_PREEMPTED, "sglang": SGLANG_RETRACTED}.get(self.name)

    @property
    def usage_name(self) -> str:
        return {"vllm": VLLM_USAGE, "sglang": SGLANG_USAGE}.get(self.name, "n_prompt_tokens")


ENGINES = {
    "vllm": Engine("vllm", "vllm /metrics", "paged", metrics_url("", (VLLM_USAGE,))),
    "sglang": Engine("sglang", "sglang /metrics", "paged", metrics_url("", (SGLANG_USAGE,))),
    "llama-server": Engine("llama-server", "llama-server /slots", "slots", "/slots"),
}


def engine_for(fams: list | None, api: str) -> Engine | None:
    """Which engine's names a /metrics scrape holds (a server at --url may be any): vLLM's or SGLang's prefix;
    llama-server by its API (its /slots need no /metrics). None where it is none of them."""
    names = {f.name.split(":", 1)[0] for f in fams or () if ":" in f.name}
    if "vllm" in names:
        return ENGINES["vllm"]
    if "sglang" in names:
        return ENGINES["sglang"]
    return ENGINES["llama-server"] if api == "llama" else None


def vllm_capacity(fams: list) -> float | None:
    """num_gpu_blocks x block_size from vllm:cache_config_info, summed over engines (data parallel); None where
    the gauge or either label is not there or not a number."""
    total = 0.0
    for labels in sample_labels(fams, VLLM_INFO):
        try:
            total += int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):  # "None" before the engine has profiled its memory
            return None
    return total or None


def _slots(body: str | None) -> list[dict[str, Any]]:
    """llama-server's /slots as [{n_ctx, tokens, busy}], [] where it is not that list."""
    try:
        value = json.loads(body) if body else None
    except json.JSONDecodeError:
        return []
    out = []
    for s in value if isinstance(value, list) else []:
        if isinstance(s, dict) and isinstance(s.get("n_ctx"), int):
            tokens = s.get("n_prompt_tokens")
            out.append({"n_ctx": s["n_ctx"], "tokens": tokens if isinstance(tokens, int) else 0,
                        "busy": bool(s.get("is_processing"))})
    return out


# ---------------------------------------------------------------- over a run


class UseSamples:
    """The largest share of its capacity an engine said it used, over the samples taken, and how many there were;
    with `health_url`, each sample also times a GET of it: the slowest round trip while the run's requests were in
    flight (what the network and both ends' loops added to a client figure under the run's own load, which the
    round trips before and after it, with the engine idle, do not see)."""

    def __init__(self, url: str, engine: Engine, headers: dict[str, str] | None = None,
                 interval_s: float = SAMPLE_INTERVAL_S, health_url: str | None = None) -> None:
        self.url, self.engine, self.headers, self.interval_s = url + engine.usage_path, engine, headers, interval_s
        self.health_url = health_url
        self.peak = math.nan
        self.samples = 0
        self.slowest_round_trip_s = math.nan

    def sample(self) -> None:
        timeout = min(TIMEOUT_S, 10 * self.interval_s)
        if self.health_url is not None:
            t0 = time.perf_counter()
            if get_text(self.health_url, self.headers, timeout=timeout)[0] is not None:
                took = time.perf_counter() - t0
                self.slowest_round_trip_s = took if math.isnan(self.slowest_round_trip_s) else max(
                    self.slowest_round_trip_s, took)
        body, _ = get_text(self.url, self.headers, timeout=timeout)
        if body is None:
            return
        try:
            use = self.engine.use(body)
        except ValueError:  # not Prometheus text: no sample
            return
        if use is not None:
            self.samples += 1
            self.peak = use if math.isnan(self.peak) else max(self.peak, use)

    def answer(self) -> dict:
        return {"peak": None if math.isnan(self.peak) else self.peak, "samples": self.samples,
                "round_trip_ms": None if math.isnan(self.slowest_round_trip_s) else 1e3 * self.slowest_round_trip_s}


@dataclass(frozen=True)
class RunSamples:
    """What the sampler saw over one run: the largest KV share, how many samples, the slowest timed round trip."""

    peak: float = math.nan
    samples: int = 0
    round_trip_ms: float = math.nan


class KVSampler:
    """Polls an engine's use during runs in a process of its own: in the client's process even a short parse holds
    the interpreter's lock while the client's event loop is due to send (a sampling thread there put the client's
    send lag past its 1 ms bound on a 2-core machine). One process for a backend, told over its stdin: a JSON line
    {url, engine, headers, interval_s, health_url} starts a run's sampling (answered once its first sample is
    taken), "stop" ends it (answered with UseSamples.answer(), after a last sample: what is still held); end of input
    ends it, so it never outlives the client."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def start(self, url: str, engine: Engine, headers: dict[str, str] | None = None,
              interval_s: float = SAMPLE_INTERVAL_S, health_url: str | None = None) -> bool:
        """Sampling begun; False where no sampler could be started (the run goes on without a peak)."""
        if self.proc is None or self.proc.poll() is not None:
            try:
                self.proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
            except OSError:
                self.proc = None
                return False
        return self._ask(json.dumps({"url": url, "engine": engine.name, "headers": headers or {},
                                     "interval_s": interval_s, "health_url": health_url})) == "started"

    def stop(self, last: bool = True) -> RunSamples:
        """What the run's samples saw; NaN and 0 where none was taken."""
        answer = self._ask("stop" if last else "cancel")
        try:
            got = json.loads(answer or "{}")
            peak, round_trip = got.get("peak"), got.get("round_trip_ms")
            return RunSamples(math.nan if peak is None else float(peak), int(got.get("samples", 0)),
                              math.nan if round_trip is None else float(round_trip))
        except (ValueError, TypeError, KeyError):
            return RunSamples()

    def _ask(self, line: str) -> str | None:
        if self.proc is None:
            return None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            return self.proc.stdout.readline().strip() or None
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=TIMEOUT_S + 5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def _sample_on_request() -> None:
    """The sampler process (KVSampler): each start line begins a run's samples, each stop ends it."""
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        try:
            asked = json.loads(line)
            samples = UseSamples(asked["url"], ENGINES[asked["engine"]], asked.get("headers"),
                                 float(asked.get("interval_s", SAMPLE_INTERVAL_S)), asked.get("health_url"))
        except (ValueError, KeyError, TypeError):
            print("refused", flush=True)
            continue
        samples.sample()
        print("started", flush=True)
        due = time.monotonic() + samples.interval_s
        while not select.select([sys.stdin], [], [], max(due - time.monotonic(), 0.0))[0]:
            samples.sample()
            due = max(due + samples.interval_s, time.monotonic())
        command = sys.stdin.readline().strip()
        if not command:
            return
        if command == "stop":
            samples.sample()
        print(json.dumps(samples.answer()), flush=True)


class KVWatch:
    """The KV memory of one run: the engine's /metrics families before it (the backend's scrape, shared with the
    engine's clock), its use sampled during it (the backend's KVSampler), the families after it."""

    def __init__(self, url: str, engine: Engine, before: list | None, sampler: KVSampler,
                 headers: dict[str, str] | None = None, interval_s: float = SAMPLE_INTERVAL_S,
                 health_url: str | None = None) -> None:
        self.url, self.engine, self.before, self.headers, self.interval_s = url, engine, before, headers, interval_s
        self.sampler = sampler
        self.sampling = sampler.start(url, engine, headers, interval_s, health_url)
        #: the slowest round trip timed during the run (UseSamples), once finished; NaN where none was
        self.round_trip_ms = math.nan

    def cancel(self) -> None:
        """The run failed or was interrupted: sampling ends, nothing more is asked of the server."""
        if self.sampling:
            self.sampler.stop(last=False)

    def finish(self, after: list | None) -> KVMemory:
        """What the engine said of its memory over the run."""
        seen = self.sampler.stop() if self.sampling else RunSamples()
        self.round_trip_ms = seen.round_trip_ms
        peak, samples = seen.peak, seen.samples
        slots_body = get_text(self.url + "/slots", self.headers)[0] if self.engine.name == "llama-server" else None
        return kv_memory(self.engine, self.before, after, slots_body, peak, samples, self.interval_s)


def watch(url: str, api: str, before: list | None, sampler: KVSampler, headers: dict[str, str] | None = None,
          interval_s: float = SAMPLE_INTERVAL_S, health_url: str | None = None) -> KVWatch | None:
    """A run's KV watch, started, where the engine is one whose memory is read here (engine_for); None otherwise."""
    engine = engine_for(before, api)
    return KVWatch(url, engine, before, sampler, headers, interval_s, health_url) if engine is not None else None


def kv_memory(engine: Engine, before: list | None, after: list | None, slots_body: str | None, peak: float,
              samples: int, interval_s: float) -> KVMemory:
    """The run's figures from the scrapes before and after it and the sampled peak; each one the engine did not
    export is NaN and named in `missing`."""
    missing = []
    capacity = engine.capacity(after or [], slots_body)
    if capacity is None:
        missing.append(VLLM_INFO if engine.name == "vllm" else SGLANG_CAPACITY if engine.name == "sglang" else
                       "/slots n_ctx")
    if math.isnan(peak):
        missing.append(engine.usage_name)
    preempted = retracted = math.nan
    counter = engine.preempted_counter
    if counter is not None:
        now, then = sample_values(after or [], counter), sample_values(before or [], counter)
        if now:
            preempted = sum(now) - sum(then)
            retracted = preempted if engine.name == "sglang" else 0.0
        else:
            missing.append(counter)
    else:  # llama-server frees no running slot's cache for another (update_slots): it never preempts
        preempted = retracted = 0.0
    return KVMemory(engine.source, engine.policy, capacity if capacity is not None else math.nan, peak, preempted,
                    retracted, samples, interval_s, tuple(missing))


if __name__ == "__main__":
    _sample_on_request()

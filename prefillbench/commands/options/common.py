"""What every command's options share: the backend's flags (BackendOptions), the tests a run's flags describe,
the checks more than one command makes, and `note`, the one way a warning reaches stderr."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from strategies import STRATEGIES, compose, make_strategy
from strategies.compose import with_speculation

from prefillbench.backends import backend_class, check_options, choose_backend
from prefillbench.backends.distributed import is_rank_zero
from prefillbench.backends.server.engines import served_cadence_note
from prefillbench.bench.mix import PREFIX as MIX_PREFIX, MixSpec
from prefillbench.bench.sessions import PREFIX as SESSIONS_PREFIX
from prefillbench.bench.workloads import (SessionSpec, TestSpec, TraceReading, load_workload, make_tests, sessions_test,
                                          workload_test)
from prefillbench.bench.slo_pricing import prices_steps
from prefillbench.commands.options.priced import server_refusal
from prefillbench.errors import BackendError, UsageError
from prefillbench.writers import format_for_path


def note(text: str) -> None:
    """A line on stderr about how the input was read; under torchrun, from rank 0 only."""
    if is_rank_zero():
        print(f"prefillbench: {text}", file=sys.stderr)


def unique(values: list[Any] | None, flag: str) -> list[Any] | None:
    """The values in their order, each once; a note names the flag when some were given twice."""
    if values is None:
        return None
    once = list(dict.fromkeys(values))
    if len(once) < len(values):
        twice = [v for i, v in enumerate(once) if values.count(v) > 1]
        shown = ", ".join(",".join(map(str, v)) if isinstance(v, tuple) else str(v) for v in twice)
        note(f"note: {flag} lists {shown} more than once; each value runs once")
    return once


def check_export(path: str | None) -> None:
    if path:
        try:
            format_for_path(path)
        except ValueError as e:
            raise UsageError(str(e)) from None


def check_seed(seed: int) -> None:
    if seed < 0:
        raise UsageError(f"--seed must be 0 or more, got {seed}")


def check_precision(pct: float) -> None:
    """--precision is a percentage of the capacity: 5 means bisect to within 5%."""
    if not 0 < pct < 100:
        raise UsageError(f"--precision is a percentage of the capacity between 0 and 100 (5 means 5%), got {pct:g}")


def check_queue_growth(pct: float) -> None:
    if not pct > 0:
        raise UsageError(f"--max-queue-growth is a percentage above 0 (5 means the wait may grow 5% as fast as time passes), got {pct:g}")


def check_relative_to(strategy: str | None, strategies: list[str], what: str) -> None:
    if strategy and strategy not in strategies:
        raise UsageError(f"--relative-to {strategy}: not among the strategies {what} ({', '.join(strategies)})")


def strategy_names(given: list[str] | None, load: "BackendOptions | None" = None, budgets: list[str] | None = None,
                   cadences: list[str] | None = None, specs: list[str] | None = None) -> list[str]:
    """-s, checked; by default every strategy, or on a serving engine every one it can express. A server already
    running (--url) runs one configuration, its own: -s is refused there, and its one case is the engine's default
    strategy with no budget (the rows name it "as served"). --budget and --cadence compose each -s rules with each
    budget and cadence (strategies/compose.py): one scheduler per combination; --spec adds each speculative decoding
    setting to each (its spec part)."""
    served = load.served_engine() if load is not None else None
    if load is not None and load.url and served is not None:
        if given or budgets or cadences or specs:
            dropped = " ".join(f"{flag} {','.join(v)}" for flag, v in (("-s", given), ("--budget", budgets),
                                                                         ("--cadence", cadences), ("--spec", specs)) if v)
            raise UsageError(f"--url measures the server as it runs; its configuration cannot be changed from here: "
                             f"drop {dropped}")
        return [served.default_strategy]
    names = unique(given, "-s") or (served.listed_strategies if served else list(STRATEGIES))
    if budgets or cadences:
        try:
            names = [compose(name, budget, cadence) for name in names
                     for budget in (unique(budgets, "--budget") or ["fixed"])
                     for cadence in (unique(cadences, "--cadence") or ["every"])]
        except ValueError as e:
            raise UsageError(str(e)) from None
        names = list(dict.fromkeys(names))  # interval:1 is every step: one scheduler, once
    if specs:
        try:
            names = list(dict.fromkeys(with_speculation(name, spec) for name in names for spec in unique(specs, "--spec")))
        except ValueError as e:
            raise UsageError(str(e)) from None
    for name in names:  # an unknown name, a setting it has not, settings that contradict: one line each
        try:
            make_strategy(name)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if served is not None:
        for name in names:
            if prices_steps(name):  # slo-budget: no engine takes a budget per step from outside
                raise server_refusal(name, load.name)
            if not served.expresses(name):
                raise UsageError(str(served.refuse(name)))
            if warning := served_cadence_note(served.name, name):
                note(warning)
    return names


# ---------------------------------------------------------------- the backend


def _backend_option(default: Any, flag: str, option: str, negated: bool = False) -> Any:
    """A field that stands for load option `option` of the backends; `negated`: a --no-X flag for X=False."""
    return field(default=default, metadata={"flag": flag, "option": option, "negated": negated})


#: The backends a disaggregated deployment runs on.
DEPLOYABLE = ("sim", "gguf")


@dataclass
class BackendOptions:
    """What loads the backend: shared by run, capacity and calibrate."""

    model: str | None = None
    backend: str = "auto"
    device: str = _backend_option("auto", "--device", "device")
    # None unless given, so a backend that does not read it can name even `--dtype float32` (the torch default).
    dtype: str | None = _backend_option(None, "--dtype", "dtype")
    threads: int | None = _backend_option(None, "-t", "threads")
    n_gpu_layers: int | None = _backend_option(None, "-ngl", "n_gpu_layers")
    ubatch: int | None = _backend_option(None, "--ubatch", "n_ubatch")
    flash_attn: str | None = _backend_option(None, "-fa", "flash_attn")
    no_cuda_graphs: bool = _backend_option(False, "--no-cuda-graphs", "cuda_graphs", negated=True)
    no_tune_linear: bool = _backend_option(False, "--no-tune-linear", "tune_linear", negated=True)
    compile_decode: bool = _backend_option(False, "--compile", "compile_decode")
    kernels: str = _backend_option("auto", "--kernels", "kernels")
    sim_model: str | None = _backend_option(None, "--sim-model", "sim_model")
    sim_gpu: str | None = _backend_option(None, "--sim-gpu", "sim_gpu")
    sim_link: str | None = _backend_option(None, "--sim-link", "sim_link")
    tp: int = _backend_option(1, "--tp", "tp")
    pp: int = _backend_option(1, "--pp", "pp")
    ep: int = _backend_option(1, "--ep", "ep")
    dp: int = _backend_option(1, "--dp", "dp")
    sim_dtype: str | None = _backend_option(None, "--sim-dtype", "sim_dtype")
    kv_dtype: str | None = _backend_option(None, "--kv-dtype", "kv_dtype")
    sim_pricing: str | None = _backend_option(None, "--sim-pricing", "sim_pricing")
    sim_overheads: str | None = _backend_option(None, "--sim-overheads", "sim_overheads")
    max_num_seqs: int | None = _backend_option(None, "--max-num-seqs", "max_num_seqs")
    kv_cache_tokens: int | None = _backend_option(None, "--kv-cache-tokens", "kv_cache_tokens")
    kv_host_cache: float | None = _backend_option(None, "--kv-host-cache", "kv_host_cache")
    kv_host_link: str | None = _backend_option(None, "--kv-host-link", "kv_host_link")
    hicache_write_policy: str | None = _backend_option(None, "--hicache-write-policy", "hicache_write_policy")
    #: --kv-host-cache with several sizes: one configuration each (0: no host tier); the backend is loaded with none
    kv_host_grid: list[float] = field(default_factory=list)
    calibration: str | None = _backend_option(None, "--calibration", "calibration")
    prefix_cache: str | None = _backend_option(None, "--prefix-cache", "prefix_cache")
    prefix_block: int | None = _backend_option(None, "--prefix-block", "prefix_block")
    trace: str | None = _backend_option(None, "--trace", "trace")
    server_bin: str | None = _backend_option(None, "--server-bin", "server_bin")
    server_cmd: str | None = _backend_option(None, "--server-cmd", "server_cmd")
    engine: str | None = _backend_option(None, "--engine", "engine")
    url: str | None = _backend_option(None, "--url", "url")
    server_timeout: float | None = _backend_option(None, "--server-timeout", "server_timeout")
    # the client of a server backend: its worker processes (N or auto), on Ray, one shard of N, the latencies' origin
    client_workers: str | None = _backend_option(None, "--client-workers", "client_workers")
    client_ray: bool = _backend_option(False, "--client-ray", "client_ray")
    shard: str | None = _backend_option(None, "--shard", "shard")
    latency_from: str | None = _backend_option(None, "--latency-from", "latency_from")
    skip_idle: bool | None = None  # the engine's clock, not a load option: None leaves it to the command (tune --quick)
    # prefill apart from decode (deploy/): the layout, each pool's TP (None: --tp), the KV's link and transfer
    disaggregate: str | None = None
    prefill_tp: int | None = None
    decode_tp: int | None = None
    kv_link: str | None = None
    kv_transfer: str | None = None

    @classmethod
    def pick(cls, flags: dict[str, Any]) -> BackendOptions:
        """The backend's options out of a command's flags (those this class has a field for)."""
        picked = {f.name: flags[f.name] for f in fields(cls) if f.name in flags}
        sizes = picked.get("kv_host_cache")
        if isinstance(sizes, list):  # the flag's list (parsers.host_sizes): one size loads the backend with it
            picked["kv_host_cache"] = (sizes[0] or None) if len(sizes) == 1 else None
            picked["kv_host_grid"] = sizes if len(sizes) > 1 else []
        return cls(**picked)

    def host_sizes(self) -> list[float | None]:
        """The host-tier sizes a grid runs, each a configuration (0: none); [None]: the backend's own, one run."""
        return list(self.kv_host_grid) or [None]

    @property
    def name(self) -> str:
        """The backend that runs: --backend with auto resolved for this model."""
        return choose_backend(self.backend, self.model, self.tp)

    def served_engine(self):
        """The serving engine (backends.server.engines.Engine) of a server backend; None for the others."""
        from prefillbench.backends.server.engines import engine_for

        return engine_for(self.name, self.engine)

    def _given(self) -> list[tuple[Any, Any]]:
        """(field, value) of each option set away from its default."""
        return [(f, getattr(self, f.name)) for f in fields(self) if "option" in f.metadata and getattr(self, f.name) != f.default]

    def load_options(self) -> dict[str, Any]:
        """The load_backend options the flags stand for: only those given, so each backend keeps its own defaults."""
        return {f.metadata["option"]: (not v if f.metadata["negated"] else v) for f, v in self._given()}

    def validate(self) -> None:
        """Refuse what cannot run and warn, once each, about every flag the backend will not use."""
        name = self.name
        if self.server_timeout is not None and not self.server_timeout > 0:
            raise UsageError(f"--server-timeout must be positive, got {self.server_timeout:g}")
        if self.server_timeout is not None and self.url:
            note("warning: --server-timeout is ignored with --url (nothing is launched)")
        if name != "sim" and self.model and Path(self.model).is_dir():
            folder = Path(self.model)
            if not (folder / "config.json").is_file() and not any(folder.glob("*.gguf")):
                raise UsageError(f"-m {self.model}: the folder holds no model (no config.json and no .gguf file)")
        for flag, value in (("--kv-host-link", self.kv_host_link), ("--hicache-write-policy", self.hicache_write_policy)):
            if value is not None and self.kv_host_cache is None and not self.kv_host_grid:
                note(f"warning: {flag} {value} is ignored without --kv-host-cache (no host tier)")
        if self.kv_host_grid and name != "sim":
            raise UsageError(f"--kv-host-cache {','.join(f'{v:g}' for v in self.kv_host_grid)}: a grid of host-tier "
                             f"sizes runs on the sim; the {name} backend has no host tier")
        try:
            ignored = check_options(name, self.load_options())
        except BackendError as e:
            raise UsageError(str(e)) from None
        for f, value in self._given():
            option = f.metadata["option"]
            if option in ignored:
                shown = f.metadata["flag"] if isinstance(value, bool) else f"{f.metadata['flag']} {value}"
                why = f" ({ignored[option]})" if ignored[option] else ""
                note(f"warning: {shown} is ignored by the {name} backend{why}")
        if self.skip_idle and name == "sim":
            note("warning: --skip-idle is ignored by the sim backend (its clock never sleeps)")
        if self.skip_idle and self.served_engine() is not None:
            note(f"warning: --skip-idle is ignored by the {name} backend (a server's requests arrive in real time)")
            self.skip_idle = False

    def deployment(self):
        """--disaggregate and its flags as one validated value (deploy.Disaggregation); None without it."""
        from prefillbench.deploy import Disaggregation

        given = [f for f in ("prefill_tp", "decode_tp", "kv_link", "kv_transfer") if getattr(self, f) is not None]
        if self.disaggregate is None:
            if given:
                raise UsageError(f"--{given[0].replace('_', '-')} sets up a disaggregated deployment: give --disaggregate P:D")
            return None
        if self.name not in DEPLOYABLE:
            raise UsageError(f"--disaggregate runs on {' and '.join(DEPLOYABLE)}, not on the {self.name} backend")
        if self.pp > 1:
            raise UsageError("--disaggregate with --pp: a pool's instances are tensor parallel only")
        if self.kv_host_cache is not None or self.kv_host_grid:
            raise UsageError("--disaggregate with --kv-host-cache: a deployment's pools have no host tier")
        try:
            return Disaggregation.parse(self.disaggregate, self.prefill_tp or self.tp, self.decode_tp or self.tp,
                                        self.kv_link or "nvlink", self.kv_transfer or "whole")
        except ValueError as e:
            raise UsageError(str(e)) from None

    def check_concurrency(self, most: int) -> None:
        """Refuse a -c the backend cannot hold, before loading a model to find out."""
        limit = backend_class(self.name).sequence_limit
        if limit is not None and most > limit:
            raise UsageError(f"-c {most}: the {self.name} backend runs at most {limit} sequences at once")


# ---------------------------------------------------------------- tests


#: The trace-reading flags (cli._trace_reading) and the TraceReading field each sets.
READING_FLAGS = {"trace_format": "format", "time_scale": "time_scale", "token_scale": "token_scale",
                 "trace_first": "first", "trace_span": "span", "trace_max_len": "max_len"}


def trace_reading(flags: dict[str, Any]) -> TraceReading:
    """The trace-reading flags as one validated value."""
    try:
        return TraceReading(**{field: flags[name] for name, field in READING_FLAGS.items() if name in flags})
    except ValueError as e:
        raise UsageError(str(e)) from None


def test_specs(n_prompt: list[int] | None, n_gen: list[int] | None, pg: list[tuple[int, int]] | None,
               arrival: str | None, len_spread: float, workload: str | None,
               reading: TraceReading = TraceReading()) -> list[TestSpec]:
    """-p/-n/--pg with --len-spread, or the one test a --workload file makes, read as `reading` says.

    In an open loop, --pg alone means just that test: pp-only and tg-only requests are not what a server sees.
    """
    try:
        if workload:
            if n_prompt or n_gen or pg or len_spread:
                raise UsageError("--workload gives the lengths: drop -p, -n, --pg and --len-spread")
            if workload.startswith((SESSIONS_PREFIX, MIX_PREFIX)):
                if reading != TraceReading():
                    raise UsageError(f"--workload {workload} makes its own requests: the trace-reading flags do not apply")
                if workload.startswith(SESSIONS_PREFIX):
                    return [sessions_test(SessionSpec.parse(workload))]
                return [workload_test(MixSpec.parse(workload).workload())]  # a seeded mix of length classes (bench/mix.py)
            loaded = load_workload(workload, reading)
            if loaded.dropped:
                note(f"{workload}: {loaded.dropped} requests longer than --trace-max-len {reading.max_len} tokens "
                     f"left out; {len(loaded)} replayed")
            return [workload_test(loaded)]
        if reading != TraceReading():
            given = [f"--{name.replace('_', '-')}" for name, f in READING_FLAGS.items()
                     if getattr(reading, f) != getattr(TraceReading(), f)]
            raise UsageError(f"{', '.join(given)} reads a --workload trace: give one, or drop {given[0]}")
        defaults = not (pg and arrival not in (None, "closed"))
        return make_tests(unique(n_prompt, "-p") or ([512] if defaults else []), unique(n_gen, "-n") or ([128] if defaults else []),
                          unique(pg, "--pg") or [], len_spread)
    except UsageError:
        raise
    except ValueError as e:
        raise UsageError(str(e)) from None


def workload_requests(test: TestSpec, asked: int | None) -> int | None:
    """A probe's requests where a trace gives them: all of its rows (its lengths, at the probe's arrival rate), or
    every turn of the sessions; --requests then is not used, and said so. None: neither."""
    if test.sessions is not None:
        n = test.sessions.n * test.sessions.turns
        if asked is not None and asked != n:
            note(f"warning: --requests {asked} is ignored: each probe runs the workload's {test.sessions.n} sessions "
                 f"of {test.sessions.turns} turns (sessions:n=N sets how many)")
        return n
    if test.workload is None:
        return None
    if asked is not None and asked != len(test.workload):
        note(f"warning: --requests {asked} is ignored: each probe replays the trace's {len(test.workload)} requests "
             "at its rate (--trace-first N keeps fewer)")
    return len(test.workload)


def request_shape(pg: list[tuple[int, int]] | None, workload: str | None) -> list[tuple[int, int]]:
    """capacity's and tune's --pg: 512,128 unless given, or none with a --workload, which gives the lengths."""
    return pg or ([] if workload else [(512, 128)])


class Measuring:
    """What run and capacity share: options built around the backend they load, and requests made from a seed."""

    load: BackendOptions
    seed: int
    len_spread: float
    workload: str | None
    reading: TraceReading

    @classmethod
    def from_flags(cls, **flags: Any) -> Any:
        own = {f.name for f in fields(cls) if f.init} - {"load"}  # type: ignore[arg-type]
        own.discard("reading")
        options = cls(BackendOptions.pick(flags), **{k: v for k, v in flags.items() if k in own},  # type: ignore[call-arg]
                      reading=trace_reading(flags))
        options.validate()
        return options

    def validate(self) -> None:
        raise NotImplementedError

    def searched_test(self, pg: list[tuple[int, int]] | None, arrival: str, command: str,
                      sessions: bool = False) -> TestSpec:
        """capacity's and tune's one test: --pg (512,128 unless given) or a --workload trace, its prefix cache
        settled; multi-turn sessions where `sessions` (capacity searches the rate sessions start at), else refused."""
        tests = test_specs(None, None, request_shape(pg, self.workload), arrival, self.len_spread, self.workload,
                           self.reading)
        self.settle_prefix_cache(tests)
        if len(tests) != 1:
            raise UsageError(f"{command} searches one test: give one --pg or a --workload")
        if tests[0].sessions is not None and not sessions:
            raise UsageError(f"{command} searches a rate of independent requests; multi-turn sessions run with "
                             "`prefillbench capacity` (the rate sessions start at) or `prefillbench run --workload "
                             "sessions:... --arrival poisson --rate R`")
        return tests[0]

    def settle_prefix_cache(self, tests: list[TestSpec]) -> None:
        """--prefix-cache unless given: on where the workload's prompts share prefixes (a trace with block ids)
        and the backend has a cache, off elsewhere, so a workload of random prompts measures what it always did."""
        if self.load.prefix_cache is not None:
            return
        shared = any((t.workload is not None and t.workload.blocks is not None) or t.sessions is not None for t in tests)
        if not shared:
            return
        if "prefix_cache" in backend_class(self.load.name).options:
            self.load.prefix_cache = "on"
            note("prefix cache on: the workload's prompts share prefixes (--prefix-cache off computes every prompt whole)")
        else:
            note(f"the {self.load.name} backend has no prefix cache here: every prompt is computed whole")

    def workload_settings(self) -> dict[str, Any]:
        """What made the requests, for the export's metadata (arrival, rate and SLO are columns of every row)."""
        settings = {"seed": self.seed, "len_spread": self.len_spread, "workload": self.workload or ""}
        if self.workload:
            r = self.reading
            settings |= {"trace_format": r.format, "trace_time_scale": r.time_scale, "trace_token_scale": r.token_scale,
                         "trace_first": r.first or "", "trace_span_s": r.span or "", "trace_max_len": r.max_len or ""}
        return settings

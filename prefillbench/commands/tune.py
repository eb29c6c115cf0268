"""`prefillbench tune`: which scheduler and token budget hold the most load within an SLO.

On the sim the whole grid is searched there. On a real backend the sim carries the search: it is
calibrated on the backend (or read from --calibration), searches every configuration on the same seeded
traces the backend will replay, and the backend then measures only the sim's top K and sequential,
each search starting at the sim's prediction. `--no-sim` measures every configuration; `--sim-only`
stops at the prediction.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from strategies import STRATEGIES

from prefillbench.backends.base import Backend, BackendError
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.calibration import calibrate, calibration_specs, load_calibration
from prefillbench.bench import tune
from prefillbench.bench.capacity import DEFAULT_MAX_SCHED_DELAY_MS, DEFAULT_REQUESTS, DEFAULT_REQUESTS_SIM, Criteria, Probe
from prefillbench.bench.workloads import TestSpec
from prefillbench.commands.calibrate import sim_specs_for
from prefillbench.report import tune as report
from prefillbench.report import tune_plots
from prefillbench.report.tables import check_writable

#: Sarathi-Serve's budgets around its 512 (and vLLM's 2048 default): 128 to 4096.
DEFAULT_BUDGETS = [128, 256, 512, 1024, 2048, 4096]
DEFAULT_TOP_K = 3
#: --quick on a real backend: short requests and few of them, one seed, a coarse precision; about 15 minutes
#: for the shipped model on a 2-core CPU.
QUICK = dict(pg=(256, 32), slo="tbt=300", requests=20, precision=10.0, budgets=[32, 64, 128, 256], top_k=2,
             strategies=["sequential", "chunked", "sarathi-serve", "packed"])
#: Below this many simulated requests in all a pool of processes costs more than it saves.
POOL_MIN_REQUESTS = 5000


class TuneError(ValueError):
    """Bad input: one line, exit 2."""


@dataclass
class TuneOptions:
    load: Callable[[Any], Backend]  # loads a backend from `backend_args` (cli's loader)
    backend_args: Any  # the model and backend flags, as `run` takes them
    pg: tuple[int, int] | None = None
    len_spread: float = 0.0
    workload_test: TestSpec | None = None  # from --workload
    strategies: list[str] | None = None
    budgets: list[int] | None = None
    concurrency: int = 0
    seed: int = 42
    warmup: bool = True
    slo: str | None = None
    percentile: float = 99.0
    max_sched_delay: float = DEFAULT_MAX_SCHED_DELAY_MS
    requests: int | None = None
    precision: float = 5.0  # percent
    start_rate: float = 1.0
    arrival: str = "poisson"
    burstiness: float = 1.0
    repeats: int | None = None
    top_k: int = DEFAULT_TOP_K
    no_sim: bool = False
    sim_only: bool = False
    calibration: str | None = None
    time_budget: float | None = None  # seconds
    quick: bool = False
    jobs: int | None = None
    output: str = "md"
    export: str | None = None
    plot: str | None = None
    progress: bool = True
    out: Any = field(default=None)  # stdout, replaceable in tests
    err: Any = field(default=None)


def _settings(o: TuneOptions, on_sim: bool) -> tuple[TestSpec, list[Criteria], tune.TuneSettings]:
    if o.slo is None:
        raise TuneError("tune needs --slo, e.g. --slo tbt=100 (P99 time between tokens within 100 ms)")
    try:
        slos = tune.parse_slo_list(o.slo)
        criteria = [Criteria.from_slo(s, o.max_sched_delay, o.percentile) for s in slos]
    except ValueError as e:
        raise TuneError(f"--slo: {e}") from None
    if not 0 < o.precision < 100:
        raise TuneError(f"--precision is a percentage of the capacity between 0 and 100 (5 means 5%), got {o.precision:g}")
    test = o.workload_test or TestSpec(*(o.pg or (512, 128)), spread=o.len_spread)
    requests = o.requests if o.requests is not None else (DEFAULT_REQUESTS_SIM if on_sim else DEFAULT_REQUESTS)
    repeats = o.repeats if o.repeats is not None else (3 if on_sim else 1)
    settings = tune.TuneSettings(test, criteria, requests, o.concurrency, o.arrival, o.burstiness, o.seed,
                                 repeats, o.start_rate, o.precision / 100, o.warmup)
    settings.capacity_config(criteria[0])  # validates requests, arrival, precision
    return test, criteria, settings


def _apply_quick(o: TuneOptions) -> None:
    o.pg = o.pg or QUICK["pg"]
    o.slo = o.slo or QUICK["slo"]
    o.requests = QUICK["requests"] if o.requests is None else o.requests
    o.precision = QUICK["precision"] if o.precision == 5.0 else o.precision
    o.budgets = o.budgets or QUICK["budgets"]
    o.strategies = o.strategies or QUICK["strategies"]
    o.top_k = QUICK["top_k"] if o.top_k == DEFAULT_TOP_K else o.top_k


class ProbeProgress:
    """A bar over probes: its total is the probes done plus the configurations left times the mean so far."""

    def __init__(self, enabled: bool, n_searches: int, expected: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("probes"),
                            TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
                            disable=not enabled, transient=True)
        self.left, self.expected, self.probes, self.finished = n_searches, expected, 0, 0
        self.task = self.bar.add_task("", total=n_searches * expected)

    def stage(self, name: str, n_searches: int, expected: int) -> None:
        self.left, self.expected, self.probes, self.finished = n_searches, expected, 0, 0
        self.bar.reset(self.task, total=n_searches * expected, description=name)

    def probe(self, config: tune.Config, index: int, p: Probe) -> None:
        self.probes += 1
        self.bar.update(self.task, advance=1, description=f"{config.label} {p.rate:.3g} req/s")

    def config_done(self, n_criteria: int) -> None:
        self.finished += n_criteria
        mean = self.probes / max(self.finished, 1)
        self.bar.update(self.task, total=self.probes + max(self.left - self.finished, 0) * mean)


def run_tune(o: TuneOptions) -> int:
    out, err = o.out or sys.stdout, o.err or sys.stderr
    if o.quick:
        _apply_quick(o)
    if o.no_sim and o.sim_only:
        raise TuneError("--no-sim and --sim-only exclude each other")
    if o.top_k < 1:
        raise TuneError(f"--top-k must be at least 1, got {o.top_k}")
    strategies = list(dict.fromkeys(o.strategies or list(STRATEGIES)))
    for name in strategies:
        if name not in STRATEGIES:
            raise TuneError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    on_sim = getattr(o.backend_args, "backend", None) == "sim"
    test, criteria, settings = _settings(o, on_sim)
    configs = tune.grid(strategies, o.budgets or DEFAULT_BUDGETS)
    for path in (o.export,):
        if path:
            if not path.endswith((".json", ".csv")):
                raise TuneError(f"--export writes .json or .csv, not {path}")
            check_writable(path)
    backend = o.load(o.backend_args)
    if test.max_seq_len > backend.context_length:
        raise TuneError(f"a request needs {test.max_seq_len} positions but the model's context is {backend.context_length}")
    jobs = o.jobs or min(2, os.cpu_count() or 1)
    bar = ProbeProgress(o.progress, len(configs) * len(criteria), settings.expected_probes)
    deadline = time.monotonic() + o.time_budget if o.time_budget else None

    def stage(b: Backend, chosen: list[tune.Config], name: str) -> tune.GridResult:
        bar.stage(name, len(chosen) * len(criteria), settings.expected_probes)
        pool = jobs if b.name == "sim" and settings.requests * len(chosen) >= POOL_MIN_REQUESTS else 1
        return tune.run_grid(b, chosen, settings, bar.probe, lambda c: bar.config_done(len(criteria)), None,
                             deadline if b.name != "sim" else None, "sim" if b.name == "sim" else "measured", pool)

    predicted: tune.GridResult | None = None
    measured: tune.GridResult | None = None
    try:
        with bar.bar:
            if on_sim or o.no_sim:
                measured = stage(backend, configs, "measuring" if not on_sim else "sim")
            else:
                sim = _calibrated_sim(o, backend, err)
                predicted = stage(sim, configs, "sim")
                if not o.sim_only and not predicted.stopped:
                    bar.stage("measuring", o.top_k + 1, tune.EXPECTED_NEAR_PROBES * settings.repeats)
                    measured = tune.measure_picks(
                        backend, predicted.results, settings, o.top_k, bar.probe, lambda c: bar.config_done(len(criteria)),
                        deadline, lambda picks: print(f"prefillbench: measuring the sim's top {o.top_k} and sequential on "
                                                      f"{backend.label}: {', '.join(c.label for c in picks)}", file=err))
    except BackendError as e:
        raise TuneError(str(e)) from None
    return _report(o, out, err, settings, criteria, predicted, measured, backend)


def _calibrated_sim(o: TuneOptions, real: Backend, err) -> SimBackend:
    if o.calibration:
        cal = load_calibration(o.calibration)
        print(f"prefillbench: the sim calibrated by {o.calibration}", file=err)
    else:
        args = o.backend_args
        spec, nominal = sim_specs_for(real, getattr(args, "model", None), getattr(args, "sim_model", None),
                                      getattr(args, "sim_gpu", None))
        print(f"prefillbench: calibrating the sim on {real.label} (a quick sweep; --calibration FILE skips it)", file=err)
        cal = calibrate(real, spec, nominal, quick=True)
    model, gpu = calibration_specs(cal)
    return SimBackend(model, gpu, calibration=cal, calibration_path=o.calibration or "this run's calibration")


def _report(o: TuneOptions, out, err, settings: tune.TuneSettings, criteria: list[Criteria],
            predicted: tune.GridResult | None, measured: tune.GridResult | None, backend: Backend) -> int:
    tokens = settings.tokens_per_request
    final = measured if measured is not None else predicted
    assert final is not None
    pred = predicted.results if predicted is not None and measured is not None else None
    everything = (predicted.results if predicted is not None else []) + (measured.results if measured is not None else [])
    for k in criteria:
        rows = tune.by_criteria(final.results, k)
        if not rows:
            continue
        if o.output == "md":
            if len(criteria) > 1:
                print(f"\n{k.describe()}:", file=out)
            out.write(report.render_ranked(rows, tokens, pred))
        print(report.verdict(rows, k, pred), file=out if o.output == "md" else err)
        if pred:
            for line in report.stage_notes(tune.by_criteria(pred, k), rows):
                print(line, file=out if o.output == "md" else err)
    if o.output != "md":
        frame = pd.DataFrame(report.config_records(final.results, tokens))
        out.write(frame.to_csv(index=False) if o.output == "csv" else frame.to_json(orient="records", indent=1) + "\n")
    if len(criteria) > 1 and o.output == "md":
        print("\ncapacity (req/s) against the SLO:", file=out)
        out.write(report.render_vs_slo(final.results, criteria))
    meta = {"backend": backend.label, "model": backend.model_name, "test": settings.test.name,
            "requests_per_probe": settings.requests, "seeds": settings.seeds, "precision": settings.precision,
            "arrival": settings.arrival, "slo": [k.describe() for k in criteria],
            "max_sched_delay_ms": criteria[0].sched_delay_p50_ms, "percentile": criteria[0].percentile}
    if o.export:
        for path in report.export(o.export, everything, tokens, meta):
            print(f"prefillbench: wrote {path}", file=err)
    if o.plot and final.results:
        for path in tune_plots.write(final.results, criteria[0], o.plot):
            print(f"prefillbench: wrote {path}", file=err)
    out.flush()
    stopped = [g for g in (predicted, measured) if g is not None and g.stopped]
    for g in stopped:
        left = ", ".join(c.label for c in g.left)
        print(f"prefillbench: {g.stopped}; kept {len(g.results)} configuration result(s) and their probes"
              + (f"; not finished: {left}" if left else ""), file=err)
    if any(g.stopped == "interrupted" for g in stopped):
        return 130
    return 0

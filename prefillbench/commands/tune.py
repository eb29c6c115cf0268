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

import pandas as pd

from prefillbench.backends.base import Backend, BackendError
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.calibration import at_speed, calibrate, calibration_specs, load_calibration, workload_points
from prefillbench.bench import sim_first, tune
from prefillbench.bench.capacity import Criteria, Probe
from prefillbench.bench.pricing import pricer
from prefillbench.commands.calibrate import sim_specs_for
from prefillbench.commands.options import TuneOptions
from prefillbench.commands.runner import open_backend
from prefillbench.errors import UsageError
from prefillbench.report import tune as report
from prefillbench.report import tune_plots
from prefillbench.report.tables import check_writable

#: Below this many simulated requests in all a pool of processes costs more than it saves.
POOL_MIN_REQUESTS = 5000


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
    settings, criteria, configs, on_sim = o.settings, o.criteria, o.configs, o.on_sim
    test = settings.test
    if o.export:
        check_writable(o.export)
    backend = open_backend(o.load)
    if test.max_seq_len > backend.context_length:
        raise UsageError(f"a request needs {test.max_seq_len} positions but the model's context is {backend.context_length}")
    jobs = o.jobs or min(2, os.cpu_count() or 1)
    bar = ProbeProgress(not o.no_progress, len(configs) * len(criteria), settings.expected_probes)
    deadline = time.monotonic() + o.time_budget if o.time_budget else None

    def pool(b: Backend, chosen: list[tune.Config]) -> int:
        return jobs if b.name == "sim" and settings.requests * len(chosen) >= POOL_MIN_REQUESTS else 1

    def stage(b: Backend, chosen: list[tune.Config], name: str) -> tune.GridResult:
        bar.stage(name, len(chosen) * len(criteria), settings.expected_probes)
        return tune.run_grid(b, chosen, settings, bar.probe, lambda c: bar.config_done(len(criteria)), None,
                             deadline if b.name != "sim" else None, "sim" if b.name == "sim" else "measured",
                             pool(b, chosen))

    predicted: tune.GridResult | None = None
    measured: tune.GridResult | None = None
    repredicted: list[tune.ConfigResult] = []
    edge: tune.GridResult | None = None  # the sim's picks with every step slower (sim_first.slowed)
    try:
        with bar.bar:
            if on_sim or o.no_sim:
                measured = stage(backend, configs, "measuring" if not on_sim else "sim")
            else:
                cal = _calibration(o, backend, err)
                sim = _sim(o, cal)
                predicted = stage(sim, configs, "sim")
                if not predicted.stopped:
                    # How sure: the grid again on the sim with every step 10% longer; the picks are ranked by what
                    # each keeps there (sim_first.margin_ranked), and a capacity that falls off a cliff is at the edge.
                    bar.stage(f"sim {sim_first.EDGE_SLOWDOWN - 1:.0%} slower", len(configs) * len(criteria),
                              tune.EXPECTED_NEAR_PROBES * settings.repeats)
                    edge = sim_first.slowed(lambda slowdown: _sim(o, at_speed(cal, slowdown)), predicted.results,
                                            configs, settings, on_probe=bar.probe, jobs=pool(sim, configs))
                if not o.sim_only and not predicted.stopped and not (edge and edge.stopped):
                    bar.stage("measuring", o.top_k + 1, tune.EXPECTED_NEAR_PROBES * settings.repeats)
                    measured = sim_first.measure_picks(
                        backend, predicted.results, settings, o.top_k, bar.probe, lambda c: bar.config_done(len(criteria)),
                        deadline, lambda picks: print(f"prefillbench: measuring the sim's top {o.top_k} and sequential on "
                                                      f"{backend.label}: {', '.join(c.label for c in picks)}", file=err),
                        price=pricer(sim.cost), slower=edge.results)
                    if measured.stopped != "interrupted":
                        repredicted = sim_first.repredict(lambda slowdown: _sim(o, at_speed(cal, slowdown)), predicted.results,
                                                     measured.results, settings)
    except BackendError as e:
        raise UsageError(str(e)) from None
    return _report(o, out, err, settings, criteria, predicted, measured, backend, repredicted, edge)


def _calibration(o: TuneOptions, real: Backend, err) -> dict:
    if o.calibration:
        cal = load_calibration(o.calibration)
        print(f"prefillbench: the sim calibrated by {o.calibration}", file=err)
        return cal
    spec, nominal = sim_specs_for(real, o.load.model, o.sim_model, o.sim_gpu)
    print(f"prefillbench: calibrating the sim on {real.label} (a quick sweep and this workload's step shapes; "
          f"--calibration FILE skips it)", file=err)
    test = o.settings.test
    budgets = sorted({c.budget for c in o.configs if c.budget})
    return calibrate(real, spec, nominal, quick=True,
                     extra=workload_points(test.n_prompt, test.n_gen, budgets, min(real.context_length, spec.max_context)))


def _sim(o: TuneOptions, cal: dict) -> SimBackend:
    model, gpu = calibration_specs(cal)
    return SimBackend(model, gpu, calibration=cal, calibration_path=o.calibration or "this run's calibration")


def _report(o: TuneOptions, out, err, settings: tune.TuneSettings, criteria: list[Criteria],
            predicted: tune.GridResult | None, measured: tune.GridResult | None, backend: Backend,
            repredicted: list[tune.ConfigResult], edge: tune.GridResult | None) -> int:
    tokens = settings.tokens_per_request
    slower = edge.results if edge is not None else []
    final = measured if measured is not None else predicted
    assert final is not None
    pred = predicted.results if predicted is not None and measured is not None else None
    everything = ((predicted.results if predicted is not None else []) + (measured.results if measured is not None else [])
                  + repredicted + slower)
    for k in criteria:
        rows = tune.by_criteria(final.results, k)
        if not rows:
            continue
        if o.output == "md":
            if len(criteria) > 1:
                print(f"\n{k.describe()}:", file=out)
            out.write(report.render_ranked(rows, tokens, pred, repredicted, slower))
        print(report.verdict(rows, k, pred, repredicted, slower), file=out if o.output == "md" else err)
        notes = report.stage_notes(tune.by_criteria(pred, k), rows, tune.by_criteria(repredicted, k)) if pred else []
        if predicted is not None:
            notes += report.edge_notes(tune.by_criteria(predicted.results, k), tune.by_criteria(slower, k))
        for line in notes:
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
            "max_sched_delay_ms": criteria[0].sched_delay_p50_ms, "percentile": criteria[0].percentile,
            "skip_idle": backend.skip_idle}
    if o.export:
        for path in report.export(o.export, everything, tokens, meta):
            print(f"prefillbench: wrote {path}", file=err)
    if o.plot and final.results:
        for path in tune_plots.write(final.results, criteria[0], o.plot):
            print(f"prefillbench: wrote {path}", file=err)
    out.flush()
    stopped = [g for g in (predicted, edge, measured) if g is not None and g.stopped]
    for g in stopped:
        left = ", ".join(c.label for c in g.left)
        print(f"prefillbench: {g.stopped}; kept {len(g.results)} configuration result(s) and their probes"
              + (f"; not finished: {left}" if left else ""), file=err)
    if any(g.stopped == "interrupted" for g in stopped):
        return 130
    return 0

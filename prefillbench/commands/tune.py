"""`prefillbench tune`: which scheduler and token budget hold the most load within an SLO.

On the sim the whole grid is searched there. On a real backend the sim carries the search: it is
calibrated on the backend (a serving engine by its probes, bench.server_probes; or read from
--calibration), searches every configuration on the same seeded traces the backend will replay, and the backend then measures only the sim's top K and sequential,
each search starting at the sim's prediction. `--no-sim` measures every configuration; `--sim-only`
stops at the prediction.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from prefillbench.backends import load_backend
from prefillbench.backends.base import Backend, ServingBackend
from prefillbench.backends.distributed import is_rank_zero
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.calibration import at_speed, calibrate, calibration_specs, load_calibration, workload_points
from prefillbench.bench import halving, server_probes, sim_first, slo_pricing, tune
from prefillbench.bench.capacity import Criteria, Probe, SearchResult
from prefillbench.bench.pricing import pricer
from prefillbench.commands.calibrate import probe_server, sim_specs_for
from prefillbench.commands.options import TuneOptions
from prefillbench.commands.session import Output, Progress, Session, open_session
from prefillbench.errors import UsageError
from prefillbench.report import adaptive, spec_verdict
from prefillbench.report import tune as report
from prefillbench.report import tune_plots
from prefillbench.writers import csv_text, json_text

#: Below this many simulated requests in all a pool of processes costs more than it saves.
POOL_MIN_REQUESTS = 5000


class ProbeProgress:
    """The session's bar over probes: its total is the probes done plus the configurations left times the mean so far."""

    def __init__(self, progress: Progress, n_searches: int, expected: int) -> None:
        self.progress = progress
        self.stage("", n_searches, expected)

    def stage(self, name: str, n_searches: int, expected: int) -> None:
        self.left, self.expected, self.probes, self.finished = n_searches, expected, 0, 0
        self.progress.restart(n_searches * expected, name)

    def probe(self, config: tune.Config, index: int, p: Probe) -> None:
        self.probes += 1
        self.progress.advance(1)
        self.progress.describe(f"{config.label} {p.rate:.3g} req/s")

    def config_done(self, n_criteria: int) -> None:
        self.finished += n_criteria
        mean = self.probes / max(self.finished, 1)
        self.progress.resize(self.probes + max(self.left - self.finished, 0) * mean)


@dataclass
class Stages:
    """What each stage has found so far; the export is written from it after every configuration."""

    predicted: tune.GridResult | None = None
    edge: tune.GridResult | None = None  # the grid with every step slower (sim_first.slowed)
    measured: tune.GridResult | None = None
    repredicted: list[tune.ConfigResult] = field(default_factory=list)
    #: the configurations successive halving dropped, as its short round found them (stage "short"): in the export,
    #: not the table, so that a report has every configuration of the grid
    dropped: list[tune.ConfigResult] = field(default_factory=list)

    def grids(self) -> list[tune.GridResult]:
        return [g for g in (self.predicted, self.edge, self.measured) if g is not None]


def run_tune(o: TuneOptions) -> int:
    out, err = o.out or sys.stdout, o.err or sys.stderr
    if not is_rank_zero():  # under torchrun every rank measures; rank 0 alone prints (the session writes)
        out = err = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    settings, criteria, configs, on_sim = o.settings, o.criteria, o.configs, o.on_sim
    test = settings.test
    tokens = settings.tokens_per_request
    outputs = [Output(Path(o.export), lambda path, results, meta: report.export(path, results, tokens, meta))] if o.export else []
    session = open_session(o.load, outputs, test=settings.test.name, requests_per_probe=settings.requests,
                           seeds=settings.seeds, precision=settings.precision, arrival=settings.arrival,
                           slo=[k.describe() for k in criteria], max_sched_delay_ms=criteria[0].sched_delay_p50_ms,
                           percentile=criteria[0].percentile)
    backend = session.backend
    if test.max_seq_len > backend.context_length:
        raise UsageError(f"a request needs {test.max_seq_len} positions but the model's context is {backend.context_length}")
    jobs = o.jobs or min(2, os.cpu_count() or 1)
    deadline = time.monotonic() + o.time_budget if o.time_budget else None
    found = Stages()

    def pool(b: Backend, chosen: list[tune.Config]) -> int:
        return jobs if b.name == "sim" and settings.requests * len(chosen) >= POOL_MIN_REQUESTS else 1

    under_way: dict[tuple[tune.Config, int], list[Probe]] = {}  # a real backend's probes of unfinished configurations

    def config_done(config: tune.Config, results: list[tune.ConfigResult]) -> None:
        bar.config_done(len(criteria))
        for index in range(len(criteria)):
            under_way.pop((config, index), None)
        session.keep(*results)

    def measured_probe(config: tune.Config, index: int, p: Probe) -> None:
        """On a real backend every probe is seconds of work: each one is written as it finishes."""
        bar.probe(config, index, p)
        under_way.setdefault((config, index), []).append(p)
        session.save(pending=[tune.ConfigResult(c, criteria[i], [SearchResult.partial(ps)], "measured", settings.repeats)
                              for (c, i), ps in under_way.items()])

    def stage(b: Backend, chosen: list[tune.Config], name: str) -> tune.GridResult:
        hints = None
        if on_sim and not o.full_grid:  # successive halving (halving.py): a grid of HALVING_FROM or more
            bar.stage("short probes", len(chosen) * len(criteria), settings.expected_probes)
            halved = halving.halve(b, chosen, settings, pool(b, chosen))
            if said := halved.describe(halving.short_settings(settings).requests):
                print(f"prefillbench: {said}", file=err)
            chosen, hints = halved.kept, halved.hints
            if halved.short is not None:
                dropped = [replace(r, stage="short") for r in halved.short.results if r.config in halved.dropped]
                found.dropped += dropped
                session.keep(*dropped)  # written now: an interrupted grid keeps them
        bar.stage(name, len(chosen) * len(criteria), settings.expected_probes)
        return ended(tune.run_grid(b, chosen, settings, bar.probe if b.name == "sim" else measured_probe, config_done, hints,
                                   deadline if b.name != "sim" else None, "sim" if b.name == "sim" else "measured",
                                   pool(b, chosen)))

    def ended(grid: tune.GridResult) -> tune.GridResult:
        session.stop(grid.stopped == "interrupted", grid.failure)
        return grid

    adaptive_grid = any(slo_pricing.prices_steps(c.strategy) for c in configs)

    def priced_by(pricing: slo_pricing.StepPricing | None) -> tune.TuneSettings:
        """The settings with what slo-budget prices its steps by, said once per SLO."""
        for k in criteria if pricing is not None else []:
            print(f"prefillbench: {pricing.describe(k.tbt_p99_ms, k.tpot_ms, k.percentile)}", file=err)
        return replace(settings, pricing=pricing)

    if adaptive_grid and (on_sim or o.no_sim):
        settings = priced_by(slo_pricing.run_pricing(backend, o.load.calibration if on_sim else o.calibration))
    with session.measuring(len(configs) * len(criteria) * settings.expected_probes, not o.no_progress, "probes") as progress:
        bar = ProbeProgress(progress, len(configs) * len(criteria), settings.expected_probes)
        if on_sim or o.no_sim:
            found.measured = stage(backend, configs, "measuring" if not on_sim else "sim")
        else:
            cal = _calibration(o, backend, err)
            sim = _sim(o, cal)
            if adaptive_grid:  # priced by the calibration the sim carries, on the sim and on the backend alike
                source = f"calibration {o.calibration}" if o.calibration else "this run's calibration sweep"
                settings = priced_by(slo_pricing.of_sim(sim, cal, source))
            found.predicted = stage(sim, configs, "sim")
            if not found.predicted.stopped:
                # How sure: the grid again on the sim with every step 10% longer; the picks are ranked by what
                # each keeps there (sim_first.margin_ranked), and a capacity that falls off a cliff is at the edge.
                bar.stage(f"sim {sim_first.EDGE_SLOWDOWN - 1:.0%} slower", len(configs) * len(criteria),
                          tune.EXPECTED_NEAR_PROBES * settings.repeats)
                found.edge = ended(sim_first.slowed(lambda slowdown: _sim(o, at_speed(cal, slowdown)), found.predicted.results,
                                                    configs, settings, on_probe=bar.probe, jobs=pool(sim, configs)))
                session.keep(*found.edge.results)
            if not o.sim_only and not found.predicted.stopped and not found.edge.stopped:
                bar.stage("measuring", o.top_k + 1, tune.EXPECTED_NEAR_PROBES * settings.repeats)
                found.measured = ended(sim_first.measure_picks(
                    backend, found.predicted.results, settings, o.top_k, measured_probe, config_done, deadline,
                    lambda picks: print(f"prefillbench: measuring the sim's top {o.top_k} and {settings.baseline_name}"
                                        + (" (and slo-budget beside the sim's best fixed budget)" if adaptive_grid else "")
                                        + f" on {backend.label}: {', '.join(c.label for c in picks)}", file=err),
                    price=pricer(sim.cost), slower=found.edge.results))
                if found.measured.stopped != "interrupted":
                    found.repredicted = sim_first.repredict(lambda slowdown: _sim(o, at_speed(cal, slowdown)),
                                                            found.predicted.results, found.measured.results, settings)
    # Every result, the partial ones of a stage that stopped included, in stage order: the export's final form.
    session.results = [r for g in (found.predicted, found.measured) if g is not None for r in g.results] + \
        found.repredicted + (found.edge.results if found.edge is not None else []) + found.dropped
    session.save()
    if found.measured is None and found.predicted is None:  # stopped before any grid (the calibration)
        return session.ending("configuration result(s)")
    return _report(o, out, err, settings, criteria, found, session)


def _calibration(o: TuneOptions, real: Backend, err) -> dict:
    if o.calibration:
        cal = load_calibration(o.calibration)
        print(f"prefillbench: the sim calibrated by {o.calibration}", file=err)
        return cal
    test = o.settings.test
    budgets = sorted({c.budget for c in o.configs if c.budget})
    stepped = real
    if isinstance(real, ServingBackend) and o.calibrate_on != "gguf":
        # A server is calibrated on itself: probes whose steps are known, this workload's prompt and budgets among
        # them, then the sim predicts the server's own scheduling with the server's own step times.
        plan = server_probes.plan(quick=True, prompt=test.n_prompt, n_gen=test.n_gen, budgets=tuple(budgets),
                                  context=real.context_length)
        cal = probe_server(real, plan, o.load.model, o.sim_model, o.sim_gpu, err)
        held = cal["held_out_abs_error"]
        print(f"prefillbench: the sim's fit on {real.label}'s probes: median error {cal['median_abs_error']:.1%}; "
              f"held out, {cal['probes']['held_out']}: " + (f"{held:.1%}" if held is not None else "no sample")
              + " (prefillbench calibrate --backend server lists every probe)", file=err)
        return cal
    if isinstance(real, ServingBackend):
        # --calibrate-on gguf: the proxy, the gguf backend stepping the same llama.cpp on the same model, whose
        # calibration then predicts the server's own scheduling of it.
        stepped = load_backend("gguf", o.load.model, threads=real.threads)
    spec, nominal = sim_specs_for(stepped, o.load.model, o.sim_model, o.sim_gpu)
    print(f"prefillbench: calibrating the sim on {stepped.label} (a quick sweep and this workload's step shapes; "
          f"--calibration FILE skips it)", file=err)
    try:
        return calibrate(stepped, spec, nominal, quick=True,
                         extra=workload_points(test.n_prompt, test.n_gen, budgets,
                                               min(stepped.context_length, spec.max_context)))
    finally:
        if stepped is not real:
            stepped.close()


def _sim(o: TuneOptions, cal: dict) -> SimBackend:
    model, gpu = calibration_specs(cal)
    return SimBackend(model, gpu, calibration=cal, calibration_path=o.calibration or "this run's calibration")


def _report(o: TuneOptions, out, err, settings: tune.TuneSettings, criteria: list[Criteria], found: Stages,
            session: Session) -> int:
    tokens = settings.tokens_per_request
    predicted, measured, repredicted = found.predicted, found.measured, found.repredicted
    slower = found.edge.results if found.edge is not None else []
    # The measured stage's table where it measured anything; the sim's where it stopped before its first result.
    final = measured if measured is not None and (measured.results or predicted is None) else predicted
    assert final is not None
    pred = predicted.results if predicted is not None and final is measured else None
    for k in criteria:
        rows = tune.by_criteria(final.results, k)
        if not rows:
            continue
        if o.output == "md":
            if len(criteria) > 1:
                print(f"\n{k.describe()}:", file=out)
            out.write(report.render_ranked(rows, tokens, pred, repredicted, slower, o.verbose, settings.baseline,
                                           settings.baseline_name))
        print(report.verdict(rows, k, pred, repredicted, slower, settings.baseline, settings.baseline_name),
              file=out if o.output == "md" else err)
        for line in adaptive.against_fixed(rows):  # slo-budget beside the best fixed budget
            print(line, file=out if o.output == "md" else err)
        for line in spec_verdict.spec_lines(rows):  # --spec: each draft length beside speculation off
            print(line, file=out if o.output == "md" else err)
        notes = report.stage_notes(tune.by_criteria(pred, k), rows, tune.by_criteria(repredicted, k)) if pred and o.verbose else []
        if predicted is not None and o.verbose:
            notes += report.edge_notes(tune.by_criteria(predicted.results, k), tune.by_criteria(slower, k))
        for line in notes:
            print(line, file=out if o.output == "md" else err)
    if o.output != "md":
        records = report.config_records(final.results, tokens)
        out.write(csv_text(records) if o.output == "csv" else json_text(records, indent=1))
    if len(criteria) > 1 and o.output == "md":
        print("\ncapacity (req/s) against the SLO:", file=out)
        out.write(report.render_vs_slo(final.results, criteria))
    if session.written():
        print(f"prefillbench: wrote {', '.join(map(str, session.written()))}", file=err)
    if o.plot and final.results:
        for path in tune_plots.write(final.results, criteria[0], o.plot):
            print(f"prefillbench: wrote {path}", file=err)
    out.flush()
    left: list[str] = []
    for g in found.grids():
        if g.stopped.startswith("time budget"):
            print(f"prefillbench: {g.stopped}; kept {len(g.results)} configuration result(s) and their probes"
                  + (f"; not finished: {', '.join(c.label for c in g.left)}" if g.left else ""), file=err)
        elif g.stopped:
            left += [c.label for c in g.left]
    what = "configuration result(s) and their probes" + (f"; not finished: {', '.join(left)}" if left else "")
    return session.ending(what)

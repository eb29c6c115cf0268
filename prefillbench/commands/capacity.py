"""`prefillbench capacity`: each strategy's highest request rate within the SLO, searched probe by probe."""
from __future__ import annotations

import sys
from pathlib import Path

from prefillbench.backends.distributed import is_rank_zero
from prefillbench.bench import capacity, slo_pricing
from prefillbench.bench.cases import Case, case_label
from prefillbench.commands.options import CapacityOptions
from prefillbench.commands.session import Output, open_session
from prefillbench.errors import UsageError
from prefillbench.report.capacity import best_line, render_md
from prefillbench.report import tables


def cmd_capacity(options: CapacityOptions) -> int:
    config = options.config
    # Rewritten after every probe: the searches finished, and what the probes of the one under way showed.
    outputs = [Output(Path(options.export), lambda path, results, meta: tables.export(path, [r.row for r in results], meta))
               ] if options.export else []
    session = open_session(options.load, outputs, **options.workload_settings(), **config.settings())
    loaded = session.backend
    if any(map(slo_pricing.prices_steps, config.strategies)):  # slo-budget: the run's prices
        config.pricing = slo_pricing.run_pricing(loaded, options.pricing_calibration)
        if is_rank_zero():
            c = config.criteria
            print(f"prefillbench: {config.pricing.describe(c.tbt_p99_ms, c.tpot_ms, c.percentile)}", file=sys.stderr)
    if config.test.max_seq_len > loaded.context_length:
        raise UsageError(f"a request needs {config.test.max_seq_len} positions but the model's context is {loaded.context_length}")

    finished: list[capacity.Probe] = []  # the current case's probes, kept if its search stops midway
    case: Case | None = None

    def partial() -> list[capacity.CapacityResult]:
        return [capacity.CapacityResult(case, capacity.SearchResult.partial(finished))] if case is not None and finished else []

    with session.measuring(config.requests, not options.no_progress) as progress:

        def started(case: Case, n: int, rate: float) -> None:
            progress.restart(config.tokens_per_probe(), f"{case_label(case)} probe {n}: {rate:.3g} {config.unit}")

        def done(case: Case, probe: capacity.Probe) -> None:
            finished.append(probe)
            if is_rank_zero():
                r = probe.row
                progress.print(f"capacity: {case_label(case)} at {probe.rate:.3g} {config.unit}: P99 TBT "
                               f"{r.tbt_p99_ms:.1f} ms, median scheduling delay {r.sched_delay_p50_ms:.0f} ms: "
                               f"{'within' if probe.passed else 'over'}"
                               + (f" (the client measured itself: {r.client_late})" if r.client_late else ""))
            session.save(pending=partial())

        for case in config.cases():
            finished.clear()
            found = capacity.find_capacity(loaded, case, config, started, done, progress.advance)
            case = None
            session.keep(found)
    if unfinished := partial():  # a Ctrl-C or a failing step midway: what the unfinished search's probes showed
        session.keep(*unfinished)
    results: list[capacity.CapacityResult] = session.results
    rows = [r.row for r in results]
    if rows and is_rank_zero():
        if options.output == "md":
            text = render_md(results, options.relative_to)
        else:
            text = tables.render(options.output, rows, session.meta)
        sys.stdout.write(text)
        best = best_line(results, config.criteria.describe(), config.precision, options.relative_to or "sequential")
        # After the table on stdout; on stderr when stdout carries csv or json, which must stay parseable.
        print(best, file=sys.stdout if options.output == "md" else sys.stderr)
        sys.stdout.flush()
    return session.ending("capacity row(s)")

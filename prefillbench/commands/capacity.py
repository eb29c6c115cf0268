"""`prefillbench capacity`: each strategy's highest request rate within the SLO, searched probe by probe."""
from __future__ import annotations

import sys

from prefillbench.backends.distributed import is_rank_zero
from prefillbench.bench import capacity
from prefillbench.bench.cases import Case
from prefillbench.bench.metrics import strategy_label
from prefillbench.commands.options import CapacityOptions
from prefillbench.commands.runner import measuring, open_backend
from prefillbench.errors import UsageError
from prefillbench.meta import run_metadata
from prefillbench.report.capacity import best_line, render_md
from prefillbench.report import tables


def cmd_capacity(options: CapacityOptions) -> int:
    config = options.config
    rank_zero = is_rank_zero()  # under torchrun rank 0 alone prints, writes and shows progress, as in run
    export = options.export if rank_zero else None
    if export:
        tables.check_writable(export)
    loaded = open_backend(options.load)
    if config.test.max_seq_len > loaded.context_length:
        raise UsageError(f"a request needs {config.test.max_seq_len} positions but the model's context is {loaded.context_length}")

    finished: list[capacity.Probe] = []  # the current case's probes, kept if its search stops midway
    case: Case | None = None
    with measuring(config.requests, not options.no_progress) as (measured, progress):

        def started(case: Case, n: int, rate: float) -> None:
            progress.restart(config.tokens_per_probe(), f"{strategy_label(case.strategy, case.chunk_size)} probe {n}: {rate:.3g} req/s")

        def done(case: Case, probe: capacity.Probe) -> None:
            finished.append(probe)
            if rank_zero:
                r = probe.row
                progress.print(f"capacity: {strategy_label(case.strategy, case.chunk_size)} at {probe.rate:.3g} req/s: P99 TBT "
                               f"{r.tbt_p99_ms:.1f} ms, median scheduling delay {r.sched_delay_p50_ms:.0f} ms: "
                               f"{'within' if probe.passed else 'over'}")

        for case in config.cases():
            finished.clear()
            measured.results.append(capacity.find_capacity(loaded, case, config, started, done, progress.advance))
            case = None
    if case is not None and finished:  # a Ctrl-C or a failing step midway: what the unfinished search's probes showed
        measured.results.append(capacity.CapacityResult(case, capacity.SearchResult.partial(finished)))
    results: list[capacity.CapacityResult] = measured.results
    rows = [r.row for r in results]
    meta = run_metadata(loaded.metadata())
    meta.update(model_path=options.load.model or "default", backend_name=loaded.name, device=loaded.device,
                skip_idle=loaded.skip_idle, **options.workload_settings(), **config.settings())
    if rows and rank_zero:
        if options.output == "md":
            text = render_md(results, options.relative_to)
        else:
            text = tables.render(options.output, rows, meta)
        sys.stdout.write(text)
        best = best_line(results, config.criteria.describe(), config.precision, options.relative_to or "sequential")
        # After the table on stdout; on stderr when stdout carries csv or json, which must stay parseable.
        print(best, file=sys.stdout if options.output == "md" else sys.stderr)
        sys.stdout.flush()
        if export:
            tables.export(export, rows, meta)
    ended = measured.ending("capacity row(s)")
    return 0 if ended is None else ended

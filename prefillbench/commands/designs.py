"""`prefillbench tune --gpus N`: colocated against disaggregated designs on N GPUs, on the sim (bench/designs.py)."""
from __future__ import annotations

import concurrent.futures as cf
import sys
from pathlib import Path

from prefillbench.bench import workers
from prefillbench.bench.designs import DEFAULT_DESIGN_REQUESTS, DEFAULT_SCALES, DesignSearch, design_grid
from prefillbench.commands.options import TuneOptions
from prefillbench.commands.session import Output, open_session
from prefillbench.report import designs as report

#: The colocated grid unless -s and --chunk-size say otherwise: the baseline, SARATHI's and Sarathi-Serve's.
DESIGN_STRATEGIES = ["sequential", "chunked", "sarathi-serve"]
DESIGN_BUDGETS = [256, 512, 1024, 2048]
TENSOR_PARALLEL = (1, 2, 4, 8)


#: Processes searching designs side by side (the machine's two cores); --jobs sets it.
DEFAULT_JOBS = 2
_search: DesignSearch | None = None


def _worker_init(search: DesignSearch) -> None:
    global _search
    _search = search


def _worker_search(design):
    return _search.search(design)


def run_designs(o: TuneOptions) -> int:
    out = o.out or sys.stdout
    slo, gpus = o.design_slo, o.gpus
    strategies = o.strategy or DESIGN_STRATEGIES
    budgets = o.chunk_size or DESIGN_BUDGETS
    tps = [tp for tp in TENSOR_PARALLEL if tp <= gpus]
    grid = design_grid(gpus, strategies, budgets, tps, o.prefill_strategy or ["sequential"], budgets,
                       o.load.kv_link or "nvlink", o.load.kv_transfer or "whole")
    scales = tuple(sorted(o.slo_scales or DEFAULT_SCALES))
    outputs = [Output(Path(o.export), lambda path, results, meta: report.export(path, results, meta))] if o.export else []
    tests = o.design_tests or [o.settings.test]
    session = open_session(o.load, outputs, test=", ".join(t.name for t in tests), design_gpus=gpus, design_slo=str(slo),
                           design_attainment=o.attainment / 100, design_slo_scales=list(scales),
                           design_dispatch="colocated: random over replicas; disaggregated: round-robin")
    searches = [DesignSearch(session.backend, test, slo, o.attainment / 100, scales,
                             o.requests or DEFAULT_DESIGN_REQUESTS, o.seed, o.precision / 100) for test in tests]
    jobs = o.jobs or DEFAULT_JOBS
    with session.measuring(len(grid) * len(searches), not o.no_progress, unit="designs") as bar:
        for search in searches:
            _search_grid(session, search, grid, jobs, bar)
    order = {(t.name, d): i for i, (t, d) in enumerate((t, d) for t in tests for d in grid)}
    session.results.sort(key=lambda r: order[(r.test, r.design)])  # the grid's order, whatever the pool's
    results = session.results
    if results:
        out.write(report.render_all(results, slo, gpus))
        if o.plot:
            for path in report.write_plots(results, slo, gpus, o.plot):
                print(f"prefillbench: wrote {path}", file=sys.stderr)
    return session.ending("design(s)")


def _search_grid(session, search: DesignSearch, grid, jobs: int, bar) -> None:
    """Every design of the grid on one workload, kept as each finishes."""
    if jobs == 1:
        search.on_probe = lambda design, rate: bar.describe(f"{design.label} {rate:.3g} req/s")
        for design in grid:
            session.keep(search.search(design))
            bar.advance(1)
        return
    # designs are independent: a pool of forked processes, each with the search (and its sim instances)
    with workers.forked_pool(jobs, _worker_init, (search,)) as pool:  # on Ctrl-C, ends the searches under way
        for done in cf.as_completed([pool.submit(_worker_search, design) for design in grid]):
            result = done.result()
            session.keep(result)
            bar.describe(result.design.label)
            bar.advance(1)

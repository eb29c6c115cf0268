"""`prefillbench run`: the benchmark, its table on stdout, its files, and with --verify the logit check."""
from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

from prefillbench.backends.base import Backend, BackendError
from prefillbench.backends.distributed import is_rank_zero
from prefillbench.bench import interleave, serving_checks, slo_pricing
from prefillbench.bench.cases import BenchConfig, CaseResult, run_case, verify_handoff, verify_logits
from prefillbench.commands.options import RunOptions
from prefillbench.commands.session import Output, error_prefix, open_session, progress_bar
from prefillbench.errors import UsageError
from prefillbench.report import compare_tables, tables, traces, verdict


def cmd_run(options: RunOptions) -> int:
    config = options.config
    for note in serving_checks.before_run(config):  # raises ServingError where the run could mean nothing
        print(f"prefillbench: warning: {note}", file=sys.stderr)
    trace_path = options.export_requests or (traces.trace_path_for(options.export) if options.export else None)
    results_path = None if options.no_results_file else Path(options.results_dir) / f"{dt.datetime.now():%Y%m%d-%H%M%S}.csv"
    # Each finished case rewrites these (the session keeps them current): a run killed midway leaves what finished.
    outputs = [Output(Path(options.export), lambda path, results, meta: tables.export(path, rows_of(results), meta))
               if options.export else None,
               Output(Path(trace_path), lambda path, results, meta: traces.export_traces(path, results)) if trace_path else None,
               Output(results_path, lambda path, results, meta: tables.export(path, rows_of(results), meta))
               if results_path else None]
    session = open_session(options.load, [o for o in outputs if o is not None], **options.workload_settings())
    backend = session.backend
    if any(map(slo_pricing.prices_steps, config.strategies)):  # slo-budget: the run's prices
        config.pricing = slo_pricing.run_pricing(backend, options.pricing_calibration)
        if is_rank_zero():
            print(f"prefillbench: {config.pricing.describe(config.slo.tbt_ms, config.slo.tpot_ms, 99.0)}", file=sys.stderr)
    if options.verify and backend.logit_tolerance() is None:
        raise UsageError(f"--verify compares logits, and the {backend.name} backend computes none")
    longest = max(t.max_seq_len for t in config.tests)
    if longest > backend.context_length:
        raise UsageError(f"a test needs {longest} positions but the model's context is {backend.context_length}")

    total = config.tokens_to_process()
    if is_rank_zero():  # before a run of minutes, what it holds (the bar's estimate follows from its first steps)
        cases = sum(1 for _ in config.cases())
        print(f"prefillbench: {cases} case(s) x {config.repetitions} repetition(s), {total:,} tokens to process",
              file=sys.stderr)
    with session.measuring(total, not options.no_progress) as progress:
        if options.interleave:
            for result in interleave.run_interleaved(backend, config, progress.advance, progress.describe):
                session.keep(result)
        for case in ([] if options.interleave else config.cases()):
            label = f"{case.test.name} {case.strategy} c={case.concurrency}"
            if case.rate is not None:
                label += f" {case.rate:g} req/s"
            progress.describe(label)
            session.keep(run_case(backend, case, config, on_tokens=progress.advance))
    rows = rows_of(session.results)
    if rows and is_rank_zero():
        noisy_cv = options.noisy_cv / 100
        if options.relative_to:
            sys.stdout.write(compare_tables.render_relative(options.output, rows, session.meta, options.relative_to, noisy_cv))
        else:
            sys.stdout.write(tables.render(options.output, rows, session.meta, noisy_cv))
        sys.stdout.flush()
        for note in serving_checks.after_run(rows):
            print(f"prefillbench: warning: {note}", file=sys.stderr)
        if session.meta.get("engine_clock_missing"):
            print(f"prefillbench: note: {session.meta['engine_clock_missing']}", file=sys.stderr)
        if not options.no_verdict:
            verdict.write_verdict(rows, options.relative_to, options.output)
        if results_path in session.written():
            print(f"prefillbench: wrote {results_path}", file=sys.stderr)
    ended = session.ending("measured row(s)")
    late = [r for r in rows if r.client_late]
    if not ended and options.strict and late:
        print(f"prefillbench: --strict: {len(late)} row(s) measured the client, not the engine (its send lag p99 past "
              f"the bound: {late[0].client_late})", file=sys.stderr)
        return 1
    if ended or not options.verify:
        return ended
    return run_verify(backend, config, not options.no_progress and is_rank_zero())


def rows_of(results: list[CaseResult]) -> list:
    return [r.row for r in results]


def run_verify(backend: Backend, config: BenchConfig, show_progress: bool) -> int:
    """The teacher-forced logit comparison, reported on stderr: 0 if every strategy agrees, else 1.

    Under torchrun every rank computes it (the steps need all ranks); rank 0 alone reports it.
    """
    check = verify_logits if config.deployment is None else verify_handoff  # a deployment: against one engine
    progress = progress_bar(show_progress)
    with progress:
        task = progress.add_task("verify")
        try:
            agreements = check(backend, config, on_case=lambda label: progress.update(task, description=label))
        except BackendError as e:
            print(f"{error_prefix()}: verify: {e}", file=sys.stderr)
            return 2
    failed = [a for a in agreements if not a.passed]
    if is_rank_zero():
        sys.stderr.write(tables.render_verify(agreements))
        if failed:
            print(f"verify: {len(failed)} of {len(agreements)} comparisons disagree beyond tolerance", file=sys.stderr)
        else:
            print(f"verify: all {len(agreements)} comparisons agree within tolerance", file=sys.stderr)
    return 1 if failed else 0

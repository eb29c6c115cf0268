"""`prefillbench compare BASE CURRENT`: the two runs' table on stdout, the verdict on stderr; exit 1 on a regression."""
from __future__ import annotations

import sys

from prefillbench.commands.options import CompareOptions
from prefillbench.report.compare import compare, key_label
from prefillbench.report.compare_tables import render_comparison
from prefillbench.report.compare_verdict import comparison_lines, setup_differences
from prefillbench.report.exports import load_results


def cmd_compare(options: CompareOptions) -> int:
    base = load_results(options.base)
    current = load_results(options.current)
    cmp = compare(base, current, options.metric, options.threshold, options.relative_to, options.noisy_cv / 100.0)
    sys.stdout.write(render_comparison(cmp, options.output))
    sys.stdout.flush()
    for name, keys in ((options.base, cmp.only_base), (options.current, cmp.only_current)):
        if keys:
            print(f"prefillbench: {len(keys)} row(s) only in {name}, not compared: {key_label(keys[0])}{' ...' if len(keys) > 1 else ''}",
                  file=sys.stderr)
    if cmp.cross_backend:
        print(f"prefillbench: cross-backend comparison, {cmp.cross_backend} on the {len(cmp.entries)} row(s) both ran "
              "(same model, test and load)", file=sys.stderr)
    differ = setup_differences(base.meta, current.meta)
    if differ:
        print(f"prefillbench: the runs differ in {', '.join(differ)}: the numbers measure different setups", file=sys.stderr)
    if not options.no_verdict:
        for line in comparison_lines(cmp):
            print(f"prefillbench: {line}", file=sys.stderr)
    n = len(cmp.regressions)
    what = f"{'/'.join(options.metric)}{' relative to ' + options.relative_to if options.relative_to else ''}"
    if n:
        print(f"prefillbench: {n} of {len(cmp.entries)} row(s) regressed beyond {options.threshold:g}% ({what})", file=sys.stderr)
        return 1
    print(f"prefillbench: {len(cmp.entries)} row(s) with no regression beyond {options.threshold:g}% ({what})", file=sys.stderr)
    return 0

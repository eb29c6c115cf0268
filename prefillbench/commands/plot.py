"""`prefillbench plot FILE...`: every chart the files support, one PNG each, its path on stdout."""
from __future__ import annotations

import sys

from prefillbench.commands.options import PlotOptions
from prefillbench.report.exports import InputError
from prefillbench.report.plots import load_inputs, make_charts, save


def cmd_plot(options: PlotOptions) -> int:
    results, traces = load_inputs(options.files)
    charts = make_charts(results, traces)
    if not charts:
        raise InputError("nothing to plot")
    for chart in charts:
        try:
            print(save(chart, options.out))
        except OSError as e:
            raise InputError(f"cannot write {chart.name}.png to {options.out}: {e.strerror or e}") from None
    if results and not traces:
        print("prefillbench: no per-request trace given, so no TTFT/TBT distributions (run with --export-requests FILE.jsonl)",
              file=sys.stderr)
    return 0

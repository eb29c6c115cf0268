"""`prefillbench merge FILE...`: the exports of one run's shards (`run --shard I/N --export X.json`) as one report:
its table (and verdict) on stdout, and with --export the merged export."""
from __future__ import annotations

from pathlib import Path

from prefillbench.commands.options import MergeOptions
from prefillbench.report import tables, verdict
from prefillbench.report.merge import merge_exports


def cmd_merge(options: MergeOptions) -> int:
    rows, meta = merge_exports(options.files)
    print(tables.render(options.output, rows, meta), end="", flush=True)
    verdict.write_verdict(rows, None, options.output)
    if options.export:
        tables.export(Path(options.export), rows, meta)
    return 0

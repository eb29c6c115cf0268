"""The sim's whole runs and steps against published measurements it is not fitted to: each row of
benchmarks/lib/published_rows.py run through `prefillbench run --backend sim`, published beside sim, error = sim /
published - 1.

    python -m benchmarks.sim.published                              # every row, table + results/sim_published.png
    python -m benchmarks.sim.published --only trt-ttft,nim          # rows whose id starts with one of these
    python -m benchmarks.sim.published --sim-extra "--sim-dtype fp8" --plot results/fp8.png  # flags on every row
    python -m benchmarks.sim.published --list                       # the rows, their sources and flags; nothing run

Every run is `prefillbench run --backend sim -r 1 -p 0 --no-warmup --no-results-file --no-progress --no-verdict
--export FILE.json` + the row's flags + --sim-extra (the same words on every row). It runs in this process through
the CLI's own entry point (prefillbench.cli.main), so the flags are parsed exactly as a user's are; --subprocess runs
each through .venv/bin/prefillbench instead. No row fits anything. Under measured pricing (the sim's default on every
GPU a row names, or `--sim-pricing measured` in --sim-extra) and no `--sim-overheads`, each row runs with its own
engine's overheads (its source's `overheads`); `--sim-extra "--sim-pricing spec"` prices by spec sheets alone.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from benchmarks.lib import cli
from benchmarks.lib.published_rows import READS, ROWS, Row, is_moe

ROOT = Path(__file__).resolve().parents[2]
#: The flags every row runs with: one repetition, no pp/tg defaults, no warm-up (the sim's clock is virtual, so a
#: warm-up changes nothing but the time taken), no files or screens beyond the export read here.
FIXED = ["run", "--backend", "sim", "-r", "1", "-p", "0", "--no-warmup", "--no-results-file", "--no-progress",
         "--no-verdict"]
#: A row is "within" when |error| <= 25%: the issue's target for whole runs.
TARGET = 0.25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", default="", help="comma list of id prefixes to run (default: every row)")
    parser.add_argument("--sim-extra", default="", help="flags appended to every row's run, e.g. \"--sim-dtype fp8\"")
    parser.add_argument("--plot", default="results/sim_published.png", help="the scatter plot's path ('' for none)")
    parser.add_argument("--json", default="", help="also write every row's published and sim figures here")
    parser.add_argument("--list", action="store_true", help="print the rows and their sources; run nothing")
    parser.add_argument("--subprocess", action="store_true", help="run each row through .venv/bin/prefillbench")


@dataclass
class Outcome:
    row: Row
    sim: float  # NaN when the run failed
    error: float  # sim / published - 1
    argv: list[str]
    message: str = ""  # why it failed, or the sim's note on a clamped concurrency


def own_engine(row: Row, extra: list[str]) -> list[str]:
    """Under measured pricing (the default on a GPU: every row's), the row's own engine's overheads (its source's
    preset) unless --sim-extra names one."""
    spec = any(w == "--sim-pricing" and extra[i + 1:i + 2] == ["spec"] for i, w in enumerate(extra))
    if spec or "--sim-overheads" in extra:
        return []
    return ["--sim-overheads", row.source.overheads]


def row_argv(row: Row, extra: str = "", export: str | None = None, trace: str | None = None) -> list[str]:
    """The full `prefillbench` argv of a row (without the program name); the repository's docs/ files by absolute
    path, so a row runs from any directory."""
    words = [str(ROOT / w) if w.startswith("docs/") else w for w in shlex.split(row.flags)]
    extra_words = shlex.split(extra)
    argv = FIXED + words + extra_words + own_engine(row, extra_words)
    if export:
        argv += ["--export", export]
    if trace:
        argv += ["--trace", trace]
    return argv


def parse_flags(argv: list[str]) -> dict:
    """The run command's parameters as the CLI's own parser reads `argv` (a `run ...` list); nothing is run.
    Raises the parser's error (a typer.TyperException, as prefillbench.cli.main reports it) on a bad flag or value."""
    import typer

    from prefillbench.cli import app

    group = typer.main.get_command(app)
    assert argv[0] == "run", argv
    command = group.commands["run"]  # type: ignore[attr-defined]
    with command.make_context("run", list(argv[1:])) as ctx:
        return dict(ctx.params)


def run_prefillbench(argv: list[str], use_subprocess: bool) -> tuple[int, str]:
    """Exit status and stderr of one `prefillbench` run."""
    if use_subprocess:
        out = subprocess.run([str(ROOT / ".venv" / "bin" / "prefillbench"), *argv], cwd=ROOT, capture_output=True,
                             text=True)
        return out.returncode, out.stderr
    from prefillbench.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(argv)
    return status, stderr.getvalue()


def sim_figure(row: Row, record: dict, meta: dict, trace: list[dict]) -> float:
    """The sim's figure for `row` from the export's first result record, its metadata and the trace (READS)."""
    p, g, c = record["n_prompt"], record["n_gen"], record["concurrency"]
    kind = row.read
    if kind in ("batch_latency_s", "batch_latency_ms"):
        seconds = c * (p + g) / record["throughput"]
        return seconds if kind == "batch_latency_s" else 1e3 * seconds
    if kind == "moe_kernel_us":
        for step in trace:
            if not step["prefill_chunks"] and len(step["decode_contexts"]) == row.arg:
                return 1e3 * step["ops"]["moe_experts"]["ms"] / row.layers
        raise ValueError(f"{row.id}: no decode-only step with {row.arg} decodes in the trace")
    if kind == "ts":
        return record["ts_mean"]
    if kind == "out_speed":
        return g / (record["e2e_p50_ms"] / 1e3)
    if kind == "ttft_ms":
        return record["ttft_p50_ms"]
    if kind == "itl_ms":
        return record["tbt_mean_ms"]
    if kind in ("out_tps", "out_tps_per_gpu"):
        tps = record["throughput"] * g / (p + g)
        if kind == "out_tps":
            return tps
        tp, pp, ep = meta.get("sim_tp", 1), meta.get("sim_pp", 1), meta.get("sim_ep", 1)
        return tps / (max(tp, ep) * pp)  # GPUs: tp x data-parallel groups (ep / tp) x pipeline stages
    raise ValueError(f"{row.id}: unknown read {kind!r} (one of {', '.join(READS)})")


def run_row(row: Row, extra: str = "", workdir: Path | None = None, use_subprocess: bool = False) -> Outcome:
    with contextlib.ExitStack() as stack:
        work = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="published-")))
        export = work / f"{row.id}.json"
        trace = work / f"{row.id}.trace.jsonl" if row.read == "moe_kernel_us" else None
        argv = row_argv(row, extra, str(export), str(trace) if trace else None)
        status, stderr = run_prefillbench(argv, use_subprocess)
        if status != 0 or not export.exists():
            last = [line for line in stderr.splitlines() if line.strip()][-1:] or [f"exit {status}"]
            return Outcome(row, math.nan, math.nan, argv, last[0])
        doc = json.loads(export.read_text())
        steps = [json.loads(line) for line in trace.read_text().splitlines()] if trace else []
        meta = doc["metadata"]
        sim = sim_figure(row, doc["results"][0], meta, steps)
        clamp = meta.get("sim_concurrency_clamped")
        note = f"concurrency clamped: {clamp}" if clamp else ""
        return Outcome(row, sim, sim / row.published - 1.0, argv, note)


def selected(only: str) -> list[Row]:
    prefixes = [p for p in only.split(",") if p]
    return [r for r in ROWS if not prefixes or any(r.id.startswith(p) for p in prefixes)]


def fmt(x: float) -> str:
    if math.isnan(x):
        return "failed"
    return f"{x:,.4g}" if abs(x) < 1e5 else f"{x:,.0f}"


def table(outcomes: list[Outcome]) -> str:
    rows = [[o.row.id, o.row.model, o.row.conditions, f"{fmt(o.row.published)} {o.row.unit}", fmt(o.sim),
             "" if math.isnan(o.error) else f"{100 * o.error:+.0f}%", o.message[:70]] for o in outcomes]
    return tabulate(rows, headers=["id", "model, GPUs, precision", "conditions", "published", "sim", "error", "note"],
                    tablefmt="github", disable_numparse=True)


def summary(outcomes: list[Outcome]) -> str:
    done = [o for o in outcomes if not math.isnan(o.error)]
    if not done:
        return "no row ran"
    within = sum(abs(o.error) <= TARGET for o in done)
    worst = max(done, key=lambda o: abs(o.error))
    lines = [f"{len(done)} of {len(outcomes)} rows ran; {within} within +/-{100 * TARGET:.0f}%; median |error| "
             f"{100 * statistics.median(abs(o.error) for o in done):.0f}%; worst {worst.row.id} "
             f"{100 * worst.error:+.0f}%"]
    for name, group in (("docs/sim.md's 15 MoE rows", [o for o in done if o.row.from_docs]),
                        ("new dense rows", [o for o in done if not o.row.from_docs and not is_moe(o.row)]),
                        ("new MoE rows", [o for o in done if not o.row.from_docs and is_moe(o.row)])):
        if group:
            lines.append(f"  {name}: {len(group)}, median error {100 * statistics.median(o.error for o in group):+.0f}%, "
                         f"range {100 * min(o.error for o in group):+.0f}% .. {100 * max(o.error for o in group):+.0f}%")
    return "\n".join(lines)


def plot(outcomes: list[Outcome], path: str, title: str) -> None:
    """Sim against published, log-log, each point in its own unit; y = x and the +/-25% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [o for o in outcomes if not math.isnan(o.sim) and o.sim > 0]
    if not done:
        return
    fig, ax = plt.subplots(figsize=(7.5, 7))
    lo = min(min(o.sim, o.row.published) for o in done) / 1.5
    hi = max(max(o.sim, o.row.published) for o in done) * 1.5
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", lw=1, label="sim = published")
    ax.fill_between(xs, [x * (1 - TARGET) for x in xs], [x * (1 + TARGET) for x in xs], color="tab:green", alpha=0.15,
                    label=f"+/-{100 * TARGET:.0f}%")
    # One marker per kind of figure: latencies (lower is better) and rates (higher is better) err in opposite senses.
    kinds = {"latency": ("o", ("batch_latency_s", "batch_latency_ms", "ttft_ms", "itl_ms", "moe_kernel_us")),
             "rate": ("^", ("ts", "out_speed", "out_tps", "out_tps_per_gpu"))}
    sources = sorted({o.row.source.key for o in done})
    colors = {s: plt.cm.tab20(i % 20) for i, s in enumerate(sources)}
    for kind, (marker, reads) in kinds.items():
        for source in sources:
            pts = [o for o in done if o.row.read in reads and o.row.source.key == source]
            if pts:
                ax.scatter([o.row.published for o in pts], [o.sim for o in pts], marker=marker, color=colors[source],
                           edgecolor="black", linewidth=0.4, s=36, label=f"{source} ({kind})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("published (each row in its own unit: s, ms, us, tokens/s)")
    ax.set_ylabel("sim (the same unit)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", alpha=0.2)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def list_rows(rows: list[Row]) -> None:
    for r in rows:
        print(f"{r.id}: {r.model}; {r.conditions}; published {r.published:g} {r.unit} ({r.read})")
        print(f"    source: {r.source.cite}\n    engine: {r.source.engine}\n    metric: {r.source.metric}")
        print(f"    sim: prefillbench {shlex.join(FIXED)} {r.flags}" + (f"\n    note: {r.note}" if r.note else ""))


def main(args: argparse.Namespace) -> int:
    rows = selected(args.only)
    if not rows:
        print(f"no row's id starts with any of {args.only!r}", file=sys.stderr)
        return 2
    if args.list:
        list_rows(rows)
        return 0
    outcomes = []
    for row in rows:
        outcome = run_row(row, args.sim_extra, use_subprocess=args.subprocess)
        outcomes.append(outcome)
        print(f"{row.id}: published {fmt(row.published)} {row.unit}, sim {fmt(outcome.sim)}"
              + ("" if math.isnan(outcome.error) else f" ({100 * outcome.error:+.0f}%)")
              + (f" [{outcome.message}]" if math.isnan(outcome.error) else ""), file=sys.stderr)
    print(table(outcomes))
    print()
    print(summary(outcomes))
    label = f"sim{' ' + args.sim_extra if args.sim_extra else ' (spec sheets only)'} against published measurements"
    if args.plot:
        plot(outcomes, args.plot, label)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(
            {"sim_extra": args.sim_extra, "rows": [{"id": o.row.id, "published": o.row.published, "unit": o.row.unit,
                                                    "sim": None if math.isnan(o.sim) else o.sim,
                                                    "error": None if math.isnan(o.error) else o.error,
                                                    "argv": o.argv, "message": o.message} for o in outcomes]},
            indent=1) + "\n")
    return 1 if any(math.isnan(o.error) for o in outcomes) else 0


if __name__ == "__main__":
    cli.run(__name__)

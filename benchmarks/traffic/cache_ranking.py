"""tune on a trace with the prefix cache on and off: each configuration's capacity both ways, and the ranking.

    python -m benchmarks.traffic.cache_ranking                                   # the Mooncake sample, Mistral-7B/A100
    python -m benchmarks.traffic.cache_ranking --plot docs/img/traffic-cache-capacity.png
    python -m benchmarks.traffic.cache_ranking --tune-args "--sim-model llama-3.1-8b --sim-gpu h100 --trace-max-len 131072"

Both runs are `prefillbench tune --backend sim --workload W ... --export FILE.json`, one with `--prefix-cache on`,
one with `--prefix-cache off`, through the CLI's own entry point (prefillbench.cli.main), so the flags are parsed as a
user's are. Virtual time: the figures are the same on any machine.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

from benchmarks.lib import cli

DEFAULT_TUNE = ("--sim-model mistral-7b --sim-gpu a100 --trace-max-len 32768 --slo tbt=100 "
                "-s sequential,chunked,sarathi-serve,vllm-v1 --chunk-size 256,512,1024")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="mooncake-sample", help="the trace (default: the shipped Mooncake sample)")
    parser.add_argument("--tune-args", default=DEFAULT_TUNE, help=f"tune's other flags (default: {DEFAULT_TUNE})")
    parser.add_argument("--plot", metavar="PNG", help="draw both capacities of every configuration here")


def capacities(workload: str, tune_args: str, cache: str) -> dict[str, float]:
    """configuration label -> capacity req/s, from tune's export."""
    from prefillbench.cli import main as prefillbench

    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "tune.json"
        argv = ["tune", "--backend", "sim", "--workload", workload, *shlex.split(tune_args), "--prefix-cache", cache,
                "--no-progress", "--export", str(export)]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            code = prefillbench(argv)
        if code != 0:
            sys.exit(f"prefillbench {' '.join(argv)} failed: {err.getvalue().strip().splitlines()[-1]}")
        doc = json.loads(export.read_text())
    out = {}
    for c in doc["configurations"]:
        label = c["strategy"] + (f" ({c['budget']})" if c.get("budget") else "")
        out[label] = c["capacity_rps"]
    return out


def main(args: argparse.Namespace) -> int:
    on = capacities(args.workload, args.tune_args, "on")
    off = capacities(args.workload, args.tune_args, "off")
    labels = sorted(on, key=lambda k: -on[k])
    rank_off = {k: i + 1 for i, k in enumerate(sorted(off, key=lambda k: -off[k]))}
    rows = [(i + 1, k, f"{on[k]:.3f}", rank_off[k], f"{off[k]:.3f}", f"{on[k] / off[k]:.2f}x") for i, k in enumerate(labels)]
    print(tabulate(rows, headers=["rank on", "configuration", "cache on req/s", "rank off", "cache off req/s", "on/off"],
                   tablefmt="github"))
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 4.2))
        x = range(len(labels))
        ax.bar([i - 0.2 for i in x], [off[k] for k in labels], 0.4, label="prefix cache off", color="#9aa5b1")
        ax.bar([i + 0.2 for i in x], [on[k] for k in labels], 0.4, label="prefix cache on", color="#2f6fad")
        ax.set_xticks(list(x), labels, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("capacity, requests/s")
        ax.set_title(f"tune on {args.workload}: capacity within the SLO, prefix cache off and on", fontsize=10)
        ax.legend(frameon=False, fontsize=8)
        fig.tight_layout()
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=110)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    cli.run(__name__)

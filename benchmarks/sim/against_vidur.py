"""The sim on Vidur's A30 / Qwen2-7B workload (issue 68): 500 Poisson arrivals of 2048+256 tokens at TP1, per rate,
for the reserving Sarathi-Serve scheduler and vLLM V1's paged one at a 512-token budget, under each engine's host
times; with `--vidur DIR`, Vidur's own figures from its request_metrics.csv files beside them, ratio per figure.

    python -m benchmarks.sim.against_vidur                                      # the sim alone (about 2 min)
    python -m benchmarks.sim.against_vidur --rates 2.5 --vidur runs/vidur_a30   # DIR/<rate>/request_metrics.csv

Vidur (microsoft/vidur) cannot run here: its PyPI package fetches device profiles from a hub at run time, and no
public repository holds an A30 profile (its repository ships A100, A40 and H100 ones). So the comparison is the sim's
side, deterministic, against Vidur's figures where someone ran it (`python -m vidur.main
--replica_config_device a30 --replica_config_model_name Qwen/Qwen2-7B --replica_scheduler_config_type sarathi
--sarathi_scheduler_config_chunk_size 512 --poisson_request_interval_generator_config_qps R
--synthetic_request_generator_config_num_requests 500 --fixed_request_length_generator_config_prefill_tokens 2048
--fixed_request_length_generator_config_decode_tokens 256`), one directory per rate. From Vidur's request metrics:
TTFT is prefill_e2e_time, TBT decode_time_execution_plus_preemption_normalized, achieved req/s the requests over
the span from the first arrival to the last completion (the sim's achieved_rps is the same ratio).

The model is docs/sim/qwen2.5-7b-instruct.json (Qwen2-7B's architecture: 28 layers, 3584 wide, 28/4 heads, FFN
18944), the GPU docs/sim/a30.yaml. docs/sim.md ("Against Vidur") says what differs and why.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import statistics
import tempfile
from pathlib import Path

from tabulate import tabulate

from benchmarks.lib import cli

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "docs/sim/qwen2.5-7b-instruct.json"
GPU = ROOT / "docs/sim/a30.yaml"
#: Vidur's request metrics: its names for TTFT, TBT, arrival and completion (vidur/metrics/constants.py).
VIDUR_TTFT, VIDUR_TBT = "prefill_e2e_time", "decode_time_execution_plus_preemption_normalized"
VIDUR_ARRIVED, VIDUR_COMPLETED = "request_arrived_at", "request_completed_at"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rates", default="1.0,1.5,2.0,2.5,3.0", help="arrival rates, req/s (default %(default)s)")
    parser.add_argument("--requests", type=int, default=500, help="requests per run (default %(default)s)")
    parser.add_argument("--budget", type=int, default=512, help="token budget of a step (default %(default)s)")
    parser.add_argument("--strategies", default="sarathi-serve,vllm-v1", help="sim strategies (default %(default)s)")
    parser.add_argument("--overheads", default="sarathi,vllm,none",
                        help="--sim-overheads to run each under (default %(default)s)")
    parser.add_argument("--vidur", type=Path, default=None,
                        help="a directory of Vidur runs, <rate>/request_metrics.csv (e.g. 2.5/request_metrics.csv)")


def sim_rows(rates: str, requests: int, budget: int, strategies: str, overheads: str) -> list[dict]:
    from prefillbench.cli import main as prefillbench

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ov in overheads.split(","):
            export = Path(tmp) / f"{ov}.json"
            with contextlib.redirect_stdout(io.StringIO()):  # its own table: the rows are read from the export
                code = prefillbench(["run", "--backend", "sim", "--sim-model", str(MODEL), "--sim-gpu", str(GPU),
                                     "-s", strategies, "--chunk-size", str(budget), "--pg", "2048,256", "-p", "0", "-n", "0",
                                     "--arrival", "poisson", "--rate", rates, "--requests", str(requests), "-c", "0",
                                     "-r", "1", "--sim-overheads", ov, "--no-results-file", "--no-progress",
                                     "--export", str(export)])
            if code:
                raise SystemExit(f"the sim run under --sim-overheads {ov} failed ({code})")
            for r in json.loads(export.read_text())["results"]:
                rows.append({"overheads": ov, "strategy": r["strategy"], "rate": r["rate"],
                             "achieved": r["achieved_rps"], "ttft_p50": r["ttft_p50_ms"], "tbt_p50": r["tbt_p50_ms"],
                             "kv_peak": r.get("kv_peak_pct"), "policy": r.get("kv_policy")})
    return rows


def vidur_figures(path: Path) -> dict[str, float]:
    """TTFT p50 and TBT p50 in ms and achieved req/s from one Vidur run's request_metrics.csv (times in seconds)."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    ttft = statistics.median(float(r[VIDUR_TTFT]) for r in rows) * 1e3
    tbt = statistics.median(float(r[VIDUR_TBT]) for r in rows) * 1e3
    span = max(float(r[VIDUR_COMPLETED]) for r in rows) - min(float(r[VIDUR_ARRIVED]) for r in rows)
    return {"achieved": len(rows) / span, "ttft_p50": ttft, "tbt_p50": tbt}


def main(args: argparse.Namespace) -> int:
    rows = sim_rows(args.rates, args.requests, args.budget, args.strategies, args.overheads)
    vidur = {}
    if args.vidur is not None:
        for rate in args.rates.split(","):
            path = args.vidur / rate / "request_metrics.csv"
            if path.exists():
                vidur[float(rate)] = vidur_figures(path)
            else:
                print(f"against_vidur: no {path}; that rate is the sim's alone")
    table = []
    for r in rows:
        v = vidur.get(r["rate"])
        line = [r["strategy"], r["policy"], r["overheads"], r["rate"], f"{r['achieved']:.3f}", f"{r['ttft_p50']:.0f}",
                f"{r['tbt_p50']:.1f}", f"{r['kv_peak']:.0f}" if r["kv_peak"] is not None else "-"]
        if v:
            line += [f"{v['achieved']:.3f}", f"{v['ttft_p50']:.0f}", f"{v['tbt_p50']:.1f}",
                     f"{r['achieved'] / v['achieved']:.3f}", f"{r['ttft_p50'] / v['ttft_p50']:.2f}",
                     f"{r['tbt_p50'] / v['tbt_p50']:.2f}"]
        table.append(line)
    headers = ["strategy", "KV", "host times", "rate", "req/s", "TTFT p50 ms", "TBT p50 ms", "KV peak %"]
    if vidur:
        headers += ["Vidur req/s", "Vidur TTFT", "Vidur TBT", "req/s ratio", "TTFT ratio", "TBT ratio"]
    print(tabulate(table, headers=headers, tablefmt="github"))
    return 0


if __name__ == "__main__":
    cli.run(__name__)

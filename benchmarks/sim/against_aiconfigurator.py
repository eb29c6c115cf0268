"""The sim beside AIConfigurator 0.12.0 (NVIDIA's planner, its measured per-operator databases inside its wheel) on
the same work: time per output token of `aiconfigurator cli estimate` and of `prefillbench run --backend sim`, ratio
per figure and the spread. A check, not a fit: no constant of the sim is set from these figures.

    python -m benchmarks.sim.against_aiconfigurator                        # the default grid (about 15 min)
    python -m benchmarks.sim.against_aiconfigurator --models qwen3-32b --systems h200 --backends vllm --tp 1,2,4 --batch 1,8,32
    python -m benchmarks.sim.against_aiconfigurator --install              # only install AIConfigurator's environment

AIConfigurator runs from an environment of its own, `~/.cache/prefillbench/aiconfigurator-0.12.0/` (or
$PREFILLBENCH_CACHE/...): a venv with `pip install aiconfigurator==0.12.0` (it installs offline from the registry:
its databases are in the aiconfigurator-core wheel), made on first use, a stamp file marking a finished install.
For each point: `aiconfigurator cli estimate --model HF_ID --system SYSTEM --backend BACKEND --isl 2048 --osl 256
--batch-size B --tp T` (its aggregated estimate; TPOT read from its summary; a mixture-of-experts model's experts
split by TP too, `--moe-tp-size T --moe-ep-size 1`, as the sim's --tp splits them), and the sim's
`prefillbench run --backend sim --sim-model M --sim-gpu G -p 0 -n 0 --pg 2048,256 -s vllm-v1 --chunk-size 2048 -r 1
--tp T -c B --requests 4B` with `--sim-overheads vllm` for AIConfigurator's vLLM database and `tensorrt-llm` for its
TensorRT-LLM one (TPOT: the export's tpot_p50_ms, the median request's). Both are deterministic: a figure is the same on every run.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate

from benchmarks.lib import cli

VERSION = "0.12.0"
PACKAGE = f"aiconfigurator=={VERSION}"
#: sim model preset -> the Hugging Face id AIConfigurator knows it by.
MODELS = {"qwen3-32b": "Qwen/Qwen3-32B", "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B", "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
          "deepseek-v3": "deepseek-ai/DeepSeek-V3", "gpt-oss-120b": "openai/gpt-oss-120b"}
#: Mixture-of-experts models: AIConfigurator asks how their experts are split.
MOE = ("qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b")
#: sim GPU preset -> AIConfigurator's system.
SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "a100": "a100_sxm"}
#: AIConfigurator's backend -> the sim's --sim-overheads (whose host time and all-reduce kernels).
BACKENDS = {"vllm": "vllm", "trtllm": "tensorrt-llm", "sglang": "sglang"}
ISL, OSL = 2048, 256
TPOT_LINE = re.compile(r"^\s*TPOT:\s*([0-9.]+)\s*ms", re.MULTILINE)


# ---- AIConfigurator's environment --------------------------------------------------------------------------------
def env_dir() -> Path:
    from prefillbench.backends.server.build import cache_root

    return cache_root() / f"aiconfigurator-{VERSION}"


def executable() -> Path:
    return env_dir() / "bin" / "aiconfigurator"


def install() -> Path:
    """The environment, made if it is not there (venv + pip install of the pinned wheel); its aiconfigurator."""
    from prefillbench.backends.server.build import _locked

    stamp = env_dir() / ".installed"
    if stamp.is_file():
        return executable()
    with _locked():
        if not stamp.is_file():
            print(f"installing {PACKAGE} into {env_dir()} ...", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "venv", str(env_dir())], check=True)
            subprocess.run([str(env_dir() / "bin" / "python"), "-m", "pip", "install", "-q", PACKAGE], check=True)
            subprocess.run([str(env_dir() / "bin" / "python"), "-c", "import aiconfigurator, aiconfigurator_core"],
                           check=True)
            stamp.write_text(PACKAGE + "\n")
    return executable()


def aiconfigurator_tpot(model: str, system: str, backend: str, tp: int, batch: int) -> tuple[float, str]:
    """(TPOT ms, '' or why none) of AIConfigurator's aggregated estimate."""
    argv = [str(executable()), "cli", "estimate", "--model", MODELS[model], "--system", system, "--backend", backend,
            "--isl", str(ISL), "--osl", str(OSL), "--batch-size", str(batch), "--tp", str(tp), "--no-color"]
    if model in MOE:  # experts split by TP as the sim's --tp splits them (no expert parallelism)
        argv += ["--moe-tp-size", str(tp), "--moe-ep-size", "1"]
    out = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    found = TPOT_LINE.search(out.stdout + out.stderr)
    if out.returncode != 0 or not found:
        last = [ln for ln in (out.stderr or out.stdout).splitlines() if ln.strip()][-1:] or [f"exit {out.returncode}"]
        return math.nan, last[0][-120:]
    return float(found.group(1)), ""


# ---- the sim -----------------------------------------------------------------------------------------------------
def sim_argv(model: str, gpu: str, backend: str, tp: int, batch: int, export: str) -> list[str]:
    return ["run", "--backend", "sim", "--sim-model", model, "--sim-gpu", gpu, "-p", "0", "-n", "0",
            "--pg", f"{ISL},{OSL}", "-s", "vllm-v1", "--chunk-size", "2048", "-r", "1", "--tp", str(tp), "-c",
            str(batch), "--requests", str(4 * batch), "--sim-overheads", BACKENDS[backend], "--no-warmup",
            "--no-results-file", "--no-progress", "--no-verdict", "--export", export]


def sim_tpot(model: str, gpu: str, backend: str, tp: int, batch: int) -> tuple[float, str]:
    """(TPOT ms, '' or why none) of the sim's run, through the CLI's own entry point in this process."""
    from benchmarks.sim.published import run_prefillbench

    with tempfile.TemporaryDirectory(prefix="aic-") as work:
        export = Path(work) / "run.json"
        status, stderr = run_prefillbench(sim_argv(model, gpu, backend, tp, batch, str(export)), False)
        if status != 0 or not export.exists():
            last = [ln for ln in stderr.splitlines() if ln.strip()][-1:] or [f"exit {status}"]
            return math.nan, last[0][-120:]
        record = json.loads(export.read_text())["results"][0]
        return float(record["tpot_p50_ms"]), ""


@dataclass
class Point:
    model: str
    gpu: str
    backend: str
    tp: int
    batch: int
    aic_ms: float
    sim_ms: float
    note: str

    @property
    def ratio(self) -> float:
        return self.sim_ms / self.aic_ms


def grid(args: argparse.Namespace):
    for model in args.models.split(","):
        for gpu in args.systems.split(","):
            for backend in args.backends.split(","):
                for tp in map(int, args.tp.split(",")):
                    for batch in map(int, args.batch.split(",")):
                        yield model, gpu, backend, tp, batch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="qwen3-32b,qwen3-30b-a3b", help=f"sim presets ({', '.join(MODELS)})")
    parser.add_argument("--systems", default="h100,h200", help=f"sim GPU presets ({', '.join(SYSTEMS)})")
    parser.add_argument("--backends", default="vllm,trtllm", help=f"AIConfigurator databases ({', '.join(BACKENDS)})")
    parser.add_argument("--tp", default="1,2,4,8")
    parser.add_argument("--batch", default="1,8,32,128")
    parser.add_argument("--install", action="store_true", help="install AIConfigurator's environment and stop")
    parser.add_argument("--json", default="", help="also write the points here")


def main(args: argparse.Namespace) -> int:
    install()
    if args.install:
        print(executable())
        return 0
    for key, table in (("models", MODELS), ("systems", SYSTEMS), ("backends", BACKENDS)):
        unknown = [x for x in getattr(args, key).split(",") if x not in table]
        if unknown:
            print(f"against_aiconfigurator: unknown {key} {', '.join(unknown)}: one of {', '.join(table)}",
                  file=sys.stderr)
            return 2
    points = []
    for model, gpu, backend, tp, batch in grid(args):
        aic, why = aiconfigurator_tpot(model, SYSTEMS[gpu], backend, tp, batch)
        sim, sim_why = sim_tpot(model, gpu, backend, tp, batch) if not why else (math.nan, "")
        points.append(Point(model, gpu, backend, tp, batch, aic, sim, why or sim_why))
        p = points[-1]
        print(f"{model} {gpu} {backend} TP{tp} B{batch}: AIConfigurator {p.aic_ms:.2f} ms, sim {p.sim_ms:.2f} ms"
              + (f" ({p.note})" if p.note else ""), file=sys.stderr, flush=True)
    rows = [[p.model, p.gpu, p.backend, p.tp, p.batch, f"{p.aic_ms:.2f}", f"{p.sim_ms:.2f}",
             "" if math.isnan(p.ratio) else f"{p.ratio:.2f}", p.note[:60]] for p in points]
    print(tabulate(rows, headers=["model", "GPU", "AIC database", "TP", "batch", "AIConfigurator TPOT ms",
                                  "sim TPOT ms", "sim / AIC", "note"], tablefmt="github", disable_numparse=True))
    ratios = [p.ratio for p in points if not math.isnan(p.ratio)]
    if ratios:
        within = sum(abs(r - 1) <= 0.15 for r in ratios)
        print(f"\n{len(ratios)} of {len(points)} points ran; sim / AIConfigurator median {statistics.median(ratios):.2f}, "
              f"range {min(ratios):.2f} .. {max(ratios):.2f}; {within} within +/-15%")
        for tp in sorted({p.tp for p in points}):
            group = [p.ratio for p in points if p.tp == tp and not math.isnan(p.ratio)]
            if group:
                print(f"  TP{tp}: median {statistics.median(group):.2f}, range {min(group):.2f} .. {max(group):.2f}")
    if args.json:
        with contextlib.suppress(OSError):
            Path(args.json).write_text(json.dumps([p.__dict__ for p in points], indent=1))
    return 0


if __name__ == "__main__":
    cli.run(__name__)

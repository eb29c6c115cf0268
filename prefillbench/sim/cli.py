"""The sim's command-line pieces, kept here so prefillbench/cli.py only calls them."""
from __future__ import annotations

import argparse
from typing import Any


def add_sim_arguments(group) -> None:
    """`run` flags for --backend sim."""
    group.add_argument("--sim-model", help="sim: model preset (llama-13b, llama-33b, llama-2-70b, mistral-7b, gpt3-175b) "
                       "or a transformers config.json (default: llama-13b)")
    group.add_argument("--sim-gpu", help="sim: GPU preset (a6000, a100-sxm, a100-pcie, h100-sxm, h200) or a spec .yaml/.json "
                       "(default: a6000)")
    group.add_argument("--tp", type=int, default=1, help="sim: tensor-parallel GPUs per stage (default: 1)")
    group.add_argument("--pp", type=int, default=1, help="sim: pipeline stages, run as a pipeline of micro-batches (default: 1)")
    group.add_argument("--calibration", help="sim: calibration file written by `prefillbench calibrate`")
    group.add_argument("--trace", metavar="FILE", help="sim: write every step's per-operator cost breakdown here (JSONL)")


def sim_options(args: argparse.Namespace) -> dict[str, Any]:
    """The load_backend options the sim flags stand for (empty unless --backend sim)."""
    if getattr(args, "backend", None) != "sim":
        return {}
    return {k: getattr(args, k, None) for k in ("sim_model", "sim_gpu", "tp", "pp", "calibration", "trace")}


def add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="fit the sim's attainable fractions and step overhead to a real backend")
    p.add_argument("-m", "--model", help="checkpoint for the real backend (default: the shipped model)")
    p.add_argument("--backend", default="torch", choices=("torch", "gguf"), help="real backend to measure (default: torch)")
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("-t", "--threads", type=int)
    p.add_argument("--sim-model", help="shapes for the sim (default: read from the real backend's model config)")
    p.add_argument("--sim-gpu", help="nominal spec the fractions are relative to (default: cpu, or a spec file)")
    p.add_argument("--quick", action="store_true", help="a smaller sweep")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per sweep point; the median counts (default: 3)")
    p.add_argument("-o", "--output", default="calibration.json", help="calibration file to write (default: calibration.json)")
    p.add_argument("--errors", help="also write the per-step measured/predicted times here (.csv)")
    p.add_argument("--check", action="store_true", help="then run sequential and chunked on the real backend and on the "
                   "calibrated sim and compare their throughput ratios")
    p.add_argument("--check-run", type=_ints, default=(192, 16, 4, 8, 64), metavar="P,N,C,R,CHUNK",
                   help="the --check run: prompt, generation, concurrency, requests, chunk size (default: 192,16,4,8,64)")


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected P,N,C,R,CHUNK, got {text!r}") from None
    if len(values) != 5 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected five positive integers P,N,C,R,CHUNK, got {text!r}")
    return values


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .calibration import calibrate_cli

    return calibrate_cli(args)

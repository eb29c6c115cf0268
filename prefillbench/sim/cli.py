"""The sim's command-line pieces: `run`'s sim options and the `calibrate` command.

prefillbench/cli.py puts the option aliases into `run`'s signature and registers `calibrate`;
the sim's flags and their help live here, beside the sim.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Annotated, Any, Literal, Optional

import typer

SIM_PANEL = "sim backend (--backend sim)"


def _sim(*names: str, help: str, **kwargs: Any) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=SIM_PANEL, **kwargs)


# ---- `run`'s sim options (used only with --backend sim) ----
SimModel = Annotated[Optional[str], _sim(
    "--sim-model", help="sim: model preset (llama-13b, llama-33b, llama-2-70b, mistral-7b, gpt3-175b) "
    "or a transformers config.json (default: llama-13b)")]
SimGpu = Annotated[Optional[str], _sim(
    "--sim-gpu", help="sim: GPU preset (a6000, a100-sxm, a100-pcie, h100-sxm, h200) or a spec .yaml/.json (default: a6000)")]
TensorParallel = Annotated[int, _sim("--tp", help="sim: tensor-parallel GPUs per stage")]
PipelineStages = Annotated[int, _sim("--pp", help="sim: pipeline stages, run as a pipeline of micro-batches")]
Calibration = Annotated[Optional[str], _sim("--calibration", help="sim: calibration file written by `prefillbench calibrate`")]
Trace = Annotated[Optional[str], _sim("--trace", metavar="FILE", help="sim: write every step's per-operator cost breakdown here (JSONL)")]

SIM_OPTIONS = ("sim_model", "sim_gpu", "tp", "pp", "calibration", "trace")


def sim_options(args: Any) -> dict[str, Any]:
    """The load_backend options the sim flags stand for (empty unless --backend sim)."""
    if getattr(args, "backend", None) != "sim":
        return {}
    return {k: getattr(args, k, None) for k in SIM_OPTIONS}


# ---- `calibrate` ----
def five_ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"expected P,N,C,R,CHUNK, got {text!r}") from None
    if len(values) != 5 or min(values) < 1:
        raise typer.BadParameter(f"expected five positive integers P,N,C,R,CHUNK, got {text!r}")
    return values


def calibrate(
    model: Annotated[Optional[str], typer.Option("-m", "--model", help="checkpoint for the real backend (default: the shipped model)")] = None,
    backend: Annotated[Literal["torch", "gguf"], typer.Option(help="real backend to measure")] = "torch",
    device: Annotated[Literal["auto", "cuda", "cpu"], typer.Option(help="torch device")] = "auto",
    dtype: Annotated[Literal["float32", "bfloat16", "float16"], typer.Option(help="torch dtype")] = "float32",
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", help="CPU threads (default: the library's choice)")] = None,
    sim_model: Annotated[Optional[str], typer.Option(help="shapes for the sim (default: read from the real backend's model config)")] = None,
    sim_gpu: Annotated[Optional[str], typer.Option(help="nominal spec the fractions are relative to (default: cpu, or a spec file)")] = None,
    quick: Annotated[bool, typer.Option("--quick", metavar="", help="a smaller sweep")] = False,
    repeats: Annotated[int, typer.Option(help="timed repeats per sweep point; the median counts")] = 3,
    output: Annotated[str, typer.Option("-o", "--output", help="calibration file to write")] = "calibration.json",
    errors: Annotated[Optional[str], typer.Option(help="also write the per-step measured/predicted times here (.csv)")] = None,
    check: Annotated[bool, typer.Option("--check", metavar="", help="then run sequential and chunked on the real backend and on the "
                                        "calibrated sim and compare their throughput ratios")] = False,
    check_run: Annotated[str, typer.Option(
        callback=five_ints, metavar="P,N,C,R,CHUNK",
        help="the --check run: prompt, generation, concurrency, requests, chunk size")] = "192,16,4,8,64",
) -> int:
    """Fit the sim's attainable fractions and step overhead to a real backend."""
    from .calibration import calibrate_cli

    return calibrate_cli(SimpleNamespace(**locals()))

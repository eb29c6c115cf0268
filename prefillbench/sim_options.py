"""`run`'s sim options, declared beside the sim; prefillbench/cli.py puts them into `run`'s signature."""
from __future__ import annotations

from typing import Annotated, Any, Optional

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
TensorParallel = Annotated[int, typer.Option(
    "--tp", rich_help_panel="model and backend",
    help="tensor-parallel ranks: torch runs one process per rank under torchrun (see the README's \"Past one machine\"); "
    "the sim predicts GPUs per stage")]
PipelineStages = Annotated[int, _sim("--pp", help="sim: pipeline stages, run as a pipeline of micro-batches")]
Calibration = Annotated[Optional[str], _sim("--calibration", help="sim: calibration file written by `prefillbench calibrate`")]
Trace = Annotated[Optional[str], _sim("--trace", metavar="FILE", help="sim: write every step's per-operator cost breakdown here (JSONL)")]

SIM_OPTIONS = ("sim_model", "sim_gpu", "tp", "pp", "calibration", "trace")


def sim_options(args: Any) -> dict[str, Any]:
    """The load_backend options the sim flags stand for (empty unless --backend sim)."""
    if getattr(args, "backend", None) != "sim":
        return {}
    return {k: getattr(args, k, None) for k in SIM_OPTIONS}

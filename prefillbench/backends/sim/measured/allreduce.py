"""The tensor-parallel all-reduce as the engines run it: which kernel each engine picks for a message of a size, on a
number of GPUs and a link, and that kernel's measured time.

Which kernel (each engine's own source):
- vLLM (`--sim-overheads vllm`, `vllm-v0`; pricing.ALLREDUCE_ENGINE_OF): its custom all-reduce (one-shot /
  two-shot kernels over P2P memory, captured in the CUDA graphs) where `CustomAllreduce.should_custom_ar` takes the message
  (vllm/distributed/device_communicators/custom_all_reduce.py): 2, 4, 6 or 8 GPUs, fully connected (NVSwitch) or
  just two (`world_size == 2 or fully_connected`: a bridge pair or two PCIe cards with P2P), the message under
  `max_size` (8192 * 1024 bytes, CustomAllreduce.__init__); else pynccl's NCCL (cuda_communicator.py
  CudaCommunicator.all_reduce falls through to pynccl). Symmetric-memory NCCL is off unless enabled
  (all_reduce_utils.should_nccl_symm_mem_allreduce), so it is not priced.
- SGLang (`sglang`): the same rule, its custom all-reduce being vLLM's port
  (sglang/srt/distributed/device_communicators/custom_all_reduce.py, the same 8 MiB max_size and world sizes).
- TensorRT-LLM (`tensorrt-llm`): its AllReduce op with strategy AUTO, which picks one-shot, two-shot or NCCL by
  size and GPUs itself (tensorrt_llm/_torch/distributed/ops.py AllReduce; AllReduceStrategy.AUTO); its measured
  table is that choice at every size.
- No engine (`none`, `sarathi`, Sarathi-Serve's torch.distributed): NCCL's ring.

What it costs: AIConfigurator 0.12.0's measured tables (data/aiconfigurator_allreduce.csv,
benchmarks/sim/make_allreduce_sample.py): per system, GPUs and message size, the engine's kernel and NCCL. A curve
is the table's FIT sizes (alternate sizes, the others TEST: test_errors) read in log time over log size, flat below
the smallest, at the last size's bandwidth beyond the largest. A GPU is priced by the measured system of its link:
its own where measured (A100-SXM, H100-SXM, H200, B200, L40S), else the newest of its kind (NVSwitch parts by
H100-SXM's, a PCIe card by the L40S's PCIe 4.0), the message scaled by the link's bandwidth over the measured one's
(as collectives.py scales Vidur's curves). A link of no kind measured (MI300X's Infinity Fabric, a spec file's
unnamed link) keeps NCCL's curves from Vidur, as before. An NVLink bridge has no table: NCCL over it is Vidur's measured pairwise
NVLink (collectives.py, topology pairwise_nvlink), and a custom all-reduce over it is priced by A100-SXM's table
(NVLink 3, the bridge's 300 GB/s a direction), which the pricing line says.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from prefillbench.backends.sim.specs import SimConfigError

SAMPLE = Path(__file__).resolve().parent / "data" / "aiconfigurator_allreduce.csv"
SOURCE = "NVIDIA/aiconfigurator 0.12.0 systems/data/<system>/comm (aiconfigurator-core wheel)"
#: vLLM's CustomAllreduce: supported world sizes and its default max_size (bytes).
CUSTOM_WORLD_SIZES = (2, 4, 6, 8)
CUSTOM_MAX_BYTES = 8192 * 1024
#: The measured systems' links, bytes/s a direction (their AIConfigurator system files' intra_node_bw).
SYSTEM_BW = {"a100_sxm": 300e9, "h100_sxm": 450e9, "h200_sxm": 450e9, "b200_sxm": 900e9, "l40s": 32e9}
SYSTEM_OF_GPU = {"A100-SXM": "a100_sxm", "H100-SXM": "h100_sxm", "H200": "h200_sxm", "B200": "b200_sxm",
                 "L40S": "l40s"}
ENGINE_WORDS = {"vllm": "vLLM's custom all-reduce", "sglang": "SGLang's custom all-reduce",
                "trtllm": "TensorRT-LLM's AllReduce (AUTO: one-shot / two-shot / NCCL by size)", "nccl": "NCCL's ring"}


@dataclass(frozen=True)
class AllReduceCurve:
    """Measured time of one kernel's all-reduce by message size: its FIT points, read in log-log."""

    system: str
    engine: str  # vllm | sglang | trtllm | nccl
    workers: int
    log_bytes: tuple[float, ...]
    log_seconds: tuple[float, ...]

    def seconds(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        x = math.log(nbytes)
        xs, ys = self.log_bytes, self.log_seconds
        if x <= xs[0]:
            return math.exp(ys[0])
        if x >= xs[-1]:  # past the largest size: at its bandwidth
            return math.exp(ys[-1]) * nbytes / math.exp(xs[-1])
        return math.exp(float(np.interp(x, xs, ys)))


@lru_cache(maxsize=None)
def sample():
    import pandas as pd

    return pd.read_csv(SAMPLE, comment="#")


def split(df):
    """df with a `split` column: per (system, engine, GPUs) the sorted sizes alternate fit, test, fit, ..."""
    df = df.sort_values(["system", "engine", "num_gpus", "bytes"]).copy()
    pos = df.groupby(["system", "engine", "num_gpus"]).cumcount()
    df["split"] = np.where(pos % 2 == 0, "fit", "test")
    return df


@lru_cache(maxsize=None)
def curve(system: str, engine: str, workers: int) -> AllReduceCurve:
    df = split(sample())
    g = df[(df["system"] == system) & (df["engine"] == engine) & (df["num_gpus"] == workers) & (df["split"] == "fit")]
    if g.empty:
        raise SimConfigError(f"no measured {engine} all-reduce on {system} at {workers} GPUs")
    # math.log, not np.log: numpy's AVX-512 log and its AVX2 one round some inputs apart, and these knots price
    # every simulated all-reduce
    return AllReduceCurve(system, engine, workers, tuple(math.log(float(b)) for b in g["bytes"]),
                          tuple(math.log(float(us) * 1e-6) for us in g["latency_us"]))


def test_errors():
    """Every TEST row with the FIT curve's prediction and its relative error (err)."""
    df = split(sample())
    test = df[df["split"] == "test"].copy()
    test["pred_us"] = [curve(r.system, r.engine, int(r.num_gpus)).seconds(r.bytes) * 1e6
                       for r in test.itertuples(index=False)]
    test["err"] = test["pred_us"] / test["latency_us"] - 1.0
    return test


def uses_custom(engine: str, workers: int, link_kind: str, nbytes: float) -> bool:
    """Whether the engine runs its own kernel for this message (vLLM's should_custom_ar, SGLang's port of it);
    TensorRT-LLM's AUTO table covers every size itself."""
    if engine == "trtllm":
        return True
    if engine not in ("vllm", "sglang"):
        return False
    fully_connected = link_kind == "nvlink"
    return (workers in CUSTOM_WORLD_SIZES and (workers == 2 or fully_connected) and nbytes < CUSTOM_MAX_BYTES)


def measured_system(gpu_name: str, link_kind: str, bridge: bool = False) -> str | None:
    """The measured system pricing this GPU's link: its own, or the newest of its kind; None: an NVLink bridge (no
    table: Vidur's pairwise NVLink for NCCL)."""
    if bridge:
        return None
    if link_kind == "pcie":
        return "l40s"
    own = SYSTEM_OF_GPU.get(gpu_name.removesuffix(" calibrated"))
    if own is not None:
        return own
    name = gpu_name.upper()
    if name.startswith("B") or name.startswith("GB"):
        return "b200_sxm"
    if name.startswith("A100") or name.startswith("A800"):
        return "a100_sxm"
    return "h100_sxm"


def describe(engine: str, workers: int, link_kind: str, system: str | None) -> str:
    """Which all-reduce runs, in words, for the pricing line."""
    if link_kind == "other":
        return ("NCCL's measured curves (Vidur; no engine kernel measured over this link: name it in the GPU spec "
                "file, link: nvlink4 or pcie4, for the engine's own)")
    where = (f"AIConfigurator 0.12.0's {system} table" if system else "Vidur's pairwise NVLink for NCCL, "
             "A100-SXM's table for the custom kernel")
    if engine == "trtllm":
        return f"{ENGINE_WORDS[engine]} ({where})"
    if engine == "nccl":
        return f"NCCL's ring ({where if system else 'Vidur pairwise NVLink'})"
    if uses_custom(engine, workers, link_kind, 0):
        return f"{ENGINE_WORDS[engine]} below {CUSTOM_MAX_BYTES >> 20} MiB, NCCL above ({where})"
    why = "not fully connected past 2 GPUs" if workers in CUSTOM_WORLD_SIZES else f"no custom kernel at {workers} GPUs"
    return f"NCCL ({ENGINE_WORDS[engine]} off: {why}; {where})"


__all__ = ["AllReduceCurve", "CUSTOM_MAX_BYTES", "SAMPLE", "curve", "describe", "measured_system",
           "sample", "split", "test_errors", "uses_custom"]

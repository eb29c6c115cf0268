"""Writes prefillbench/backends/sim/measured/data/aiconfigurator_allreduce.csv from AIConfigurator 0.12.0's measured
all-reduce tables (its wheel aiconfigurator-core, Apache-2.0): per system, the engine's own all-reduce kernel as
the engine runs it (vLLM's custom all-reduce and SGLang's under CUDA graphs, TensorRT-LLM's AllReduce, whose table
is its AUTO choice of one-shot / two-shot / NCCL by size) and NCCL's ring (nccl-tests style, the system file's
nccl_version), each row the median latency at one message size.

Run it with the python of against_aiconfigurator's environment (it has pandas and pyarrow), from the repository root:

    ~/.cache/prefillbench/aiconfigurator-0.12.0/bin/python -m benchmarks.sim.make_allreduce_sample

message_size in AIConfigurator's tables counts elements (bf16 / half): 512 Mi elements over NVLink 4 at TP2 take
1.68 ms, 320 GB/s of bus bandwidth as bytes (2 bytes each), where as bytes alone it would be 160, below any NCCL
figure published for an H200; the sample keeps bytes (elements x 2).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.lib import cli

OUT = Path(__file__).resolve().parents[2] / "prefillbench/backends/sim/measured/data/aiconfigurator_allreduce.csv"
VERSION = "0.12.0"
#: system -> {engine: version folder}; the newest each system has of every engine, NCCL at the system file's version.
SOURCES = {
    "h100_sxm": {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20", "nccl": "2.29.2"},
    "h200_sxm": {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20", "nccl": "2.26.2"},
    "b200_sxm": {"vllm": "0.24.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20", "nccl": "2.29.2"},
    "a100_sxm": {"vllm": "0.14.0", "sglang": "0.5.10", "trtllm": "1.0.0", "nccl": "2.27.3"},
    "l40s": {"vllm": "0.22.0", "sglang": "0.5.14", "trtllm": "1.3.0rc20", "nccl": "2.27.3"},
}
#: The kernels' graph variant where a table has eager and graph rows (the engines capture their decode steps).
GRAPH = {"vllm": "vllm_graph", "sglang": "sglang_graph"}


def rows(data: Path):
    import pandas as pd

    parts = []
    for system, engines in SOURCES.items():
        for engine, version in engines.items():
            name = "nccl_perf.parquet" if engine == "nccl" else "custom_allreduce_perf.parquet"
            path = data / system / "comm" / engine / version / name
            df = pd.read_parquet(path)
            if engine == "nccl":
                df = df[(df["op_name"] == "all_reduce") & (df["nccl_dtype"] == "half")]
            elif engine in GRAPH:
                df = df[df["backend"] == GRAPH[engine]]
            df = df.assign(num_gpus=df["num_gpus"].astype(int), message_size=df["message_size"].astype(int))
            g = df.groupby(["num_gpus", "message_size"], as_index=False)["latency"].median()
            g["system"], g["engine"], g["version"] = system, engine, version
            g["bytes"] = 2 * g["message_size"]
            g["latency_us"] = (g["latency"] * 1e3).round(4)
            parts.append(g[["system", "engine", "version", "num_gpus", "bytes", "latency_us"]])
    return pd.concat(parts, ignore_index=True).sort_values(["system", "engine", "num_gpus", "bytes"])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=None, help="aiconfigurator_core/systems/data (default: the installed one's)")
    parser.add_argument("--out", default=str(OUT))


def main(args: argparse.Namespace) -> int:
    if args.data:
        data = Path(args.data)
    else:
        import aiconfigurator_core

        data = Path(aiconfigurator_core.__file__).parent / "systems" / "data"
    df = rows(data)
    with open(args.out, "w") as f:
        f.write(f"# NVIDIA/aiconfigurator {VERSION} (wheel aiconfigurator-core {VERSION}, Apache-2.0) systems/data/"
                "<system>/comm/<engine>/<version>/{custom_allreduce,nccl}_perf.parquet: median latency (us) per "
                "(system, engine, GPUs, message bytes = elements x 2, bf16); vllm and sglang under CUDA graphs; "
                "made by benchmarks/sim/make_allreduce_sample.py\n")
        df.to_csv(f, index=False)
    print(f"{len(df)} rows -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    cli.run(__name__)

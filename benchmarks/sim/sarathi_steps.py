"""Sarathi-Serve's measured step times (Yi-34B, TP2, 2xA100-80GB PCIe with pairwise NVLink) against the sim's
CostModel pricing the same steps: published, sim, error per step, and the artifact's linear and attention times
beside the sim's where the artifact has them.

    python -m benchmarks.sim.sarathi_steps
    python -m benchmarks.sim.sarathi_steps --link pcie     # only the a100-pcie preset's PCIe link for the all-reduces
    python -m benchmarks.sim.sarathi_steps --pricing measured --overheads sarathi   # the measured curves, Sarathi's host

Source: microsoft/sarathi-serve, branch osdi-sarathi-serve @ ceaa0660ea2487976101a8167aad5c8046e85b27,
osdi-experiments/figure-2/{decode,prefill}.csv (batch_execution_time, s) and osdi-experiments/table-2/results.csv
(ms); copied in /work/shared/notes/measured-gpu-data.md. The step shapes are read from the artifact's scripts:
- figure-2 decode: operation_time_split_runs.sh runs requests of 1024 tokens with prefill_to_decode_ratio 255, so
  uniform_request_length_generator.py gives 4 decode tokens (ceil(1024 / 256)) and 1020 prompt tokens; the prefill
  emits the first token and the 3 decode-only steps feed positions 1020-1022 (contexts 1021-1023, the token itself
  included). The notebook's decode.csv is the mean batch_execution_time of the decode-only batches of each size, so
  the sim's figure is the mean of its price at contexts 1021, 1022 and 1023.
- figure-2 prefill: one request per length (prefill_operation_time_split_experiment_trace.csv), max batch 1: a
  single whole-prompt step of n tokens.
- table-2 (runs.sh): 8 requests of 1024 prompt + 16 decode tokens, max batch 4; the decode-only batch of 4 (vLLM
  scheduler) and the hybrid 1021 + 3 (Sarathi scheduler, chunk 1024). results.csv does not record the decodes'
  contexts: they lie in 1025-1039 (positions 1024-1038 of 16 generated tokens), priced at 1032, the middle; at
  these shapes the decodes' attention is a few tenths of a percent of the step, so the choice moves no figure.

The model is Yi-34B's config (the artifact runs 01-ai/Yi-34B-200K, the same shapes with a longer rope): 60 layers,
hidden 7168, 56 heads, 8 KV heads of 128, FFN 20480, vocab 64000 (https://huggingface.co/01-ai/Yi-34B/blob/main/
config.json, as public repositories quote it). The GPU is the a100-pcie preset (312 TFLOP/s bf16, 1,935 GB/s); its
link is PCIe 4.0 (32 GB/s), but the artifact's two GPUs are bridged by NVLink, so a second column prices the
all-reduces over the bridge (NVIDIA's A100 PCIe datasheet: NVLink Bridge for 2 GPUs, 600 GB/s, 300 per direction,
the convention of the a100-sxm preset). None of these figures fits any constant of the sim.
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from tabulate import tabulate

from prefillbench.backends.sim.configs import load_gpu_spec
from prefillbench.backends.sim.cost import Batch, CostModel
from prefillbench.backends.sim.pricing import OVERHEADS, PRICINGS, engine_overheads, pricing_for
from prefillbench.backends.sim.links import with_link
from prefillbench.backends.sim.presets import MODEL_PRESETS
from prefillbench.backends.sim.specs import GPUSpec

from benchmarks.lib import cli

YI_34B = MODEL_PRESETS["yi-34b"]
ARTIFACT = ("microsoft/sarathi-serve osdi-sarathi-serve@ceaa0660ea2487976101a8167aad5c8046e85b27 "
            "osdi-experiments/{figure-2/decode.csv, figure-2/prefill.csv, table-2/results.csv}")
#: Contexts of figure-2's decode-only steps (see the module docstring) and of table-2's decodes.
FIG2_CONTEXTS = (1021, 1022, 1023)
TABLE2_CONTEXT = 1032
LINEAR_OPS = ("qkv_proj", "attn_out_proj", "mlp_gate_up", "mlp_down")
ATTENTION_OPS = ("prefill_attention", "decode_attention")


@dataclass(frozen=True)
class Step:
    name: str
    batches: tuple[Batch, ...]  # priced alike and averaged (figure-2's decode rows are means over contexts)
    published_ms: float
    linear_ms: float | None = None  # table-2's op-level times, where the artifact has them
    attention_ms: float | None = None
    source: str = ""


def decode_steps() -> list[Step]:
    # figure-2/decode.csv batch_execution_time (s), batch 1..128, as the notes copy them.
    published = {1: 0.04680326674133536, 2: 0.04750242146352921, 4: 0.04884505489220215, 8: 0.06967552363251643,
                 16: 0.0772536892133454, 32: 0.08789650211110707, 64: 0.1278068584700425, 128: 0.18933050256843362}
    return [Step(f"decode x{b} (ctx ~1022)", tuple(Batch((), (c,) * b) for c in FIG2_CONTEXTS), 1e3 * s,
                 source="figure-2/decode.csv") for b, s in published.items()]


def prefill_steps() -> list[Step]:
    # figure-2/prefill.csv batch_execution_time (s), one request of n tokens.
    published = {128: 0.0480940844863653, 256: 0.1213533570989966, 512: 0.1055817436426878, 1024: 0.2143006371334195,
                 2048: 0.3660252727568149, 4096: 0.7576026394963264, 8192: 1.863264944404364, 16384: 4.407501052133739}
    return [Step(f"prefill {n}", (Batch(((0, n, True),), ()),), 1e3 * s, source="figure-2/prefill.csv")
            for n, s in published.items()]


def table2_steps() -> list[Step]:
    # table-2/results.csv (ms): batch_execution_time, linear, attention.
    return [
        Step("decode x4 (ctx ~1032)", (Batch((), (TABLE2_CONTEXT,) * 4),), 68.12209542840715, 25.50041586626321,
             2.9952000081539154, "table-2/results.csv"),
        Step("hybrid 1021 + 3 decodes", (Batch(((0, 1021, False),), (TABLE2_CONTEXT,) * 3),), 217.6498775370419,
             158.9964799284935, 3.9936000108718868, "table-2/results.csv"),
        Step("prefill 1024", (Batch(((0, 1024, True),), ()),), 217.2359591349959, 160.9267194569111,
             13.67039993405342, "table-2/results.csv"),
    ]


def all_steps() -> list[Step]:
    return decode_steps() + prefill_steps() + table2_steps()


def gpus(link: str) -> dict[str, GPUSpec]:
    """The GPU specs to price on: the a100-pcie preset as it is, and with its NVLink bridge as its link (the CLI's
    --sim-link nvlink-bridge: links.with_link)."""
    pcie = load_gpu_spec("a100-pcie")
    out = {"pcie": pcie, "nvlink": with_link(pcie, "nvlink-bridge", 2)}
    return out if link == "both" else {link: out[link]}


def price(cost: CostModel, step: Step) -> tuple[float, float, float]:
    """(step, linear, attention) ms, each the mean over the step's batches."""
    totals, linear, attention = [], [], []
    for batch in step.batches:
        ops = cost.step_cost(batch).breakdown()
        totals.append(cost.seconds(batch))
        linear.append(sum(ops[k]["seconds"] for k in LINEAR_OPS if k in ops))
        attention.append(sum(ops[k]["seconds"] for k in ATTENTION_OPS if k in ops))
    return tuple(1e3 * statistics.fmean(v) for v in (totals, linear, attention))  # type: ignore[return-value]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--link", choices=("both", "pcie", "nvlink"), default="both",
                        help="the all-reduces' link: the a100-pcie preset's PCIe, the NVLink bridge, or both columns")
    parser.add_argument("--pricing", choices=PRICINGS, default="spec", help="the sim's --sim-pricing")
    parser.add_argument("--overheads", choices=OVERHEADS, default="none", help="the sim's --sim-overheads")


def main(args: argparse.Namespace) -> None:
    specs = gpus(args.link)
    costs = {k: CostModel(YI_34B, g, 2, 1, 1, pricing_for(args.pricing, g), engine_overheads(args.overheads, g, 2))
             for k, g in specs.items()}
    rows, errors = [], {k: [] for k in costs}
    for step in all_steps():
        row = [step.name, step.source, f"{step.published_ms:.2f}"]
        for key, cost in costs.items():
            total, _, _ = price(cost, step)
            err = total / step.published_ms - 1
            errors[key].append((abs(err), step.name, err))
            row += [f"{total:.2f}", f"{100 * err:+.0f}%"]
        rows.append(row)
    headers = ["step", "artifact file", "published ms"]
    for key in costs:
        headers += [f"sim ms ({key})", f"error ({key})"]
    print(f"Yi-34B TP2 on 2xA100-80GB PCIe (pairwise NVLink); {ARTIFACT}; --sim-pricing {args.pricing}, "
          f"--sim-overheads {args.overheads}\n")
    print(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
    for key, errs in errors.items():
        worst = max(errs)
        within = sum(e <= 0.15 for e, _, _ in errs)
        print(f"\n{key}: {within} of {len(errs)} steps within +/-15% (the issue's target); worst {worst[1]} "
              f"{100 * worst[2]:+.0f}%")
    # The artifact's op-level split (table-2) beside the sim's: where the step's time goes.
    split = []
    for step in table2_steps():
        for key, cost in costs.items():
            total, linear, attention = price(cost, step)
            split.append([step.name, key, f"{step.linear_ms:.2f}", f"{linear:.2f}", f"{step.attention_ms:.2f}",
                          f"{attention:.2f}", f"{step.published_ms - step.linear_ms - step.attention_ms:.2f}",
                          f"{total - linear - attention:.2f}"])
    print("\ntable-2's operator split (ms): linear = QKV + O + gate/up + down, attention = the attention kernels; "
          "rest = the step less both\n")
    print(tabulate(split, headers=["step", "link", "linear published", "linear sim", "attention published",
                                   "attention sim", "rest published", "rest sim"], tablefmt="github",
                   disable_numparse=True))


if __name__ == "__main__":
    cli.run(__name__)

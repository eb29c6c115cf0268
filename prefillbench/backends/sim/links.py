"""The link between a sim's GPUs, as users own them (`--sim-link`): what carries the tensor-parallel all-reduces and
the pipeline's sends within a node.

A GPU preset names the link its usual server gives it (GPUSpec.link: an SXM part's NVLink through NVSwitch, a PCIe
card's PCIe slot) and, where the card takes one, its NVLink bridge (GPUSpec.bridge_bw). `--sim-link` names another
the same card can have:

- `pcie4`, `pcie5` (or `pcie`: the card's own generation): the slot, PCIe 4.0 x16 32 GB/s and 5.0 x16 64 GB/s a
  direction (PCI-SIG: 16 GT/s and 32 GT/s a lane, 128b/130b encoding; NVIDIA's datasheets say 64 and 128 GB/s,
  both directions). A card is refused a faster generation than its own.
- `nvlink-bridge`: NVLink bridges join two PCIe cards (A100 PCIe, H100 PCIe, H100 NVL: 600 GB/s both ways, 300 a
  direction; RTX A6000: 112.5 GB/s both ways). A bridge joins a pair only: past two GPUs (TP, EP and PP together)
  the traffic would cross PCIe between pairs, which the sim does not price, so it is refused in one line.
- `nvlink` (or `nvswitch`): every GPU of the node through NVSwitch at the SXM part's NVLink generation (A100: NVLink
  3, 300 GB/s a direction; H100 and H200: NVLink 4, 450; B200: NVLink 5, 900). A PCIe card has none.

The link's name and figure are said in the pricing line on stderr and kept in the export (`sim_link`,
`sim_link_gbs`); which all-reduce runs over it, and its measured curve, is collectives' part (pricing.py).
"""
from __future__ import annotations

from dataclasses import replace

from prefillbench.backends.sim.specs import GPUSpec, SimConfigError

#: PCIe x16 per direction by generation (PCI-SIG: 16 / 32 GT/s a lane; 31.5 / 63 GB/s after encoding, rounded as
#: NVIDIA's datasheets give 64 / 128 GB/s both ways).
PCIE_BW = {3: 16e9, 4: 32e9, 5: 64e9}
#: NVLink per GPU per direction through NVSwitch, by generation (NVIDIA's A100, H100 and DGX B200 datasheets: 600,
#: 900 and 1,800 GB/s both ways).
NVLINK_BW = {3: 300e9, 4: 450e9, 5: 900e9}
LINKS = ("pcie", "pcie4", "pcie5", "nvlink-bridge", "nvlink")
ALIASES = {"nvswitch": "nvlink", "bridge": "nvlink-bridge", "nvlink_bridge": "nvlink-bridge", "pcie-gen4": "pcie4",
           "pcie-gen5": "pcie5"}


def kind(link: str) -> str:
    """pcie | nvlink-bridge | nvlink | other (a link the sim only knows by its figure: Infinity Fabric, a spec file's)."""
    if link.startswith("pcie"):
        return "pcie"
    if link == "nvlink-bridge":
        return "nvlink-bridge"
    if link.startswith("nvlink"):
        return "nvlink"
    return "other"


def pcie_gen(link: str) -> int:
    return int(link[4:]) if link[4:].isdigit() else 0


def words(gpu: GPUSpec) -> str:
    """The GPU's link in words, for the pricing line: its name and figure a direction."""
    link = gpu.link or "unnamed link"
    k = kind(link)
    if k == "pcie":
        what = f"PCIe {pcie_gen(link)}.0 x16"
    elif k == "nvlink-bridge":
        what = "NVLink bridge (GPU pairs)"
    elif k == "nvlink":
        what = f"NVLink {link[6:]} through NVSwitch" if link[6:].isdigit() else "NVLink through NVSwitch"
    else:
        what = link
    return f"{what}, {gpu.interconnect_bw / 1e9:g} GB/s a direction"


def with_link(gpu: GPUSpec, name: str | None, n_gpus: int) -> GPUSpec:
    """The GPU with the link `name` (--sim-link) in place of its preset's, checked against what the card can have and
    against the GPUs that must talk over it (n_gpus: TP x EP groups x PP). None: the preset's own, checked too."""
    if name is None:
        if gpu.link == "nvlink-bridge" and n_gpus > 2:
            raise SimConfigError(_bridge_refusal(gpu, n_gpus))
        return gpu
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in LINKS and not (key.startswith("pcie") and key[4:].isdigit()):
        raise SimConfigError(f"--sim-link {name!r}: one of {', '.join(LINKS)} (nvswitch is nvlink)")
    own = gpu.link
    if key.startswith("pcie"):
        gen = pcie_gen(key) or max(gpu.pcie_gen, 0)
        if not gen:
            raise SimConfigError(f"--sim-link {name}: {gpu.name} has no PCIe generation on record; name pcie4 or pcie5")
        if gen not in PCIE_BW:
            raise SimConfigError(f"--sim-link {name}: PCIe generations priced are {', '.join(map(str, PCIE_BW))}")
        if gpu.pcie_gen and gen > gpu.pcie_gen:
            raise SimConfigError(f"--sim-link {name}: {gpu.name} is a PCIe {gpu.pcie_gen}.0 card; it runs no faster "
                                 f"slot than pcie{gpu.pcie_gen}")
        return replace(gpu, interconnect_bw=PCIE_BW[gen], link=f"pcie{gen}")
    if key == "nvlink-bridge":
        if not gpu.bridge_bw:
            has = (f"its NVLink is --sim-link nvlink" if kind(own) == "nvlink" else
                   "it takes no NVLink bridge: --sim-link pcie")
            raise SimConfigError(f"--sim-link nvlink-bridge: {gpu.name} has no NVLink bridge on record ({has})")
        if n_gpus > 2:
            raise SimConfigError(_bridge_refusal(gpu, n_gpus))
        return replace(gpu, interconnect_bw=gpu.bridge_bw, link="nvlink-bridge")
    # nvlink through NVSwitch: the SXM part's own
    if kind(own) != "nvlink":
        alt = "; it takes an NVLink bridge for pairs: --sim-link nvlink-bridge" if gpu.bridge_bw else ""
        raise SimConfigError(f"--sim-link nvlink: {gpu.name} is not an NVSwitch (SXM) part{alt}")
    return gpu


def _bridge_refusal(gpu: GPUSpec, n_gpus: int) -> str:
    return (f"--sim-link nvlink-bridge joins {gpu.name}s in pairs: {n_gpus} GPUs (TP x EP x PP) would cross PCIe "
            f"between pairs, which the sim does not price; use --tp 2 or --sim-link pcie")


def pricing_words(gpu: GPUSpec, measured: bool, engine: str, workers: int, stages: int) -> str:
    """The pricing line's end where GPUs talk (workers: the all-reduce's GPUs, TP x EP groups; stages: PP): the link
    and which all-reduce runs over it (engine: pricing.ALLREDUCE_ENGINE_OF's values)."""
    if workers * stages == 1:
        return ""
    link = f"; link {words(gpu)}"
    if workers == 1:
        return link
    if not measured:
        return (f"{link}; TP all-reduce a ring at {gpu.network_fraction:g} of it + "
                f"{gpu.collective_latency_s * 1e6:g} us (spec sheets)")
    from prefillbench.backends.sim.measured import allreduce

    k = kind(gpu.link)
    system = allreduce.measured_system(gpu.name, k, k == "nvlink-bridge")
    return f"{link}; TP all-reduce: {allreduce.describe(engine, workers, k, system)}"


__all__ = ["LINKS", "NVLINK_BW", "PCIE_BW", "kind", "pcie_gen", "pricing_words", "with_link", "words"]

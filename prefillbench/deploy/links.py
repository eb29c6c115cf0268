"""The links a prompt's KV crosses from a prefill instance to a decode instance, and what a transfer costs.

Each GPU of the prefill instance sends its shard of the KV (tensor parallelism splits it by heads) over its own
link, as DistServe and the engines' KV connectors do (one NIC per GPU in a DGX): with TP p prefilling and TP d
decoding, min(p, d) links carry it in parallel. A transfer is whole (after the prompt's last step, as vLLM's
NixlConnector pulls a finished prompt's blocks and DistServe sends them) or layer by layer (each layer's KV sent
as its layer of the last step finishes, as Mooncake's and LMCache's layer-wise modes do: only what the link
could not send during the step is left after it).

Links, and where each figure comes from:
- nvlink: two GPUs in one NVSwitch node, Vidur's measured NCCL send/recv (collectives.py: a100_dgx / h100_dgx);
- infiniband: two DGX nodes, one GPU each, over their NICs (Vidur's cross-node send/recv: HDR 200 Gb/s on the
  A100s, NDR 400 Gb/s on the H100s);
- pcie: the host bus, no profile: PCIe 4.0 x16 (A100 and older) or 5.0 x16 (H100 and newer) at 32 / 64 GB/s per
  direction (PCI-SIG), at the sim's flat 0.8 of a link and 10 us (cost.py's network pricing);
- ethernet: 100 GbE (12.5 GB/s, IEEE 802.3ba), the same flat rule.
A GPU with no profile takes the nearest profiled one's curve (H200 and B200: H100's), and its source says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from prefillbench.backends.sim.measured import collectives
from prefillbench.backends.sim.specs import SimConfigError

LINKS = ("nvlink", "infiniband", "pcie", "ethernet")
TRANSFERS = ("whole", "layerwise")
#: The sim's flat pricing of a link it has no profile for (cost.py: network_fraction, collective_latency_s).
FLAT_FRACTION = 0.8
FLAT_LATENCY_S = 10e-6
PCIE_BYTES_S = {4: 32e9, 5: 64e9}
ETHERNET_BYTES_S = 12.5e9
#: The profiled GPU each family prices its NVLink and InfiniBand with (collectives.GPU_ORDER).
PROFILED = {"h100": "h100", "h200": "h100", "b200": "h100", "gh200": "h100", "a100": "a100"}


@dataclass(frozen=True)
class Link:
    """One GPU's link to its peer: seconds to move `nbytes` (latency + bytes / bandwidth), and the figures' source."""

    name: str
    latency_s: float
    bytes_per_s: float
    source: str
    curve: collectives.CollectiveCurve | None = None  # a measured one, where the link has a profile

    def seconds(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        if self.curve is not None:
            return float(self.curve.seconds(nbytes))
        return self.latency_s + nbytes / self.bytes_per_s


def link(name: str, gpu: str) -> Link:
    """The named link of a GPU (the sim's GPU name, as 'H100-SXM')."""
    family = next((f for f in PROFILED if f in gpu.lower()), None)
    if name in ("nvlink", "infiniband"):
        profiled = PROFILED.get(family or "", "a100")
        topology = "nvlink_dgx" if name == "nvlink" else "cross_node"
        curve = collectives.collective("send_recv", 2, topology, profiled)
        note = "" if family == profiled else f"{gpu} has no profile: {profiled.upper()}'s; "
        return Link(name, curve.latency_s, curve.bus_bw, note + curve.source, curve)
    if name == "pcie":
        gen = 5 if family in ("h100", "h200", "b200", "gh200") else 4
        bw = PCIE_BYTES_S[gen] * FLAT_FRACTION
        return Link(name, FLAT_LATENCY_S, bw, f"PCIe {gen}.0 x16 spec ({PCIE_BYTES_S[gen] / 1e9:g} GB/s a "
                    f"direction, PCI-SIG) at {FLAT_FRACTION:g} of it and {FLAT_LATENCY_S * 1e6:g} us")
    if name == "ethernet":
        return Link(name, FLAT_LATENCY_S, ETHERNET_BYTES_S * FLAT_FRACTION,
                    f"100 GbE spec (12.5 GB/s, IEEE 802.3ba) at {FLAT_FRACTION:g} of it and {FLAT_LATENCY_S * 1e6:g} us")
    raise SimConfigError(f"unknown KV link {name!r}: one of {', '.join(LINKS)}")


def transfer_seconds(kv_bytes: float, via: Link, links: int, layers: int, mode: str, last_step_s: float,
                     last_share: float = 1.0, prefill_span_s: float | None = None) -> float:
    """Seconds after a prompt's last step until its KV (`kv_bytes`, the whole model's) is at the decode instance,
    over `links` links in parallel.

    Layer by layer, what each step computes leaves as its layers finish: the last step's share of the KV
    (`last_share`: its chunk's tokens over the prompt's) goes layer i at a time when its layer of the step ends (the
    step's time split evenly across its layers) or when the link is free, whichever is later; the earlier chunks'
    went during their own steps, unless the link could not keep up: the whole KV takes at least its whole-transfer
    time from the prompt's first step (`prefill_span_s` before the last step's end)."""
    share = kv_bytes / max(links, 1)
    if mode == "whole":
        return via.seconds(share)
    if mode != "layerwise":
        raise SimConfigError(f"unknown KV transfer {mode!r}: one of {', '.join(TRANSFERS)}")
    per_layer = via.seconds(share * last_share / layers)
    free = 0.0  # when the link is free, from the last step's start
    for i in range(layers):
        free = max(free, (i + 1) * last_step_s / layers) + per_layer
    exposed = max(free - last_step_s, 0.0)
    if prefill_span_s is not None:
        exposed = max(exposed, via.seconds(share) - prefill_span_s)
    return exposed

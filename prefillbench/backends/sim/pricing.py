"""How the sim prices one operator: from spec sheets, or from curves fitted to measured GPU profiles.

`spec` (the default) is the roofline at flat attained shares of the spec sheet's peaks (GPUSpec's
compute_fraction, memory_fraction, network_fraction): cost.py's own arithmetic, unchanged.

`measured` prices each operator by its class's curve in measured/ (fitted to Vidur's profiles, the fit and test
data kept apart there): linears and experts by the GEMM curve (a floor, then a smooth max of compute and memory,
so the ridge costs what the kernels show), norms, rotary, activation and residual adds by the elementwise curve (a
floor per kernel), prefill attention by the FlashAttention curve (its rate rising with the launch's query rows, the
causal diagonal dearer), decode attention by its bandwidth share, and collectives by the alpha-beta curves measured
on NVLink and across nodes. A curve is a share of its profiled GPU's peaks: on another GPU the same shares of that
GPU's own peaks price it (its spec ratios scale the profile), which `approximations` names.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from prefillbench.backends.sim.specs import GiB, GPUSpec, SimConfigError

PRICINGS = ("spec", "measured")
#: --sim-overheads: whose per-step costs a step pays beyond its kernels (measured/overheads.py's presets).
OVERHEADS = ("vllm", "vllm-v0", "sglang", "tensorrt-llm", "sarathi", "none")
#: --sim-overheads -> whose all-reduce kernels the TP all-reduces run (measured/allreduce.py): vLLM V0 and V1 their
#: custom all-reduce, SGLang its port of it, TensorRT-LLM its AllReduce; Sarathi-Serve's fork and no engine NCCL.
ALLREDUCE_ENGINE_OF = {"vllm": "vllm", "vllm-v0": "vllm", "sglang": "sglang", "tensorrt-llm": "trtllm",
                       "sarathi": "nccl", "none": "nccl"}

#: A GPU preset -> the profiled GPU whose curves price it. The same part, or the nearest of its kind: Hopper and
#: Blackwell HBM parts (and AMD's MI300X, no AMD part being profiled) on the H100's, Ampere HBM on the A100's,
#: GDDR workstation parts (GA102, AD102) on the A40's (GA102).
PROFILE_OF = {"A100-SXM": "a100", "A100-PCIe": "a100", "H100-SXM": "h100", "H200": "h100", "B200": "h100",
              "MI300X": "h100", "L40S": "a40", "A6000": "a40", "H100-PCIe": "h100", "H100-NVL": "h100", "L4": "a40",
              "RTX6000-Ada": "a40"}
#: Profiled GPUs' own presets (their spec peaks are what the curves' shares are of).
PROFILED = {"a100": "A100-SXM", "h100": "H100-SXM", "a40": "A40"}
#: Elementwise kernels a layer runs, as Vidur's profile lists them: two norms, rotary, activation, residual add.
ELEMENTWISE_KERNELS = 5


#: A GPU given by a spec file: its family by the name's start (NVIDIA's part names), the profiled GPU of that
#: generation and memory kind; AMD parts (no profile) as the MI300X preset is priced.
FAMILIES = (("A100", "a100"), ("A800", "a100"), ("A30", "a100"), ("GH", "h100"), ("GB", "h100"), ("H", "h100"),
            ("B", "h100"), ("MI", "h100"), ("A40", "a40"), ("A6000", "a40"), ("A10", "a40"), ("L", "a40"),
            ("RTX", "a40"))
#: The profiled parts' spec peaks (FLOP/s, bytes/s), for a GPU whose name says nothing: the nearest in both.
PROFILED_PEAKS = {"a100": (312e12, 2039e9), "h100": (989e12, 3.35e12), "a40": (149.7e12, 696e9)}


def profile_of(gpu: GPUSpec) -> tuple[str, str]:
    """(profile, how it was chosen) for a GPU: its preset's, its name's family, or the profiled part nearest in the
    log of its peak FLOP/s and bandwidth. A CPU has none."""
    name = gpu.name.removesuffix(" calibrated")
    if name in PROFILE_OF:
        return PROFILE_OF[name], "preset"
    if name.upper().startswith("CPU"):
        raise SimConfigError(f"--sim-pricing measured: no measured profile prices {name} (profiled: H100, A100, A40, "
                             f"and parts of their families); use --sim-pricing spec")
    for prefix, profile in FAMILIES:
        if name.upper().startswith(prefix):
            return profile, f"{name}'s family ({prefix}...)"
    near = min(PROFILED_PEAKS, key=lambda p: abs(math.log(gpu.flops / PROFILED_PEAKS[p][0]))
               + abs(math.log(gpu.mem_bw / PROFILED_PEAKS[p][1])))
    return near, "the profiled GPU nearest in peak FLOP/s and bandwidth"


@dataclass(frozen=True)
class MeasuredPricing:
    """Operator times for `gpu` from the curves of its profile (PROFILE_OF)."""

    gpu: GPUSpec
    profile: str
    notes: list[str] = field(default_factory=list, compare=False)
    #: (GEMM, elementwise, attention) curves fitted by `calibrate` on a device (calibration_measured); None: the
    #: profile's
    fitted: tuple | None = field(default=None, compare=False)

    @classmethod
    def for_gpu(cls, gpu: GPUSpec) -> "MeasuredPricing":
        profile, how = profile_of(gpu)
        notes = []
        if PROFILED[profile] != gpu.name:
            chosen = "" if how == "preset" else f" ({how})"
            notes.append(f"--sim-pricing measured: {gpu.name} is not profiled; priced by {PROFILED[profile]}'s "
                         f"measured curves (microsoft/vidur){chosen} at the same shares of {gpu.name}'s own peaks")
        notes.append("--sim-pricing measured: attention by FlashAttention's A100 profile (Vidur), as shares of each "
                     "GPU's peaks; the TP all-reduce by the engine's own kernel or NCCL, as the engine picks, from "
                     "AIConfigurator's measured tables; other collectives by NCCL's measured curves (Vidur)")
        return cls(gpu, profile, notes)

    @classmethod
    def calibrated(cls, gpu: GPUSpec, curves: tuple) -> "MeasuredPricing":
        """The same terms with a calibration's numbers: the device's own curves, no profile's."""
        return cls(gpu, "calibrated", [f"--sim-pricing measured: every curve and the host line fitted by calibrate on "
                                       f"{gpu.name} (collectives, if any, by NCCL's measured curves)"], curves)

    def _curves(self):
        return self.fitted if self.fitted is not None else _curves(self.profile)

    def linear(self, flops: float, nbytes: float, fp8: bool = False) -> float:
        gemm = self._curves()[0]
        peak = self.gpu.fp8_flops if fp8 and self.gpu.fp8_flops else self.gpu.flops
        return float(gemm.seconds(flops, nbytes, peak, self.gpu.mem_bw))

    def elementwise(self, nbytes: float, kernels: int = 1) -> float:
        pooled = self._curves()[1]
        return kernels * pooled.floor_s + nbytes / (pooled.memory_eff * self.gpu.mem_bw)

    def prefill_attention(self, flops: float, nbytes: float, query_rows: float, diag_flops: float) -> float:
        return float(self._curves()[2].prefill_seconds(flops, nbytes, self.gpu.flops, self.gpu.mem_bw, query_rows,
                                                       diag_flops))

    def decode_attention(self, flops: float, nbytes: float) -> float:
        return float(self._curves()[2].decode_seconds(nbytes, flops, self.gpu.flops, self.gpu.mem_bw))

    def collective(self, kind: str, message_bytes: float, workers: int, across_nodes: bool = False,
                   topology: str = "nvlink_dgx") -> float:
        """A collective of one message among `workers` GPUs: the measured curve of the profiled GPU (the newest
        profiled with that topology where its own has none), its bandwidth scaled by this GPU's link over the
        profiled one's (an NVLink bridge's: PAIRWISE_BW)."""
        curve, (nvlink, network) = _collective(self.profile, kind, workers, across_nodes, topology)
        if topology == "pairwise_nvlink":
            nvlink = PAIRWISE_BW
        scale = (self.gpu.network_bw / network) if across_nodes else (self.gpu.interconnect_bw / nvlink)
        return float(curve.seconds(message_bytes / scale))

    def all_reduce(self, message_bytes: float, workers: int, engine: str) -> float:
        """The tensor-parallel all-reduce of one message within a node as `engine` (ALLREDUCE_ENGINE_OF's values)
        runs it over this GPU's link: its own kernel where it picks it, else NCCL (measured/allreduce.py)."""
        from prefillbench.backends.sim import links

        if links.kind(self.gpu.link) == "other":  # no engine kernel measured over it (Infinity Fabric, a spec
            return self.collective("all_reduce", message_bytes, workers)  # file's unnamed link): NCCL's, as before
        return _all_reduce_seconds(self.gpu.name, self.gpu.link, self.gpu.interconnect_bw, engine, workers,
                                   message_bytes)


#: The NVLink bridge Vidur's pairwise profiles ran over (A100 PCIe pairs), a direction: 600 GB/s both ways.
PAIRWISE_BW = 300e9


@lru_cache(maxsize=None)
def _collective(profile: str, kind: str, workers: int, across_nodes: bool, topology: str = "nvlink_dgx"):
    """The measured curve of a collective and the links of the GPU it was measured on (a pipeline's send is priced
    every step: the lookup and its source text once)."""
    from prefillbench.backends.sim.measured import collectives

    topology = "cross_node" if across_nodes else topology
    try:
        curve = collectives.collective(kind, workers, topology, profile)
    except SimConfigError:
        curve = collectives.collective(kind, workers, topology)
    return curve, collectives.FLAT_LINKS[curve.gpu]  # the profiled GPU's links (its preset's)


@lru_cache(maxsize=4096)
def _all_reduce_seconds(gpu: str, link: str, link_bw: float, engine: str, workers: int, nbytes: float) -> float:
    """MeasuredPricing.all_reduce, once per message size: a run prices the same few sizes over and over."""
    from prefillbench.backends.sim import links
    from prefillbench.backends.sim.measured import allreduce

    if workers <= 1:
        return 0.0
    kind = links.kind(link)
    custom = allreduce.uses_custom(engine, workers, kind, nbytes)
    measured = min((2, 4, 8), key=lambda w: (abs(math.log(w / workers)), -w))  # the nearest GPU count measured
    if kind == "nvlink-bridge":
        if not custom:  # NCCL over the bridge: Vidur's measured A100 PCIe pairs
            pairwise, _ = _collective("a100", "all_reduce", workers, False, "pairwise_nvlink")
            return float(pairwise.seconds(nbytes * PAIRWISE_BW / link_bw))
        system = "a100_sxm"  # no custom all-reduce measured over a bridge: NVLink 3's, the bridge's 300 GB/s
    else:
        system = allreduce.measured_system(gpu, kind)
    curve = allreduce.curve(system, engine if custom else "nccl", measured)
    return curve.seconds(nbytes * allreduce.SYSTEM_BW[system] / link_bw)


@lru_cache(maxsize=None)
def _curves(profile: str):
    from prefillbench.backends.sim.measured import attention, linear

    gemm, elementwise = linear.shipped_curves(profile)
    return gemm, elementwise, attention.shipped_attention()


def default_pricing(gpu: GPUSpec, calibrated: bool) -> tuple[str, str]:
    """The pricing a run gets with no --sim-pricing, and why: the measured curves wherever a profile covers the GPU
    (its preset or its family; 51 of 58 published rows within 25% against the spec sheets' 22, rerun 2026-12-06:
    docs/sim.md), the
    spec sheets where none does (a CPU, a device whose name no profile's family holds) and for a calibration (its
    spec fit is the file's own device; --sim-pricing measured takes its measured fit)."""
    if calibrated:
        return "spec", "a calibration prices by its spec fit unless --sim-pricing measured"
    try:
        profile, how = profile_of(gpu)
    except SimConfigError:
        return "spec", f"no measured profile covers {gpu.name}"
    if how == "preset" or how.endswith("...)"):
        return "measured", f"{PROFILED[profile]}'s measured profile covers {gpu.name}"
    return "spec", f"no measured profile covers {gpu.name} (its name is of no profiled family)"


def pricing_for(name: str, gpu: GPUSpec) -> MeasuredPricing | None:
    """None for spec (cost.py's roofline), else the measured pricing for gpu."""
    if name not in PRICINGS:
        raise SimConfigError(f"--sim-pricing {name!r}: one of {', '.join(PRICINGS)}")
    return MeasuredPricing.for_gpu(gpu) if name == "measured" else None


def engine_overheads(name: str, gpu: GPUSpec, tp: int = 1):
    """The named engine's overheads with its defaults on this GPU (measured/overheads.py: EngineOverheads); None
    for none, the GPU's work alone."""
    if name not in OVERHEADS:
        raise SimConfigError(f"--sim-overheads {name!r}: one of {', '.join(OVERHEADS)}")
    if name == "none":
        return None
    from prefillbench.backends.sim.measured.overheads import ENGINE_OVERHEADS

    return ENGINE_OVERHEADS[name].for_gpu(gpu.name.removesuffix(" calibrated"), gpu.mem_bytes / GiB, tp)


__all__ = ["OVERHEADS", "engine_overheads", "ELEMENTWISE_KERNELS", "MeasuredPricing", "PRICINGS", "PROFILED", "PROFILE_OF", "pricing_for", "profile_of"]

"""The sim's host tier (`--kv-host-cache GiB`, vLLM's `--kv-offloading-size`): its capacity in blocks from the model's
KV bytes per token, and a load's time over the GPU's host link.

- Capacity: GiB over the whole instance (vLLM's kv_offloading_size "is the total buffer size summed across all TP
  ranks", config/cache.py CacheConfig), each token holding its KV on every GPU of the instance.
- Link: the card's PCIe slot, PCIe 4.0 / 5.0 x16 at links.PCIE_BW a direction (the link's rate after encoding; what
  a copy achieves is lower, about 25 / 50 GB/s: so these loads are priced at their floor). Each GPU loads its own
  share of a token's KV over its own slot, in parallel. `--kv-host-link c2c` prices NVLink-C2C instead (GH200 /
  GB200: 450 GB/s a direction, NVIDIA's datasheets), and `--kv-host-link N` a tier N GB/s a direction away (an NVMe
  drive's 3-7, a 400 Gb/s NIC's 50): a slower tier's loads lose to recomputing sooner. Without --kv-host-link a card
  with no PCIe generation the sim knows is refused.
- Pricing under vllm-v1 (engine/host_tier.py): a load is asynchronous, as vLLM runs it. The request gets its blocks
  at admission and waits (WAITING_FOR_REMOTE_KVS) while the other requests' steps run; its load takes `load_seconds`
  over the link, loads in flight crossing it one after another (each starts once the one before is done: one link,
  its full rate to each), and the request is scheduled at the first step boundary after its load is done (vLLM's
  worker reports it with a step's output; the scheduler takes it up at the next schedule). With nothing else to run
  the engine waits for it. So a load costs the loading request its wait and the batch nothing. Under SGLang's rules
  (HiCache, engine/hicache.py) a load is still a wait added to the step that runs the request's chunk
  (Step.host_loads, below), as HiCache's load_back is waited for before the batch runs. Stores (GPU -> host) are
  not priced: vLLM runs them on another stream after the step, off its critical path where the link keeps up.
- Recompute instead: where computing the run of host blocks again, as a lone chunk from where the GPU's hit ends, is
  priced below loading it (engine/host_tier.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from prefillbench.backends.sim import links
from prefillbench.backends.sim.breakdown import Batch
from prefillbench.backends.sim.specs import SimConfigError

GiB = 1024 ** 3


#: NVLink-C2C between a Grace CPU and its GPU (GH200, GB200), a direction: NVIDIA's datasheets (900 GB/s both ways).
C2C_BW = 450e9


@dataclass(frozen=True)
class HostLink:
    """What a host tier's loads cross, named as the pricing line says it, at `bw` bytes/s a direction per GPU."""

    name: str
    bw: float


def parse_link(text: str | None) -> HostLink | None:
    """--kv-host-link: pcie (None: the card's own slot), c2c, or a rate in GB/s; one line where it is none of them."""
    if text is None or text == "pcie":
        return None
    if text == "c2c":
        return HostLink("NVLink-C2C", C2C_BW)
    try:
        gbps = float(text)
    except ValueError:
        raise SimConfigError(f"--kv-host-link {text}: give pcie, c2c or a rate in GB/s a direction") from None
    if not 0 < gbps < float("inf"):
        raise SimConfigError(f"--kv-host-link {text}: a rate in GB/s above 0")
    return HostLink(f"--kv-host-link {gbps:g}", gbps * 1e9)


def check(gib: float | None, gpu, pp: int = 1, dp: int = 1, link: HostLink | None = None) -> None:
    """--kv-host-cache: a positive size, on a card whose host link the sim knows, one stage and one rank (a
    pipeline's and the data-parallel ranks' steps do not price the loads); one line each."""
    if gib is None:
        return
    if not gib > 0:
        raise SimConfigError(f"--kv-host-cache is a size in GiB above 0, got {gib:g}")
    if pp > 1 or dp > 1:
        raise SimConfigError("--kv-host-cache: the sim prices a host tier with one pipeline stage and one "
                             "data-parallel rank (--pp 1 --dp 1)")
    if link is None and gpu.pcie_gen not in links.PCIE_BW:
        raise SimConfigError(f"--kv-host-cache: {gpu.name} has no PCIe generation the sim knows, so no host link "
                             "to price loads over")


def host_link_bw(gpu) -> float:
    """Bytes/s a direction between one GPU and host memory: its PCIe slot."""
    return links.PCIE_BW[gpu.pcie_gen]


def link_of(backend) -> HostLink:
    """The backend's host link: --kv-host-link's, else the card's PCIe slot."""
    return backend.kv_host_link or HostLink(f"PCIe {backend.gpu.pcie_gen}.0 x16", host_link_bw(backend.gpu))


def load_seconds(backend, tokens: int) -> float:
    """`tokens` tokens' KV moved from host memory to the GPUs, each GPU its share over its own link."""
    return tokens * backend.cost.kv_bytes_per_token_per_gpu() / link_of(backend).bw


def recompute_seconds(backend, start: int, tokens: int) -> float:
    """`tokens` prompt tokens computed again from position `start`, as a chunk alone in a step."""
    return backend.cost.seconds(Batch(((start, tokens, False),)))


def capacity_blocks(backend, gib: float, block_size: int) -> int:
    """Blocks of `block_size` tokens that `gib` GiB of host memory hold across the instance's GPUs."""
    per_token = backend.cost.kv_bytes_per_token_per_gpu() * backend.cost.n_gpus
    return int(gib * GiB // (per_token * block_size))


def host_tier(backend, block_size: int) -> tuple[int, object, object] | None:
    """The run's host tier as the engine builds it (engine/host_tier.py HostTier): its blocks, a load's seconds and a
    recompute's (None: no --kv-host-cache)."""
    gib = backend.kv_host_gib
    if gib is None:
        return None
    blocks = capacity_blocks(backend, gib, block_size)
    if blocks < 1:
        raise SimConfigError(f"--kv-host-cache {gib:g} GiB holds no block of {block_size} tokens")
    return blocks, lambda n: load_seconds(backend, n), lambda s, n: recompute_seconds(backend, s, n)


def words(backend) -> str:
    """The host link in words, for the pricing line."""
    return (f"--kv-host-cache {backend.kv_host_gib:g} GiB: a host tier of "
            f"{capacity_blocks(backend, backend.kv_host_gib, 1):,} tokens (vLLM's connector: "
            f"{capacity_blocks(backend, backend.kv_host_gib, 16):,} blocks of 16; SGLang's HiCache: one-token pages), "
            "loads over "
            f"{link_of(backend).name} at {link_of(backend).bw / 1e9:g} GB/s a direction, one after another; "
            "vllm-v1 waits for a request's load while other steps run (vLLM's async load), SGLang's rules add "
            "it to the step of the request's chunk; stores not priced (docs/memory.md, Host tier)")

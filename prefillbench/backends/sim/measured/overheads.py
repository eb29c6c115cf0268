"""What an engine costs per step beyond its kernels: host (CPU) time, kernel launches, CUDA graphs, and its limits.

Three terms, each per step (each preset names every figure's source in `source`; docs/sim.md "Measured pricing"
says how they combine):

- cpu_seconds(n_seqs, n_tokens, tp): the engine's host work the GPU waits for: scheduling, preparing inputs,
  sampling, processing outputs. cpu_base_s + cpu_per_seq_s x sequences (+ cpu_per_token_s x prompt tokens beyond
  one a sequence, 0 here: no profile measures it) + cpu_per_tp_s once when tp > 1 (driving the other workers).
- launch_seconds(...): the host's time to issue the step's kernels. Outside a CUDA graph every kernel is one
  launch (launch_s); a decode-only step of up to graph_max_batch sequences replays one captured graph
  (graph_launch_s); an engine with piecewise graphs (vLLM V1) runs steps of up to piecewise_max_tokens tokens as
  one replay per piece plus the kernels left outside the graphs (attention).
- How the terms combine (step_seconds). Launches are asynchronous, so the GPU finishes at
  max(GPU time, launch time), not the sum. An engine that overlaps its host work with the GPU (overlapped: vLLM
  V1's async scheduling, SGLang's overlap scheduler, TensorRT-LLM's overlap scheduler) costs
  max(cpu - exposed, device) + exposed, where exposed (exposed_s, at most cpu) is the host work no overlap hides;
  one that does not (Sarathi-Serve as Vidur profiled it) costs cpu + device. So overlap never costs more.

Fit and test (the issue: overheads fitted on one batch size, tested on the others): the "sarathi" preset is
fitted on Vidur's measured CPU overheads (microsoft/vidur 6d98aa8, data/profiling/a100/cpu_overheads.csv,
Sarathi-Serve on A100: 6 models, TP 1-4, batch 8-128; shipped as data/cpu_overheads_a100.csv). A line in the
batch needs two numbers, so the per-sequence slope is fitted on one model (FIT_MODEL, TP 1, every batch size) and
the base and the tp term on one batch size (FIT_BATCH, every model); the other 60 rows (five models x eleven batch
sizes) are held out, and held_out() gives each one's error. The other engines have no such profile: their figures
are published ones (blogs, PRs, the engines' own defaults in source), or derived from those and marked so.
"""
from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

VIDUR_REPO = "microsoft/vidur"
CPU_COMMIT = "6d98aa8f71696520acc603d87439e77cc78160a7"  # "Prepare for open-source release", 2024-05-09
CPU_PATH = "data/profiling/a100/cpu_overheads.csv"  # removed from Vidur's main in bee57da
DATA_DIR = Path(__file__).resolve().parent / "data"
CPU_SAMPLE = DATA_DIR / "cpu_overheads_a100.csv"

#: The host operations Vidur adds to a step (vidur/entities/execution_time.py: _get_cpu_overhead), each timed by
#: Sarathi-Serve's CpuTimer (sarathi/metrics/cpu_timer.py synchronizes the GPU before it stops, so the sampler's
#: time holds the LM head and sampling kernels). model_execution_e2e is left out as Vidur leaves it out: its
#: operator profiles price the model.
COMPONENTS = ("schedule", "sampler_e2e", "prepare_inputs_e2e", "process_model_outputs")
#: Fit on: the slope on this model's rows (TP 1, batch 8-128), the base and the tp term on this batch size.
FIT_MODEL = "Llama-2-7b-hf"
FIT_BATCH = 8
MS = 1e-3
US = 1e-6

ENGINES = ("vllm", "vllm-v0", "sglang", "tensorrt-llm", "sarathi", "none")


# ---- Vidur's measured CPU overheads -------------------------------------------------------------------------------
@dataclass(frozen=True)
class CpuOverheadRow:
    """One (model, batch size, TP) run of Vidur's CPU-overhead profiler (vidur/profiling/cpu_overhead/): Sarathi-Serve
    serving `batch` requests of 256 prompt and 3 x batch output tokens at max_num_seqs = batch, so most steps
    are decode steps of `batch` sequences; the medians and means are over its steps, in ms."""

    model: str
    batch: int
    tp: int
    medians_ms: tuple[float, ...]  # COMPONENTS, in order
    means_ms: tuple[float, ...]
    ray_comm_ms: float  # wall time per step not inside a timer (Ray's dispatch to the workers, untimed Python): a mean

    @property
    def seconds(self) -> float:
        """The step's host time as Vidur prices it: the components' medians plus ray_comm_time."""
        return (sum(self.medians_ms) + self.ray_comm_ms) * MS

    @property
    def mean_seconds(self) -> float:
        return (sum(self.means_ms) + self.ray_comm_ms) * MS

    @property
    def spread(self) -> float:
        """|mean - median| / median of the step's host time: how far the run's own typical step is pinned down."""
        return abs(self.mean_seconds - self.seconds) / self.seconds


def parse_cpu_overheads(text: str) -> list[CpuOverheadRow]:
    """Rows of Vidur's cpu_overheads.csv, or of the shipped sample (the same columns, comment lines first)."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    rows = []
    for r in csv.DictReader(lines):
        model = r["model_name"].rsplit("/", 1)[-1]
        rows.append(CpuOverheadRow(model, int(r["batch_size"]), int(r["tensor_parallel_degree"]),
                                   tuple(float(r[f"{c}_median"]) for c in COMPONENTS),
                                   tuple(float(r[f"{c}_mean"]) for c in COMPONENTS), float(r["ray_comm_time_mean"])))
    return rows


def sample_text(rows: list[CpuOverheadRow]) -> str:
    """The shipped sample: every row, the four components' medians and means and ray_comm_time, to 0.1 us."""
    out = io.StringIO()
    out.write(f"# Source: {VIDUR_REPO} at {CPU_COMMIT}, {CPU_PATH} (Sarathi-Serve on A100; ms per step).\n"
              "# Kept: the components Vidur adds to a step (schedule, sampler_e2e, prepare_inputs_e2e,\n"
              "# process_model_outputs: median and mean) and ray_comm_time_mean; the *_launch columns and\n"
              "# model_execution_e2e are dropped; model_name without its org. Every run kept (batch 64 twice, as\n"
              "# there). Made by overheads.sample_text(overheads.parse_cpu_overheads(<Vidur's file>)).\n")
    cols = ["model_name", "batch_size", "tensor_parallel_degree"] + [f"{c}_median" for c in COMPONENTS] + \
        [f"{c}_mean" for c in COMPONENTS] + ["ray_comm_time_mean"]
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(cols)
    for r in rows:
        writer.writerow([r.model, r.batch, r.tp, *(f"{v:.4f}" for v in (*r.medians_ms, *r.means_ms, r.ray_comm_ms))])
    return out.getvalue()


@lru_cache(maxsize=4)
def load_cpu_overheads(path: str | None = None) -> tuple[CpuOverheadRow, ...]:
    """The shipped sample, or Vidur's own file given by path (the csv, or a checkout of 6d98aa8 holding it)."""
    p = Path(path) if path else CPU_SAMPLE
    if p.is_dir():
        p = p / CPU_PATH
    return tuple(parse_cpu_overheads(p.read_text()))


def undersized(rows) -> set[tuple[str, int, int]]:
    """(model, batch, tp) of runs whose schedule time falls below a smaller batch's of the same model and TP.
    Scheduling grows with the running sequences in every other run (0.16 ms at 8 to 2.0 ms at 128), so these ran
    fewer sequences than their batch size says (Qwen-72B at TP 4, batch 112 and 128: KV memory, most likely)."""
    out = set()
    for r in rows:
        if any(o.model == r.model and o.tp == r.tp and o.batch < r.batch and o.medians_ms[0] > r.medians_ms[0]
               for o in rows):
            out.add((r.model, r.batch, r.tp))
    return out


@dataclass(frozen=True)
class CpuFit:
    """A line in the batch, with a step cost for driving tp > 1 workers."""

    base_s: float
    per_seq_s: float
    per_tp_s: float
    fit_model: str
    fit_batch: int
    n_fit_rows: int

    def seconds(self, batch: int, tp: int) -> float:
        return self.base_s + self.per_seq_s * batch + (self.per_tp_s if tp > 1 else 0.0)

    def is_fit_row(self, row: CpuOverheadRow) -> bool:
        return row.model == self.fit_model or row.batch == self.fit_batch


def fit_cpu_overheads(rows, fit_model: str = FIT_MODEL, fit_batch: int = FIT_BATCH) -> CpuFit:
    """Slope: least squares on fit_model's rows (TP 1, every batch). Base: the median over the TP 1 runs at
    fit_batch of (time - slope x batch); tp term: the same median over the TP > 1 runs, less the base. A median,
    not a mean, so one odd run cannot move it; the tp term is flat because Vidur's ray_comm_time is (5.3-6.9 ms
    at TP 2 and at TP 4 alike)."""
    own = [r for r in rows if r.model == fit_model]
    if len(own) < 2:
        raise ValueError(f"no rows of {fit_model} to fit a slope on")
    mb = statistics.fmean(r.batch for r in own)
    mt = statistics.fmean(r.seconds for r in own)
    slope = sum((r.batch - mb) * (r.seconds - mt) for r in own) / sum((r.batch - mb) ** 2 for r in own)
    at = [r for r in rows if r.batch == fit_batch]
    single = [r.seconds - slope * r.batch for r in at if r.tp == 1]
    multi = [r.seconds - slope * r.batch for r in at if r.tp > 1]
    if not single:
        raise ValueError(f"no TP 1 run at batch {fit_batch} to fit the base on")
    base = statistics.median(single)
    per_tp = statistics.median(multi) - base if multi else 0.0
    return CpuFit(base, slope, per_tp, fit_model, fit_batch, sum(r.model == fit_model or r.batch == fit_batch
                                                                 for r in rows))


@dataclass(frozen=True)
class HeldOut:
    model: str
    batch: int
    tp: int
    measured_s: float
    predicted_s: float
    spread: float  # the row's own |mean - median| / median
    undersized: bool  # ran fewer sequences than its batch size (see undersized())

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


def held_out(rows, fit: CpuFit) -> list[HeldOut]:
    """Every row the fit did not see, with the fit's prediction."""
    small = undersized(rows)
    return [HeldOut(r.model, r.batch, r.tp, r.seconds, fit.seconds(r.batch, r.tp), r.spread,
                    (r.model, r.batch, r.tp) in small) for r in rows if not fit.is_fit_row(r)]


# ---- the overheads of an engine ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineOverheads:
    """One engine's per-step costs beyond its kernels, and its default limits. `source` names each figure's origin."""

    name: str  # one of ENGINES
    cpu_base_s: float
    cpu_per_seq_s: float
    cpu_per_tp_s: float  # once per step when tp > 1
    launch_s: float  # host time per kernel launched outside a CUDA graph
    graph_launch_s: float  # one CUDA-graph replay
    graph_max_batch: int  # decode-only steps of up to this many sequences run as one graph (0: never)
    max_num_seqs: int  # the engine's default cap on sequences in a step (0: none)
    max_num_batched_tokens: int  # its default token budget per step (0: none)
    source: str
    overlapped: bool = False  # host work runs beside the GPU's previous step: max(), not the sum (terms())
    exposed_s: float = 0.0  # host time per step an overlapped engine still leaves on the critical path
    graph_sizes: tuple[int, ...] = ()  # captured decode batch sizes when the engine does not pad to the next one
    piecewise_max_tokens: int = 0  # other steps up to this many tokens run piecewise graphs (0: eager)
    cpu_per_token_s: float = 0.0  # per prompt token beyond one a sequence (input preparation); unmeasured: 0
    version: str = ""

    def cpu_seconds(self, n_seqs: int, n_tokens: int, tp: int) -> float:
        if n_seqs <= 0 and n_tokens <= 0:
            return 0.0
        return (self.cpu_base_s + self.cpu_per_seq_s * n_seqs
                + self.cpu_per_token_s * max(0, n_tokens - n_seqs) + (self.cpu_per_tp_s if tp > 1 else 0.0))

    def graph_mode(self, decode_only: bool, n_seqs: int, n_tokens: int | None = None) -> str:
        """'full' (one replay), 'piecewise' (a replay per piece, attention eager) or 'eager' for such a step."""
        tokens = n_seqs if n_tokens is None else n_tokens
        if decode_only and 0 < n_seqs <= self.graph_max_batch and (not self.graph_sizes or n_seqs in self.graph_sizes):
            return "full"
        if 0 < tokens <= self.piecewise_max_tokens:
            return "piecewise"
        return "eager"

    def launch_seconds(self, n_kernels: int, decode_only: bool, n_seqs: int, *, n_tokens: int | None = None,
                       eager_kernels: int = 0, graph_pieces: int = 0) -> float:
        """Host time to issue one step's n_kernels. A piecewise step issues graph_pieces replays (vLLM: one per
        layer plus one) and its eager_kernels (attention) one by one; without those counts it is priced eager."""
        mode = self.graph_mode(decode_only, n_seqs, n_tokens)
        if mode == "full":
            return self.graph_launch_s
        if mode == "piecewise" and graph_pieces > 0:
            return graph_pieces * self.graph_launch_s + eager_kernels * self.launch_s
        return n_kernels * self.launch_s

    def device_seconds(self, gpu_s: float, n_kernels: int, decode_only: bool, n_seqs: int, **graph) -> float:
        """When the GPU finishes the step: launches are asynchronous, so the later of its work and the host's issue."""
        return max(gpu_s, self.launch_seconds(n_kernels, decode_only, n_seqs, **graph))

    def step_seconds(self, gpu_s: float, n_seqs: int, n_tokens: int, tp: int, n_kernels: int, decode_only: bool,
                     after_idle: bool = False, **graph) -> float:
        """terms(...)["step"] with no dict built: the sim prices every simulated step by it (CostModel.fast_seconds)."""
        device, host, exposed = self._parts(gpu_s, n_seqs, n_tokens, tp, n_kernels, decode_only, after_idle, graph)
        return device + host + exposed

    def terms(self, gpu_s: float, n_seqs: int, n_tokens: int, tp: int, n_kernels: int, decode_only: bool,
              after_idle: bool = False, **graph) -> dict[str, float]:
        """The step's time and what each term adds to the GPU's own (for a trace or --verbose). after_idle: the
        GPU ran nothing before this step (the engine waited for a request), so an overlapping engine has no step
        in flight to hide this one's host work behind: it is paid in line, as a step of an engine that does not
        overlap pays it."""
        device, host, exposed = self._parts(gpu_s, n_seqs, n_tokens, tp, n_kernels, decode_only, after_idle, graph)
        return {"step": device + host + exposed, "gpu": gpu_s, "launch": device - gpu_s, "cpu": host,
                "exposed": exposed}

    def _parts(self, gpu_s: float, n_seqs: int, n_tokens: int, tp: int, n_kernels: int, decode_only: bool,
               after_idle: bool, graph: dict) -> tuple[float, float, float]:
        """(when the device finishes, host time after it, host time in line) of a step (terms)."""
        device = self.device_seconds(gpu_s, n_kernels, decode_only, n_seqs, n_tokens=n_tokens, **graph)
        cpu = self.cpu_seconds(n_seqs, n_tokens, tp)
        if self.overlapped and not after_idle:  # the exposed part stays in line; the rest hides behind the device
            exposed = min(self.exposed_s, cpu)
            return device, max(cpu - exposed, device) - device, exposed
        return device, cpu, 0.0

    def for_gpu(self, gpu: str, memory_gib: float, tp: int = 1, offline: bool = False) -> "EngineOverheads":
        """This engine's defaults on that GPU (a name such as 'h100' and its memory in GiB; offline: the Python
        LLM class rather than the server, where vLLM sets them apart)."""
        return replace(self, **engine_limits(self.name, gpu, memory_gib, tp, offline))


def engine_limits(name: str, gpu: str, memory_gib: float, tp: int = 1, offline: bool = False) -> dict:
    """max_num_seqs, max_num_batched_tokens and the CUDA-graph sizes an engine picks by itself on a GPU, as its
    source picks them (the sources are in each preset's `source`)."""
    g = gpu.lower()
    if name == "vllm":  # vllm/engine/arg_utils.py get_batch_defaults; vllm/config/vllm.py _set_cudagraph_sizes
        if memory_gib >= 160:
            seqs, tokens = 1024, 16384
        elif memory_gib >= 70 and "a100" not in g:
            seqs, tokens = 1024, 16384 if offline else 8192
        else:
            seqs, tokens = 256, 8192 if offline else 2048
        ceiling = 1024 if any(b in g for b in ("b200", "b300", "gb200", "gb300")) else 512
        graph = min(2 * seqs, ceiling, tokens)
        return {"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "graph_max_batch": graph,
                "piecewise_max_tokens": graph}
    if name == "sglang":  # python/sglang/srt/server_args.py _handle_gpu_memory_settings (thresholds in MiB there)
        mib = memory_gib * 1024
        small = tp < 4
        for limit, chunk, graph_small, graph_big in ((20, 2048, 8, 8), (35, 2048, 24, 80), (60, 4096, 32, 160),
                                                     (90, 8192, 256, 512), (160, 8192, 256, 512)):
            if mib < limit * 1024:
                return {"max_num_batched_tokens": chunk, "graph_max_batch": graph_small if small else graph_big}
        return {"max_num_batched_tokens": 16384, "graph_max_batch": 512}
    return {}  # tensorrt-llm, sarathi, none: the same on every GPU


def sglang_max_running_requests(kv_tokens: int, context_len: int) -> int:
    """SGLang's default max_running_requests: min(max(kv_tokens / context_len x 512, 2048), 4096), and never above
    kv_tokens / 2 (model_runner's resolve_max_num_reqs)."""
    return max(1, min(min(max(int(kv_tokens / context_len * 512), 2048), 4096), kv_tokens // 2))


# ---- the presets ----------------------------------------------------------------------------------------------------
#: Host time per kernel launched outside a graph, and per graph replay. Derived, see docs/sim.md: the driver's
#: enqueue of one launch (2.6-2.8 us, async; 6.3-7.5 us when the GPU waits on each) and a replay (about 15 us
#: fixed), measured on an RTX 5070 Ti with CUDA 13.3 (github.com/ahrefs/ocannl issue 488, 2026-07-30), plus
#: PyTorch's own dispatch of one op from Python (PYTORCH_DISPATCH_S: 1.6 us a op, median of 15 x 2,000 calls of a
#: 14-op eager decoder layer on 1 x 8 tensors, torch 2.13 on this project's 2-core AMD EPYC; a lower bound for an
#: engine's model code, which adds its own Python around each op).
DRIVER_ENQUEUE_S = 2.7 * US
PYTORCH_DISPATCH_S = 1.6 * US
LAUNCH_S = DRIVER_ENQUEUE_S + PYTORCH_DISPATCH_S
GRAPH_LAUNCH_S = 15.0 * US
#: vLLM V1 before async scheduling (Llama-2-7B, 256 sequences, ShareGPT): a 5-6 ms gap between decode steps
#: (github.com/vllm-project/vllm/issues/10634, 2024-11-25); the async prototype left 150-170 us with CUDA graphs
#: (vllm-project/vllm PR 11133, 2024-12-12).
VLLM_V1_GAP_S, VLLM_V1_GAP_SEQS = 5.5 * MS, 256
VLLM_V1_EXPOSED_S = 0.16 * MS
#: vLLM V0's largest captured decode batch (vllm/worker/model_runner.py _BATCH_SIZES_TO_CAPTURE).
V0_GRAPH_MAX_BATCH = 256

_VIDUR = f"github.com/{VIDUR_REPO} {CPU_COMMIT[:7]}:{CPU_PATH}"
_LAUNCH = ("launch_s = 2.7 us driver enqueue (github.com/ahrefs/ocannl issue 488: RTX 5070 Ti, CUDA 13.3) + "
           "PyTorch dispatch per op, 1.6 us, measured on this project's CPU (derived: 4.3 us); graph_launch_s = 15 us, one replay "
           "(same source: 19.4 us for 8 nodes, 82.9 us for 117, 0.58 us a node)")
_V1_HOST = ("cpu: Sarathi's fitted line scaled so that 256 sequences cost the 5-6 ms gap between decode steps vLLM V1 "
            "showed before async scheduling (vllm-project/vllm issue 10634, Llama-2-7B); derived")


@lru_cache(maxsize=1)
def sarathi_fit() -> CpuFit:
    return fit_cpu_overheads(load_cpu_overheads())


def _presets() -> dict[str, EngineOverheads]:
    fit = sarathi_fit()
    scale = VLLM_V1_GAP_S / fit.seconds(VLLM_V1_GAP_SEQS, 1)  # the V1 host line, derived from Sarathi's
    v1 = dict(cpu_base_s=fit.base_s * scale, cpu_per_seq_s=fit.per_seq_s * scale, cpu_per_tp_s=0.0)
    presets = {
        "sarathi": EngineOverheads(
            "sarathi", fit.base_s, fit.per_seq_s, fit.per_tp_s, LAUNCH_S, GRAPH_LAUNCH_S, 0, 128, 512,
            source=(f"cpu fitted on {_VIDUR} (slope: {fit.fit_model} TP 1; base and tp term: batch {fit.fit_batch}; "
                    "tp term = Ray's dispatch, ray_comm_time); no CUDA graphs (the profiled engine runs eager); "
                    "limits: microsoft/sarathi-serve sarathi/config/config.py (max_num_seqs 128, chunk_size 512); "
                    + _LAUNCH),
            version="sarathi-serve as profiled by Vidur (2024-05)"),
        # vLLM before V1 (to 0.7): Sarathi-Serve is a fork of it, with its scheduler, input preparation, sampler and
        # output processing, so Vidur's profile of Sarathi is the published host time of that lineage.
        "vllm-v0": EngineOverheads(
            "vllm-v0", fit.base_s, fit.per_seq_s, 0.0, LAUNCH_S, GRAPH_LAUNCH_S, graph_max_batch=V0_GRAPH_MAX_BATCH,
            max_num_seqs=256, max_num_batched_tokens=2048,
            source=(f"vLLM V0 (0.2.7-0.7): cpu = Sarathi-Serve's line fitted on {_VIDUR} (Sarathi-Serve forks vLLM "
                    "V0's scheduler, input preparation, sampler and output processing), without its tp term (Ray's "
                    "dispatch: V0's driver worker runs in the engine's process and hands the step's inputs to the other "
                    "ranks by broadcast_tensor_dict, vllm/worker/worker.py; that broadcast's time is unpublished: 0); "
                    "host work in turn with the GPU (async output processing of 0.6+ not priced); CUDA graphs for "
                    "decode-only steps of up to 256 sequences, padded to the next captured size "
                    "(vllm/worker/model_runner.py _BATCH_SIZES_TO_CAPTURE = [1, 2, 4] + [8 i for i in 1..32]), eager "
                    "otherwise; limits: vllm/config.py SchedulerConfig defaults, max_num_seqs 256, "
                    "max_num_batched_tokens 2048 (max(max_model_len, 2048) without chunked prefill); " + _LAUNCH),
            version="vllm 0.2.7-0.7 (V0)"),
        "vllm": EngineOverheads(
            "vllm", **v1, launch_s=LAUNCH_S, graph_launch_s=GRAPH_LAUNCH_S, graph_max_batch=512,
            max_num_seqs=1024, max_num_batched_tokens=8192, overlapped=True, exposed_s=VLLM_V1_EXPOSED_S,
            piecewise_max_tokens=512,
            source=("vLLM 0.32 V1: async scheduling on by default (vllm/config/vllm.py); " + _V1_HOST + "; exposed "
                    "0.15-0.17 ms (vllm-project/vllm PR 11133, async prototype with CUDA graphs); no tp term published "
                    "(V1 sends workers diffs over shared memory, blog.vllm.ai 2025-01-27); cudagraph_mode "
                    "FULL_AND_PIECEWISE (O2 default): full graphs for decode-only steps, piecewise (attention eager) "
                    "for others, up to max_cudagraph_capture_size = min(2 x max_num_seqs, 512; 1024 on B200) tokens, "
                    "eager beyond (vllm/config/compilation.py, vllm/v1/cudagraph_dispatcher.py); limits: "
                    "vllm/engine/arg_utils.py get_batch_defaults, server on H100/H200: 1024 seqs, 8192 tokens; "
                    + _LAUNCH),
            version="vllm 0.32.0"),
        "sglang": EngineOverheads(
            "sglang", **v1, launch_s=LAUNCH_S, graph_launch_s=GRAPH_LAUNCH_S, graph_max_batch=256,
            max_num_seqs=4096, max_num_batched_tokens=8192, overlapped=True, exposed_s=0.0,
            source=("SGLang 0.4+ zero-overhead overlap scheduler, on by default (lmsys.org/blog/2024-12-04-sglang-v0-4: "
                    "no GPU idle time between decode batches in Nsight, Triton backend; 1.1x throughput); no per-step "
                    "host time published: vLLM V1's assumed (" + _V1_HOST + "); cuda_graph_max_bs and "
                    "chunked_prefill_size by GPU memory and TP (python/sglang/srt/server_args.py "
                    "_handle_gpu_memory_settings: 80-160 GB GPUs 256 if tp < 4 else 512, 8192 tokens), graphs padded "
                    "to the next captured size; piecewise graphs off by default (enable_piecewise_cuda_graph False); "
                    "max_running_requests min(max(kv/context x 512, 2048), 4096); " + _LAUNCH),
            version="sglang 0.4-0.5 (server_args of 2025)"),
        "tensorrt-llm": EngineOverheads(
            "tensorrt-llm", **v1, launch_s=LAUNCH_S, graph_launch_s=GRAPH_LAUNCH_S, graph_max_batch=128,
            max_num_seqs=2048, max_num_batched_tokens=8192, overlapped=True, exposed_s=0.0,
            graph_sizes=tuple(range(1, 32)) + (32, 64, 128),
            source=("TensorRT-LLM 1.x PyTorch backend: overlap scheduler on by default "
                    "(nvidia.github.io/TensorRT-LLM/features/overlap-scheduler.html); no per-step host time "
                    "published: vLLM V1's assumed (" + _V1_HOST + "); CUDA graphs on by default for decode-only "
                    "batches (tensorrt_llm/llmapi/llm_args.py cuda_graph_config default_factory), max_batch_size "
                    "128 without padding: sizes 1-31, 32, 64, 128 (CudaGraphConfig._generate_cuda_graph_batch_sizes); "
                    "limits: max_batch_size 2048, max_num_tokens 8192 (docs/source/performance/"
                    "tuning-max-batch-size-and-max-num-tokens.md); " + _LAUNCH),
            version="tensorrt-llm 1.0-1.3"),
        "none": EngineOverheads("none", 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0,
                                source="no engine: the GPU's work alone, no limits (the sim before issue 45)"),
    }
    return presets


ENGINE_OVERHEADS: dict[str, EngineOverheads] = _presets()

"""The flags of prefillbench's commands, each declared once as an Annotated alias in its help panel's block.

cli.py lists, per command, the aliases it takes (and declares inline the few whose help differs by command);
`option` and `flag` are the two shapes a flag takes here. The model-and-backend block that run, capacity and
tune share is in cli.py's `model_flags`.
"""
from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from strategies import STRATEGIES

from prefillbench.backends import BACKEND_CHOICES, HIDDEN_BACKENDS
from prefillbench.backends.sim.pricing import OVERHEADS, PRICINGS
from prefillbench.bench.cases import DEFAULT_OPEN_LOOP_REQUESTS
from prefillbench.bench.traces import FORMATS as TRACE_FORMATS
from prefillbench.bench.workloads import ARRIVALS
from prefillbench.deploy.links import LINKS, TRANSFERS
from prefillbench.commands.parsers import choice, float_list, host_sizes, int_list, lengths, percent, pp_tg_pairs, slo_spec, str_list
from prefillbench.report.tables import OUTPUT_FORMATS

MODEL_PANEL, TESTS_PANEL, OUTPUT_PANEL = "model and backend", "tests", "output"
LOAD_PANEL, CAPACITY_PANEL = "arrivals and SLOs (serving)", "capacity search"
SIM_PANEL = "sim backend (--backend sim)"
DEVICES = ("auto", "cuda", "cpu")
DTYPES = ("float32", "bfloat16", "float16")


def option(*names: str, panel: str | None = None, **kwargs: Any) -> Any:
    return typer.Option(*names, rich_help_panel=panel, **kwargs)


def flag(name: str, panel: str | None = None, **kwargs: Any) -> Any:
    """An on/off flag, off unless given: `--no-warmup` is the parameter no_warmup=True."""
    return typer.Option(name, rich_help_panel=panel, metavar="", show_default=False, **kwargs)


# ---------------------------------------------------------------- options, by help panel
# model and backend
Model = Annotated[Optional[str], option(
    "-m", "--model", panel=MODEL_PANEL,
    help="checkpoint folder, hub id or .gguf file (default: the shipped SmolLM2-135M-Instruct Q4_1)")]
BackendName = Annotated[str, option(
    "--backend", panel=MODEL_PANEL, callback=choice(*BACKEND_CHOICES, hidden=HIDDEN_BACKENDS), metavar="|".join(BACKEND_CHOICES),
    help="auto: torch with CUDA, else gguf")]
Device = Annotated[str, option(
    "--device", panel=MODEL_PANEL, callback=choice(*DEVICES), metavar="|".join(DEVICES), help="torch and gguf device")]
DType = Annotated[Optional[str], option(
    "--dtype", panel=MODEL_PANEL, callback=choice(*DTYPES), metavar="|".join(DTYPES),
    help="torch dtype (default: float32); on the sim, the weights' and KV cache's precision (see --sim-dtype)")]
Threads = Annotated[Optional[int], option("-t", "--threads", panel=MODEL_PANEL, help="CPU threads (default: the library's choice)")]
GpuLayers = Annotated[Optional[int], option("-ngl", "--n-gpu-layers", panel=MODEL_PANEL, help="gguf: layers to offload to the GPU")]
UBatch = Annotated[Optional[int], option("--ubatch", panel=MODEL_PANEL, help="gguf: llama.cpp n_ubatch")]
NoCudaGraphs = Annotated[bool, flag(
    "--no-cuda-graphs", MODEL_PANEL, help="torch on CUDA: run decode-only steps eagerly instead of replaying captured CUDA graphs")]
NoTuneLinear = Annotated[bool, flag(
    "--no-tune-linear", MODEL_PANEL,
    help="torch: keep transformers' own linear layers instead of timing F.linear, matmuls and oneDNN per shape and row count")]
CompileDecode = Annotated[bool, flag(
    "--compile", MODEL_PANEL,
    help="torch on CPU: run decode-only steps through inductor-compiled graphs (about 2 minutes to compile, before timing)")]
Kernels = Annotated[str, option(
    "--kernels", panel=MODEL_PANEL, callback=choice("auto", "torch"), metavar="auto|torch",
    help="torch on CPU: auto, this package's C kernels where they build and beat torch when timed; torch, plain torch only")]
FlashAttn = Annotated[Optional[str], option(
    "-fa", "--flash-attn", panel=MODEL_PANEL, callback=choice("on", "off", "auto"), metavar="on|off|auto",
    help="gguf: llama.cpp flash attention, llama-bench's values (default: auto, llama.cpp's choice: on on a CPU)")]

# sim backend (used only with --backend sim)
SimModel = Annotated[Optional[str], option(
    "--sim-model", panel=SIM_PANEL, help="sim: model preset (llama-13b, llama-33b, llama-2-70b, mistral-7b, gpt3-175b, "
    "llama-3.1-8b, llama-3.1-70b, qwen3-32b, qwen3-30b-a3b, mixtral-8x7b, deepseek-v3, gpt-oss-20b, gpt-oss-120b, yi-34b) "
    "or a transformers config.json (default: llama-13b)")]
SimGpu = Annotated[Optional[str], option(
    "--sim-gpu", panel=SIM_PANEL,
    help="sim: GPU preset (a6000, a100-sxm, a100-pcie, h100-sxm, h100-pcie, h100-nvl, h200, b200, mi300x, l40s, l4, "
    "rtx6000-ada) or a spec .yaml/.json "
    "(default: a6000)")]
SimLink = Annotated[Optional[str], option(
    "--sim-link", panel=SIM_PANEL, metavar="pcie4|pcie5|nvlink-bridge|nvlink",
    help="sim: the link between the GPUs as you own them: the card's PCIe slot, an NVLink bridge joining a pair "
    "(A100 PCIe, H100 PCIe / NVL, A6000; TP 2 at most), or NVLink through NVSwitch (SXM parts) (default: the GPU "
    "preset's usual server; docs/sim.md, Links)")]
SimDtype = Annotated[Optional[str], option(
    "--sim-dtype", panel=SIM_PANEL, metavar="bf16|fp16|fp8|int8|int4|mxfp4",
    help="sim: weight precision to price: fp8 is W8A8 on FP8 tensor cores where the GPU has them, int4 weight-only, "
    "mxfp4 MoE experts only (default: what the preset or config.json ships)")]
SimPricing = Annotated[Optional[str], option(
    "--sim-pricing", panel=SIM_PANEL, callback=choice(*PRICINGS), metavar="|".join(PRICINGS),
    help="sim: price operators by spec sheets (the roofline at flat shares of the peaks) or by curves fitted to "
    "measured GPU profiles (Vidur's operators, FlashAttention, NCCL; docs/sim.md) (default: measured where a profile "
    "covers the GPU, spec on other devices and with --calibration)")]
SimOverheads = Annotated[Optional[str], option(
    "--sim-overheads", panel=SIM_PANEL, callback=choice(*OVERHEADS), metavar="|".join(OVERHEADS),
    help="sim: whose per-step host time, kernel launches and CUDA graphs each step pays (docs/sim.md, Engine "
    "overheads) (default: vllm with --sim-pricing measured, else none)")]
MaxNumSeqs = Annotated[Optional[int], option(
    "--max-num-seqs", panel=SIM_PANEL, metavar="N",
    help="sim: the engine's cap on sequences in flight (vLLM's max_num_seqs); more wait in its queue (default: the "
    "--sim-overheads engine's own default on this GPU, 1024 with none; the KV cache may hold fewer)")]
KvCacheTokens = Annotated[Optional[int], option(
    "--kv-cache-tokens", panel=MODEL_PANEL, metavar="N",
    help="the KV cache shrunk to N tokens on any step backend (sim, gguf, torch), so admission by free blocks and "
    "preemption can be studied where the cache would never fill (default: the backend's own; the sim's is the GPU's "
    "memory beside the weights and the largest step)")]
KvHostCache = Annotated[Optional[list[str]], option(
    "--kv-host-cache", panel=SIM_PANEL, metavar="GiB[,GiB...]", callback=host_sizes,
    help="sim: GiB of host memory below the GPU's KV blocks (vLLM's --kv-offloading-size): blocks stored as "
    "computed, a prefix found there loaded over PCIe at admission, or recomputed where cheaper; with -s vllm-v1 "
    "and --prefix-cache on (docs/memory.md, Host tier). A list is one configuration per size, 0 for none, searched "
    "by capacity and tune beside the budget (default: none)")]
KvHostLink = Annotated[Optional[str], option(
    "--kv-host-link", panel=SIM_PANEL, metavar="pcie|c2c|GB/s",
    help="sim: what the host tier's loads cross: the card's PCIe slot (the default), NVLink-C2C (GH200/GB200, 450 "
    "GB/s a direction), or a rate in GB/s a direction for a slower tier (an NVMe drive, a network store); a load "
    "priced above recomputing its tokens is recomputed (docs/memory.md, When a load loses to recompute)")]
HicacheWritePolicy = Annotated[Optional[str], option(
    "--hicache-write-policy", panel=SIM_PANEL,
    callback=choice("write_through", "write_through_selective", "write_back"),
    metavar="write_through|write_through_selective|write_back",
    help="sim: when SGLang's HiCache writes a radix node to the host tier (-s sglang/sglang-mixed with "
    "--kv-host-cache): as it is inserted, on its second hit, or as the GPU evicts it (default: SGLang's, write_through; "
    "docs/memory.md, SGLang's HiCache)")]
KvDtype = Annotated[Optional[str], option(
    "--kv-dtype", panel=SIM_PANEL, metavar="bf16|fp16|fp8", help="sim: KV cache precision to price (default: bf16)")]
ExpertParallel = Annotated[int, option(
    "--ep", panel=SIM_PANEL, help="sim: expert-parallel GPUs per pipeline stage, a multiple of --tp (attention runs in "
    "ep/tp data-parallel groups; MoE models only)")]
DataParallel = Annotated[int, option(
    "--dp", panel=SIM_PANEL, help="sim: data-parallel ranks in lockstep, each a copy of the --tp layout with its own "
    "budget, cadence, KV cache and max_num_seqs; requests to ranks by the engine's rule (vLLM's least loaded, SGLang's "
    "round robin), each step the slowest rank's (docs/scheduler-parts.md; dense or MoE, no --ep past --tp)")]
TensorParallel = Annotated[int, option(
    "--tp", panel=MODEL_PANEL,
    help="tensor-parallel ranks: torch runs one process per rank under torchrun (see docs/servers.md, \"Past one machine\"); "
    "the sim predicts GPUs per stage")]
PipelineStages = Annotated[int, option("--pp", panel=SIM_PANEL, help="sim: pipeline stages, run as a pipeline of micro-batches")]
Calibration = Annotated[Optional[str], option(
    "--calibration", panel=SIM_PANEL, help="sim: calibration file written by `prefillbench calibrate`; gguf, torch: "
    "the one slo-budget prices its steps by")]
PrefixCache = Annotated[Optional[str], option(
    "--prefix-cache", panel=MODEL_PANEL, callback=choice("on", "off"), metavar="on|off",
    help="reuse cached prompt prefixes (vLLM's design on gguf and the sim; a serving engine's own cache by its flags): "
    "default on for a workload whose prompts share prefixes, off elsewhere")]
PrefixBlock = Annotated[Optional[int], option(
    "--prefix-block", panel=MODEL_PANEL, metavar="TOKENS",
    help="the prefix cache's block: prompts share cached KV in whole blocks of this many tokens (default: 16, vLLM's)")]
Trace = Annotated[Optional[str], option(
    "--trace", panel=SIM_PANEL, metavar="FILE", help="sim: write every step's per-operator cost breakdown here (JSONL)")]
# prefill apart from decode
DEPLOY_PANEL = "prefill apart from decode (--disaggregate)"
Disaggregate = Annotated[Optional[str], option(
    "--disaggregate", panel=DEPLOY_PANEL, metavar="P:D",
    help="P prefill and D decode instances, each prompt's KV moved from one to the other (docs/disaggregation.md); "
    "open loop only")]
PrefillTp = Annotated[Optional[int], option(
    "--prefill-tp", panel=DEPLOY_PANEL, metavar="N", help="sim: each prefill instance's tensor parallelism (default: --tp)")]
DecodeTp = Annotated[Optional[int], option(
    "--decode-tp", panel=DEPLOY_PANEL, metavar="N", help="sim: each decode instance's tensor parallelism (default: --tp)")]
KvLink = Annotated[Optional[str], option(
    "--kv-link", panel=DEPLOY_PANEL, callback=choice(*LINKS), metavar="|".join(LINKS),
    help="sim: the link a prompt's KV crosses (default: nvlink; measured NCCL curves for nvlink and infiniband)")]
KvTransfer = Annotated[Optional[str], option(
    "--kv-transfer", panel=DEPLOY_PANEL, callback=choice(*TRANSFERS), metavar="|".join(TRANSFERS),
    help="sim: the KV sent after the prompt's last step (whole, default) or each layer's as it is computed (layerwise)")]
# servers
SERVER_PANEL = "Serving engines (--backend llama-server, --backend server)"
ServerBin = Annotated[Optional[str], option(
    "--server-bin", panel=SERVER_PANEL, metavar="PATH",
    help="llama-server: this binary instead of the one built from the installed llama-cpp-python's llama.cpp")]
ServerCmd = Annotated[Optional[str], option(
    "--server-cmd", panel=SERVER_PANEL, metavar="'CMD {model} {port} ...'",
    help="server: the engine's command, run without a shell; placeholders {bin} {model} {port} {budget} {slots} "
    "{threads} {ctx}; the strategy's flags follow it")]
EngineName = Annotated[Optional[str], option(
    "--engine", panel=SERVER_PANEL, metavar="llama-server|vllm|sglang|tgi",
    help="server: the engine's preset (its command, API and the strategies it can express)")]
Url = Annotated[Optional[str], option(
    "--url", panel=SERVER_PANEL, metavar="URL",
    help="server: measure a server already running (no launch; the budget is the server's); an API key is read "
    "from $PREFILLBENCH_API_KEY")]
ServerTimeout = Annotated[Optional[float], option(
    "--server-timeout", panel=SERVER_PANEL, metavar="S",
    help="server: seconds each launch may take to load its model and answer its health check (default: 300)")]
ClientWorkers = Annotated[Optional[str], option(
    "--client-workers", panel=SERVER_PANEL, metavar="N|auto",
    help="server: the client's processes, each sending a slice of the same schedule (auto: one per 10k streamed "
    "tokens a second expected, at most the cores less one; default 1)")]
ClientRay = Annotated[bool, flag(
    "--client-ray", SERVER_PANEL,
    help="server: the client's workers as Ray actors, spread over the cluster at $RAY_ADDRESS (else a local one): "
    "pip install 'prefillbench[ray]'")]
Shard = Annotated[Optional[str], option(
    "--shard", panel=SERVER_PANEL, metavar="I/N",
    help="server: send slice I (0-based) of N of the schedule, one of N machines; `prefillbench merge` joins the "
    "N exports into one report")]
LatencyFrom = Annotated[Optional[str], option(
    "--latency-from", panel=SERVER_PANEL, callback=choice("scheduled", "sent"), metavar="scheduled|sent",
    help="server: TTFT and E2E from each request's scheduled time (default; MLPerf loadgen's rule: a late client "
    "cannot hide delay) or from when it was sent (vLLM bench serve's)")]

# tests
NPrompt = Annotated[Optional[list[str]], option(
    "-p", "--n-prompt", panel=TESTS_PANEL, callback=lengths, metavar="N[,N]",
    help="prompt lengths for pp tests (default: 512)")]
NGen = Annotated[Optional[list[str]], option(
    "-n", "--n-gen", panel=TESTS_PANEL, callback=lengths, metavar="N[,N]",
    help="generation lengths for tg tests (default: 128)")]
PromptGen = Annotated[Optional[list[str]], option(
    "--pg", panel=TESTS_PANEL, callback=pp_tg_pairs, metavar="PP,TG",
    help="combined prompt+generation test (repeatable)")]
Concurrency = Annotated[Optional[list[str]], option(
    "-c", "--concurrency", panel=TESTS_PANEL, callback=int_list, metavar="N[,N]",
    help="requests in flight (default: 1,2,4)")]
Strategy = Annotated[Optional[list[str]], option(
    "-s", "--strategy", panel=TESTS_PANEL, callback=str_list, metavar="NAME[,NAME]",
    # ", " so the help wraps between names instead of cutting the list at the terminal's edge
    help=f"strategies (default: {', '.join(STRATEGIES)})")]
ChunkSize = Annotated[Optional[list[str]], option(
    "--chunk-size", "--token-budget", panel=TESTS_PANEL, callback=int_list, metavar="N[,N]",
    help="chunked's chunk size and sarathi-serve's token budget per step; one case per value (default: 256)")]
Budget = Annotated[Optional[list[str]], option(
    "--budget", panel=TESTS_PANEL, callback=str_list, metavar="KIND[,KIND]",
    help="the budget part of each -s scheduler: fixed (--chunk-size's tokens a step, the default) or slo (prompt "
    "tokens priced within the TBT/TPOT SLO each step; slo:cap=N); one case per value (docs/scheduler-parts.md)")]
Cadence = Annotated[Optional[list[str]], option(
    "--cadence", panel=TESTS_PANEL, callback=str_list, metavar="KIND[,KIND]",
    help="the cadence part of each -s scheduler: every (the default), interval:N (vLLM's --prefill-schedule-interval) "
    "or decode-rounds:N[:min-bs=M] (SGLang's --prefill-decode-interval); one case per value")]
Spec = Annotated[Optional[list[str]], option(
    "--spec", panel=TESTS_PANEL, callback=str_list, metavar="off|ngram:K[,...]",
    help="speculative decoding: off, ngram:K (real n-gram drafts: prompt lookup as vLLM's, on gguf, torch and the "
    "sim), or eagle|eagle3|mtp|draft:K:accept=R (the sim, at a fixed acceptance rate); :min=N:max=N set ngram's "
    "lookup lengths; one case per value (docs/speculative-decoding.md)")]
Repetitions = Annotated[Optional[int], option(
    "-r", "--repetitions", panel=TESTS_PANEL,
    help="timed repetitions after a warm-up (default: 3 in a closed loop, 1 in an open loop, whose requests already vary)")]
Requests = Annotated[Optional[int], option(
    "--requests", panel=TESTS_PANEL,
    help=f"requests per test (default: the concurrency in a closed loop, {DEFAULT_OPEN_LOOP_REQUESTS} in an open loop)")]
Seed = Annotated[int, option("--seed", panel=TESTS_PANEL, help="seed of the random prompts")]
NoWarmup = Annotated[bool, flag("--no-warmup", TESTS_PANEL, help="skip the untimed warm-up run")]
LenSpread = Annotated[float, option(
    "--len-spread", panel=TESTS_PANEL, metavar="R",
    help="draw each request's prompt and generation lengths uniformly from [L(1-R), L(1+R)] (vLLM's --random-range-ratio)")]
Workload = Annotated[Optional[str], option(
    "--workload", panel=TESTS_PANEL, metavar="FILE",
    help="replay a trace instead of -p/-n/--pg: CSV or JSON lines with prompt_len, gen_len and optional arrival_s "
    "(with arrival_s and no --arrival, its arrival times are replayed) and class (a name per request: TTFT is "
    "reported per class); Mooncake's JSONL (timestamp, input_length, output_length, hash_ids) and Azure's LLM "
    "inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens) are read by their own columns; mooncake-sample and "
    "azure-conv-sample name the shipped samples. sessions:n=8,turns=4,... makes multi-turn sessions; "
    "mix:n=200,short=0.9:128-1024,long=0.1:16384-32768,gen=128,seed=0 a seeded mix of length classes (each a "
    "share of the requests and a prompt length range)")]
TraceFormat = Annotated[str, option(
    "--trace-format", panel=TESTS_PANEL, callback=choice(*TRACE_FORMATS), metavar="|".join(TRACE_FORMATS),
    help="the --workload file's format (auto: told by its columns)")]
TimeScale = Annotated[float, option(
    "--time-scale", panel=TESTS_PANEL, metavar="F", help="multiply a trace's arrival times by F (0.5 replays it twice as fast)")]
TokenScale = Annotated[float, option(
    "--token-scale", panel=TESTS_PANEL, metavar="F",
    help="multiply a trace's prompt and output lengths by F, and its prefix blocks with them (shared prefixes stay shared)")]
TraceFirst = Annotated[Optional[int], option(
    "--trace-first", panel=TESTS_PANEL, metavar="N", help="replay only a trace's first N requests")]
TraceSpan = Annotated[Optional[float], option(
    "--trace-span", panel=TESTS_PANEL, metavar="S", help="replay only the requests of a trace's first S seconds (its own time)")]
TraceMaxLen = Annotated[Optional[int], option(
    "--trace-max-len", panel=TESTS_PANEL, metavar="N",
    help="leave out requests longer than N tokens, prompt and output (after --token-scale); stderr says how many")]

# arrivals and SLOs
Arrival = Annotated[Optional[str], option(
    "--arrival", panel=LOAD_PANEL, metavar="|".join(ARRIVALS),
    help="closed: c requests in flight, each replaced when it finishes (default); poisson or gamma: requests arrive "
    "at --rate per second, -c caps those in flight (default: no cap) and the rest queue")]
Rate = Annotated[Optional[list[str]], option(
    "--rate", panel=LOAD_PANEL, callback=float_list, metavar="QPS[,QPS]", help="arrival rates in requests/s, one row each")]
Burstiness = Annotated[float, option(
    "--burstiness", panel=LOAD_PANEL, metavar="B",
    help="gamma arrivals: shape of the intervals (vLLM's convention: 1 is Poisson, below 1 burstier)")]
SLOOption = Annotated[Optional[str], option(
    "--slo", panel=LOAD_PANEL, callback=slo_spec, metavar="ttft=MS,tpot=MS,tbt=MS,e2e=MS",
    help="latency objectives (any subset): adds goodput, the requests/s that met them all, and their share")]
SkipIdle = Annotated[Optional[bool], option(
    "--skip-idle/--no-skip-idle", panel=LOAD_PANEL, show_default=False,
    help="open loop on a real backend: when no step runs until the next arrival, jump the clock there instead of "
    "sleeping (every step is still measured; a probe at low load takes its steps' time, not its arrivals' span). "
    "Default: on with tune --quick, off elsewhere")]
Interleave = Annotated[bool, flag(
    "--interleave", TESTS_PANEL,
    help="measure the strategies of each test and concurrency in turns (ABBA), so drift cancels out of their ratios")]

# capacity search (capacity, tune)
RequestShape = Annotated[Optional[list[str]], option(
    "--pg", panel=TESTS_PANEL, callback=pp_tg_pairs, metavar="PP,TG",
    help="prompt and generation length of the requests (default: 512,128)")]
MaxSchedDelay = Annotated[float, option(
    "--max-sched-delay", panel=CAPACITY_PANEL, metavar="MS",
    help="bound on the median scheduling delay (arrival to first step; Sarathi-Serve's criterion)")]
MaxQueueGrowth = Annotated[float, option(
    "--max-queue-growth", panel=CAPACITY_PANEL, parser=percent, metavar="PCT",
    help="how fast the wait may grow while requests arrive (its 95% lower bound, as a share of the time they arrive "
    "over): a rate over capacity by x% grows it by x%; it fails a short probe whose queue the delay bound cannot see")]
ProbeArrival = Annotated[str, option(
    "--arrival", panel=CAPACITY_PANEL, callback=choice("poisson", "gamma"), metavar="poisson|gamma", help="arrival process")]

# output
Output = Annotated[str, option(
    "-o", "--output", panel=OUTPUT_PANEL, callback=choice(*OUTPUT_FORMATS), metavar="|".join(OUTPUT_FORMATS),
    help="format on stdout: md table, grid (a terminal table), csv, json, jsonl")]
Export = Annotated[Optional[str], option(
    "--export", panel=OUTPUT_PANEL, metavar="FILE",
    help="also write every field and the run metadata here (.csv, .json, .jsonl, .md); "
    "a .json/.jsonl export gets its per-request trace beside it as <name>.requests.jsonl")]
ExportRequests = Annotated[Optional[str], option(
    "--export-requests", panel=OUTPUT_PANEL, metavar="FILE.jsonl",
    help="write each request's arrival and token times here (for plot)")]
RelativeTo = Annotated[Optional[str], option(
    "--relative-to", panel=OUTPUT_PANEL, metavar="STRATEGY",
    help="show each row's ratios to this strategy's row of the same test and concurrency")]
NoisyCV = Annotated[float, option(
    "--noisy-cv", panel=OUTPUT_PANEL, parser=percent, metavar="PCT",
    help="mark rows whose CV across repetitions exceeds this percentage as noisy")]
ResultsDir = Annotated[str, option("--results-dir", panel=OUTPUT_PANEL, help="where each run writes <timestamp>.csv")]
NoResultsFile = Annotated[bool, flag("--no-results-file", OUTPUT_PANEL, help="do not write results/<timestamp>.csv")]
Verify = Annotated[bool, flag(
    "--verify", OUTPUT_PANEL,
    help="after the benchmark, feed every strategy the first strategy's tokens and compare their logits "
    "(max |Δlogit|, top-1 agreement) within the backend's tolerance; exit 1 on a disagreement")]
NoProgress = Annotated[bool, flag("--no-progress", OUTPUT_PANEL, help="no progress bar on stderr")]
NoVerdict = Annotated[bool, flag(
    "--no-verdict", OUTPUT_PANEL,
    help="no verdict under the table (each strategy against --relative-to or sequential, in sentences)")]
Strict = Annotated[bool, flag(
    "--strict", OUTPUT_PANEL,
    help="exit 1 when a row's client sent late: its send lag p99 past the bound that distorts what it measures "
    "(docs/servers.md, the client's capacity)")]

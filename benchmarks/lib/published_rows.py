"""Published serving and latency measurements the sim is checked against, as data (benchmarks.sim.published runs them).

Each Row is one public figure with the conditions its source states, the `prefillbench run --backend sim` flags that
reproduce those conditions, and how the sim's figure is read from the run (READS). No figure here fits any constant of
the sim: they are held-out checks only. The first 15 rows are docs/sim.md's "Checked against published MoE
measurements" table, unchanged; the rest were gathered for issue 45 (2026-12-03), dense and MoE, on GPUs the sim has
presets for. Where a source leaves a condition out, the row's `note` says what was assumed.
"""
from __future__ import annotations

from dataclasses import dataclass

#: How the sim's figure is read from a run (benchmarks.sim.published.sim_figure implements each).
READS = {
    "batch_latency_s": "one batch's latency: concurrency x (prompt + generated) tokens over the table's throughput/s",
    "batch_latency_ms": "the same, in ms",
    "moe_kernel_us": "the moe_experts ms of the trace's first decode-only step with `arg` decodes, over the model's MoE "
                     "layers (`layers`), in us",
    "ts": "the table's t/s: (prompt + generated) tokens over the request's end-to-end time",
    "out_speed": "generated tokens over the request's end-to-end time (prefill included)",
    "ttft_ms": "TTFT p50",
    "itl_ms": "the mean gap between two tokens (TBT mean)",
    "out_tps": "output tokens per second of the run: throughput/s x generated / (prompt + generated)",
    "out_tps_per_gpu": "out_tps over the run's GPUs (tp x data-parallel groups x pp, from the export's metadata)",
}


@dataclass(frozen=True)
class Source:
    """Where a set of rows comes from, and what its figure means there."""

    key: str
    cite: str  # URL, or repository + path + commit
    engine: str  # engine and version, as the source states them
    metric: str  # the metric and its definition, as the source (or its script) gives it
    #: The --sim-overheads preset of that engine, which its rows run with under measured pricing: vllm-v0 where the
    #: source names a vLLM before V1 (to 0.7), or names no version but was published before V1 existed (0.7.0, its
    #: first alpha, 2025-01-27); vllm where it names a later one, or neither version nor date (docs/sim.md).
    overheads: str = "vllm"


@dataclass(frozen=True)
class Row:
    id: str
    source: Source
    model: str  # model, GPU count and type, TP, precision
    conditions: str  # input/output lengths, batch or concurrency, as stated
    published: float
    unit: str
    flags: str  # after `prefillbench run --backend sim` (benchmarks.sim.published adds the fixed ones)
    read: str  # a key of READS
    arg: int = 0  # moe_kernel_us: the decodes of the step to read
    layers: int = 0  # moe_kernel_us: the model's MoE layers
    note: str = ""

    @property
    def from_docs(self) -> bool:
        return self.id.startswith("doc-")


# ---------------------------------------------------------------- sources
PR2542 = Source("vllm-pr2542", "vLLM PR #2542 (\"Fused MOE for Mixtral\"), github.com/vllm-project/vllm/pull/2542",
                "vLLM, early 2024 (the PR's branch)", "benchmark_latency.py: one batch's latency, random token ids",
                overheads="vllm-v0")
PR3240 = Source("vllm-pr3240", "vLLM PR #3240 (\"adding fused moe kernel config for A100 TP2\"), "
                "github.com/vllm-project/vllm/pull/3240", "vLLM, early 2024 (the PR's branch)",
                "benchmark_latency.py: one batch's latency, random token ids", overheads="vllm-v0")
PR24700 = Source("vllm-pr24700", "vLLM PR #24700 (\"Improve default fused moe configs\"), its tuned-config rows, "
                 "github.com/vllm-project/vllm/pull/24700", "vLLM (the PR's branch), fused MoE Triton kernel",
                 "benchmark_moe.py: one layer's fused MoE kernel time, random routing")
QWEN3 = Source("qwen3-speed", "Qwen's speed benchmark, qwen.readthedocs.io getting_started/speed_benchmark; QwenLM/Qwen3 "
               "docs/source/getting_started/speed_benchmark.md", "SGLang 0.4.6.post1",
               "speed = (input + output tokens) / time, batch 1", overheads="sglang")
QWEN25 = Source("qwen2.5-speed", "QwenLM/Qwen2.5 docs/source/benchmark/speed_benchmark.rst @ 010c37c33b13a1ac59944b349620e13404e"
                "fe97d (qwen.readthedocs.io/en/latest/benchmark/speed_benchmark.html), 'vLLM' tables; script "
                "examples/speed-benchmark/speed_benchmark_vllm.py @ 0b7d9f7670a3e1e05d1e076147d08c045a5aa99e",
                "vLLM 0.6.3, PyTorch 2.4.0, Flash Attention 2.6.3, CUDA 12.1; gpu_memory_utilization 0.9, "
                "max_model_len 32768, enforce_eager False (the default setting)",
                "Speed(tokens/s) = 2048 generated tokens / wall time of one LLM.generate call (prefill included); "
                "batch 1, the least GPUs possible", overheads="vllm-v0")
NIGHTLY_H200 = Source("vllm-nightly-h200", "https://buildkite.com/vllm/performance-benchmark/builds/9513 (GPU H200); test "
                      "definitions vllm-project/vllm .buildkite/nightly-benchmarks/tests/latency-tests.json @ "
                      "d5ce92492d5188cd0b5f4fcf70ef54a7dfbdba05", "vLLM nightly (the build's commit; no version on the page)",
                      "benchmark_latency.py median end-to-end latency of one batch: 8 prompts of 32 tokens, 128 output "
                      "tokens, dummy weights, 5 warm-up + 15 timed iterations")
NIGHTLY_A100 = Source("vllm-nightly-a100", "https://buildkite.com/vllm/performance-benchmark/builds/9523 (GPU "
                      "A100-SXM4-80GB); test definitions as vllm-nightly-h200", NIGHTLY_H200.engine, NIGHTLY_H200.metric)
NIM = Source("nim-1.8.0", "https://docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance.md, Llama-3.3-70b-instruct "
             "Results, Version 1.8.0, 2 x H100 80G, fp8 TP2", "NVIDIA NIM for LLMs 1.8.0 (its engine profile not stated)",
             "AIPerf at concurrency 1: TTFT (ms) and ITL (ms, the mean inter-token latency)")
TRT_PERF = Source("trtllm-perf-md", "NVIDIA/TensorRT-LLM docs/source/performance.md @ 138f96d45f90b9667426f7c47297d8c06bafac73",
                  "TensorRT-LLM v0.5 (low latency, L40S throughput) and v0.6.1 (H100 and A100 throughput), "
                  "gptSessionBenchmark, engines built with --enable_fp8 --fp8_kv_cache on H100/L40S, float16 on A100",
                  "Low Latency: '1st Token Latency (ms)' at batch 1 (the benchmark run with one output token); Peak "
                  "Throughput: static batch of the stated size, 'Throughput (out tok/s/GPU)' on H100, '(out tok/s)' on "
                  "A100 and L40S (TP1 rows only here, where the two agree)", overheads="tensorrt-llm")
TRT_OVERVIEW = Source("trtllm-perf-overview", "NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md @ "
                      "00f37686aa854010d68bcbd0f4ab000221541ca6", "TensorRT-LLM (v1.0 docs), PyTorch backend, trtllm-bench "
                      "throughput; CUDA graphs with padding up to batch 8192; nvidia/*-FP8 ModelOpt checkpoints",
                      "'Total Output Throughput (tokens/sec)': an offline maximum-throughput run, every request queued "
                      "at once, synthetic fixed ISL/OSL, $num_requests per ISL/OSL from the page's table",
                      overheads="tensorrt-llm")
ORACLE = Source("oracle-mi300x", "https://blogs.oracle.com/cloud-infrastructure/post/serving-llama-31-405b-model-with-amd-"
                "mi300x-gpus (2024-10-10), 'Latency measurements' table", "vLLM (version not stated; "
                "published three months before V1's first alpha, so V0) on OCI BM.GPU.MI300X.8",
                "scripts/benchmark_latency.py: average latency of one batch, input 128, output 128 tokens",
                overheads="vllm-v0")

# Flags every row of a kind shares.
_MIX_H100 = "-s packed -n 0 --sim-model mixtral-8x7b --sim-gpu h100 --tp 8 --pg 1000,50"
_MIX_A100 = "-s packed -n 0 --sim-model mixtral-8x7b --sim-gpu a100-sxm --tp 2 --pg 1000,50"
_MOE_KERNEL = "-s packed --sim-model mixtral-8x7b --sim-gpu h100 --tp 2 -n 3"
_QWEN3 = "-s packed -n 0 --sim-model qwen3-30b-a3b --sim-gpu docs/sim/h20.yaml -c 1 --requests 1"
_Q25 = "-s packed -n 0 --sim-gpu a100-sxm -c 1 --requests 1 --sim-model docs/sim/qwen2.5-{}-instruct.json"
_NIGHTLY = "-s packed -n 0 --pg 32,128 -c 8 --requests 8"
_NIM = "-s packed -n 0 --sim-model llama-3.1-70b --sim-gpu h100 --tp 2 --sim-dtype fp8 -c 1 --requests 1"
_TTFT = "-s packed -n 0 -c 1 --requests 1"
_L2_7B = "--sim-model docs/sim/llama-2-7b.json"
_FP8KV = "--sim-dtype fp8 --kv-dtype fp8"
_OVERVIEW = "-s vllm-v1 --chunk-size 8192 -n 0 -c 1024 --sim-dtype fp8 --kv-dtype fp8"
_ORACLE = "-s packed -n 0 --sim-model docs/sim/llama-3.1-405b.json --sim-gpu mi300x --tp 8 --sim-dtype fp8 --pg 128,128"

_A100_VARIANT = "'A100 80GB' without SXM or PCIe: priced as a100-sxm"
_OVERVIEW_NOTE = ("FP8 KV cache assumed (ModelOpt's FP8 checkpoints ship it; the page does not say); vllm-v1 at 8192 "
                  "tokens a step stands for TensorRT-LLM's in-flight batching; -c 1024 is clamped to what KV memory holds")

ROWS: list[Row] = [
    # ---- docs/sim.md's 15 MoE rows, as the doc states them
    Row("doc-01", PR2542, "Mixtral-8x7B-Instruct, 8xH100 TP8, bf16", "1000 in, 50 out, batch 1", 0.459, "s",
        f"{_MIX_H100} -c 1 --requests 1", "batch_latency_s"),
    Row("doc-02", PR2542, "Mixtral-8x7B-Instruct, 8xH100 TP8, bf16", "1000 in, 50 out, batch 8", 0.813, "s",
        f"{_MIX_H100} -c 8 --requests 8", "batch_latency_s"),
    Row("doc-03", PR2542, "Mixtral-8x7B-Instruct, 8xH100 TP8, bf16", "1000 in, 50 out, batch 64", 2.419, "s",
        f"{_MIX_H100} -c 64 --requests 64", "batch_latency_s"),
    Row("doc-04", PR3240, "Mixtral-8x7B-Instruct, 2xA100 80 GB TP2, bf16", "1000 in, 50 out, batch 1", 0.762, "s",
        f"{_MIX_A100} -c 1 --requests 1", "batch_latency_s", note="SXM or PCIe not stated: priced as a100-sxm"),
    Row("doc-05", PR3240, "Mixtral-8x7B-Instruct, 2xA100 80 GB TP2, bf16", "1000 in, 50 out, batch 8", 2.034, "s",
        f"{_MIX_A100} -c 8 --requests 8", "batch_latency_s", note="SXM or PCIe not stated: priced as a100-sxm"),
    Row("doc-06", PR3240, "Mixtral-8x7B-Instruct, 2xA100 80 GB TP2, bf16", "1000 in, 50 out, batch 64", 7.537, "s",
        f"{_MIX_A100} -c 64 --requests 64", "batch_latency_s", note="SXM or PCIe not stated: priced as a100-sxm"),
    *[Row(f"doc-{7 + i:02d}", PR24700, "Mixtral-8x7B-Instruct, H100 80GB HBM3, TP2 shard, bf16",
          f"one layer's fused MoE, {n:,} token{'s' if n > 1 else ''}", us, "us",
          f"{_MOE_KERNEL} -c {n} --requests {n}", "moe_kernel_us", arg=n, layers=32)
      for i, (n, us) in enumerate([(1, 144.0), (8, 435.0), (64, 483.1), (512, 662.3), (1024, 833.7)])],
    Row("doc-12", QWEN3, "Qwen3-30B-A3B, 1xH20 96GB, bf16", "batch 1, 1 in, 2,048 out", 137.18, "t/s",
        f"{_QWEN3} --pg 1,2048", "ts", note="H20 is not a preset: docs/sim/h20.yaml (third-party figures)"),
    Row("doc-13", QWEN3, "Qwen3-30B-A3B, 1xH20 96GB, bf16", "batch 1, 6,144 in, 2,048 out", 490.10, "t/s",
        f"{_QWEN3} --pg 6144,2048", "ts"),
    Row("doc-14", QWEN3, "Qwen3-30B-A3B-FP8, 1xH20", "batch 1, 1 in, 2,048 out", 155.55, "t/s",
        f"{_QWEN3} --pg 1,2048 --sim-dtype fp8", "ts"),
    Row("doc-15", QWEN3, "Qwen3-235B-A22B, 8xH20 TP8, bf16", "batch 1, 1 in, 2,048 out", 74.50, "t/s",
        "-s packed -n 0 --sim-model docs/sim/qwen3-235b-a22b.json --sim-gpu docs/sim/h20.yaml --tp 8 --pg 1,2048 -c 1 "
        "--requests 1", "ts"),
    # ---- Qwen2.5 on A100 80GB, vLLM 0.6.3, batch 1, 2,048 generated tokens (dense)
    Row("qwen2.5-0.5b-1", QWEN25, "Qwen2.5-0.5B-Instruct, 1xA100 80GB, BF16", "batch 1, input 1, output 2048", 311.55,
        "t/s", _Q25.format("0.5b") + " --pg 1,2048", "out_speed", note=_A100_VARIANT),
    Row("qwen2.5-7b-1", QWEN25, "Qwen2.5-7B-Instruct, 1xA100 80GB, BF16", "batch 1, input 1, output 2048", 84.28, "t/s",
        _Q25.format("7b") + " --pg 1,2048", "out_speed", note=_A100_VARIANT),
    Row("qwen2.5-7b-6144", QWEN25, "Qwen2.5-7B-Instruct, 1xA100 80GB, BF16", "batch 1, input 6144, output 2048", 80.70,
        "t/s", _Q25.format("7b") + " --pg 6144,2048", "out_speed", note=_A100_VARIANT),
    Row("qwen2.5-7b-30720", QWEN25, "Qwen2.5-7B-Instruct, 1xA100 80GB, BF16", "batch 1, input 30720, output 2048", 70.33,
        "t/s", _Q25.format("7b") + " --pg 30720,2048", "out_speed", note=_A100_VARIANT),
    Row("qwen2.5-14b-1", QWEN25, "Qwen2.5-14B-Instruct, 1xA100 80GB, BF16", "batch 1, input 1, output 2048", 46.30,
        "t/s", _Q25.format("14b") + " --pg 1,2048", "out_speed", note=_A100_VARIANT),
    Row("qwen2.5-14b-14336", QWEN25, "Qwen2.5-14B-Instruct, 1xA100 80GB, BF16", "batch 1, input 14336, output 2048",
        41.91, "t/s", _Q25.format("14b") + " --pg 14336,2048", "out_speed", note=_A100_VARIANT),
    Row("qwen2.5-32b-1-eager", QWEN25, "Qwen2.5-32B-Instruct, 1xA100 80GB, BF16", "batch 1, input 1, output 2048",
        22.13, "t/s", _Q25.format("32b") + " --pg 1,2048", "out_speed",
        note="the table's 'Setting 1': gpu_memory_utilization 1.0, enforce_eager True (no CUDA graphs); " + _A100_VARIANT),
    Row("qwen2.5-72b-tp4-1", QWEN25, "Qwen2.5-72B-Instruct, 4xA100 80GB TP4, BF16", "batch 1, input 1, output 2048",
        31.37, "t/s", _Q25.format("72b") + " --tp 4 --pg 1,2048", "out_speed", note=_A100_VARIANT),
    Row("qwen2.5-72b-tp4-30720", QWEN25, "Qwen2.5-72B-Instruct, 4xA100 80GB TP4, BF16",
        "batch 1, input 30720, output 2048", 27.53, "t/s", _Q25.format("72b") + " --tp 4 --pg 30720,2048", "out_speed",
        note=_A100_VARIANT),
    # ---- vLLM's nightly latency benchmark (dense and MoE), batch 8, 32 in, 128 out
    Row("nightly-h200-llama8b", NIGHTLY_H200, "Meta-Llama-3-8B, 1xH200, bf16 (dummy weights)", "batch 8, 32 in, 128 out",
        834.014, "ms", f"{_NIGHTLY} --sim-model llama-3.1-8b --sim-gpu h200", "batch_latency_ms",
        note="the page says llama-3.1 8B, the test file Meta-Llama-3-8B: the same shapes (llama-3.1-8b preset)"),
    Row("nightly-h200-llama70b-tp4", NIGHTLY_H200, "Meta-Llama-3-70B-Instruct, 4xH200 TP4, bf16 (dummy weights)",
        "batch 8, 32 in, 128 out", 2075.36, "ms", f"{_NIGHTLY} --sim-model llama-3.1-70b --sim-gpu h200 --tp 4",
        "batch_latency_ms", note="Llama 3 70B's shapes are llama-3.1-70b's"),
    Row("nightly-h200-mixtral-tp2", NIGHTLY_H200, "Mixtral-8x7B-Instruct-v0.1, 2xH200 TP2, bf16 (dummy weights)",
        "batch 8, 32 in, 128 out", 1920.16, "ms", f"{_NIGHTLY} --sim-model mixtral-8x7b --sim-gpu h200 --tp 2",
        "batch_latency_ms"),
    Row("nightly-a100-llama8b", NIGHTLY_A100, "Meta-Llama-3-8B, 1xA100-SXM4-80GB, bf16 (dummy weights)",
        "batch 8, 32 in, 128 out", 1579.34, "ms", f"{_NIGHTLY} --sim-model llama-3.1-8b --sim-gpu a100-sxm",
        "batch_latency_ms"),
    Row("nightly-a100-llama70b-tp4", NIGHTLY_A100, "Meta-Llama-3-70B-Instruct, 4xA100-SXM4-80GB TP4, bf16 (dummy)",
        "batch 8, 32 in, 128 out", 3990.39, "ms", f"{_NIGHTLY} --sim-model llama-3.1-70b --sim-gpu a100-sxm --tp 4",
        "batch_latency_ms"),
    Row("nightly-a100-mixtral-tp2", NIGHTLY_A100, "Mixtral-8x7B-Instruct-v0.1, 2xA100-SXM4-80GB TP2, bf16 (dummy)",
        "batch 8, 32 in, 128 out", 3648.91, "ms", f"{_NIGHTLY} --sim-model mixtral-8x7b --sim-gpu a100-sxm --tp 2",
        "batch_latency_ms"),
    # ---- NVIDIA NIM 1.8.0, Llama-3.3-70B on 2xH100 FP8 TP2, concurrency 1
    Row("nim-70b-5000-ttft", NIM, "Llama-3.3-70B-Instruct, 2xH100 80G TP2, fp8", "concurrency 1, 5000 in, 500 out",
        406.77, "ms", f"{_NIM} --pg 5000,500", "ttft_ms", note="KV cache precision not stated: bf16"),
    Row("nim-70b-5000-itl", NIM, "Llama-3.3-70B-Instruct, 2xH100 80G TP2, fp8", "concurrency 1, 5000 in, 500 out",
        18.58, "ms", f"{_NIM} --pg 5000,500", "itl_ms", note="KV cache precision not stated: bf16"),
    Row("nim-70b-500-ttft", NIM, "Llama-3.3-70B-Instruct, 2xH100 80G TP2, fp8", "concurrency 1, 500 in, 2000 out",
        47.77, "ms", f"{_NIM} --pg 500,2000", "ttft_ms", note="KV cache precision not stated: bf16"),
    Row("nim-70b-500-itl", NIM, "Llama-3.3-70B-Instruct, 2xH100 80G TP2, fp8", "concurrency 1, 500 in, 2000 out",
        18.91, "ms", f"{_NIM} --pg 500,2000", "itl_ms", note="KV cache precision not stated: bf16"),
    # ---- TensorRT-LLM's performance.md: first-token latency at batch 1 (v0.5)
    *[Row(f"trt-ttft-{gpu}-{name}-{isl}", TRT_PERF, f"{label}, {where}", f"batch 1, input {isl}, 1st token", ms, "ms",
          f"{_TTFT} {model} --sim-gpu {preset}{extra} --pg {isl},1", "ttft_ms")
      for gpu, preset, extra, where, name, model, label, isl, ms in [
          ("h100", "h100", f" {_FP8KV}", "1xH100 FP8 (fp8 KV)", "llama2-7b", _L2_7B, "Llama-2-7B", 128, 7),
          ("h100", "h100", f" {_FP8KV}", "1xH100 FP8 (fp8 KV)", "llama2-7b", _L2_7B, "Llama-2-7B", 2048, 36),
          ("h100", "h100", f" --tp 4 {_FP8KV}", "4xH100 TP4 FP8 (fp8 KV)", "llama2-70b-tp4", "--sim-model llama-2-70b",
           "Llama-2-70B", 128, 26),
          ("h100", "h100", f" --tp 4 {_FP8KV}", "4xH100 TP4 FP8 (fp8 KV)", "llama2-70b-tp4", "--sim-model llama-2-70b",
           "Llama-2-70B", 2048, 109),
          ("l40s", "l40s", f" {_FP8KV}", "1xL40S FP8 (fp8 KV)", "llama2-7b", _L2_7B, "Llama-2-7B", 128, 14),
          ("l40s", "l40s", f" {_FP8KV}", "1xL40S FP8 (fp8 KV)", "llama2-7b", _L2_7B, "Llama-2-7B", 2048, 73),
          ("a100", "a100-sxm", "", "1xA100 FP16", "llama2-7b", _L2_7B, "Llama-2-7B", 128, 16),
          ("a100", "a100-sxm", "", "1xA100 FP16", "llama2-7b", _L2_7B, "Llama-2-7B", 2048, 133),
          ("a100", "a100-sxm", " --tp 4", "4xA100 TP4 FP16", "llama2-70b-tp4", "--sim-model llama-2-70b", "Llama-2-70B",
           128, 47),
          ("a100", "a100-sxm", " --tp 4", "4xA100 TP4 FP16", "llama2-70b-tp4", "--sim-model llama-2-70b", "Llama-2-70B",
           2048, 377)]],
    # ---- TensorRT-LLM's performance.md: peak throughput of a static batch (v0.6.1; L40S v0.5)
    *[Row(f"trt-tput-{gpu}-{name}-b{bs}-{isl}-{osl}", TRT_PERF, f"{label}, {where}", f"static batch {bs}, {isl} in, "
          f"{osl} out", tps, "tok/s/GPU", f"-s static -n 0 -c {bs} --requests {bs} --pg {isl},{osl} {model} "
          f"--sim-gpu {preset}{extra}", "out_tps_per_gpu")
      for gpu, preset, extra, where, name, model, label, bs, isl, osl, tps in [
          ("h100", "h100", f" {_FP8KV}", "1xH100 FP8 (fp8 KV)", "llama2-7b", _L2_7B, "Llama-2-7B", 768, 128, 128, 19694),
          ("h100", "h100", f" {_FP8KV}", "1xH100 FP8 (fp8 KV)", "llama2-7b", _L2_7B, "Llama-2-7B", 112, 128, 2048, 6818),
          ("h100", "h100", f" --tp 2 {_FP8KV}", "2xH100 TP2 FP8 (fp8 KV)", "llama2-70b-tp2", "--sim-model llama-2-70b",
           "Llama-2-70B", 1024, 128, 128, 2657),
          ("h100", "h100", f" --tp 2 {_FP8KV}", "2xH100 TP2 FP8 (fp8 KV)", "llama2-70b-tp2", "--sim-model llama-2-70b",
           "Llama-2-70B", 64, 2048, 2048, 547),
          ("a100", "a100-sxm", "", "1xA100 FP16", "llama2-7b", _L2_7B, "Llama-2-7B", 384, 128, 128, 5586),
          ("l40s", "l40s", f" {_FP8KV}", "1xL40S FP8 (fp8 KV), v0.5", "llama2-7b", _L2_7B, "Llama-2-7B", 64, 128, 128,
           3240)]],
    # ---- TensorRT-LLM's perf-overview: offline maximum throughput (trtllm-bench), FP8
    Row("trt-overview-h100-llama8b-1000-1000", TRT_OVERVIEW, "Llama-3.1-8B-Instruct-FP8, 1xH100 SXM TP1",
        "ISL 1000, OSL 1000, 3000 requests queued at once", 15220, "tok/s",
        f"{_OVERVIEW} --sim-model llama-3.1-8b --sim-gpu h100 --pg 1000,1000 --requests 3000", "out_tps",
        note=_OVERVIEW_NOTE),
    Row("trt-overview-h200-llama8b-2048-2048", TRT_OVERVIEW, "Llama-3.1-8B-Instruct-FP8, 1xH200 SXM TP1",
        "ISL 2048, OSL 2048, 1500 requests queued at once", 12194, "tok/s",
        f"{_OVERVIEW} --sim-model llama-3.1-8b --sim-gpu h200 --pg 2048,2048 --requests 1500", "out_tps",
        note=_OVERVIEW_NOTE),
    Row("trt-overview-h200-llama70b-1000-1000", TRT_OVERVIEW, "Llama-3.3-70B-Instruct-FP8, 1xH200 SXM TP1",
        "ISL 1000, OSL 1000, 3000 requests queued at once", 2909, "tok/s",
        f"{_OVERVIEW} --sim-model llama-3.1-70b --sim-gpu h200 --pg 1000,1000 --requests 3000", "out_tps",
        note="Llama 3.3 70B's shapes are llama-3.1-70b's; " + _OVERVIEW_NOTE),
    Row("trt-overview-h100-llama70b-tp2-128-2048", TRT_OVERVIEW, "Llama-3.3-70B-Instruct-FP8, 2xH100 SXM TP2",
        "ISL 128, OSL 2048, 3000 requests queued at once", 6651, "tok/s",
        f"{_OVERVIEW} --sim-model llama-3.1-70b --sim-gpu h100 --tp 2 --pg 128,2048 --requests 3000", "out_tps",
        note="Llama 3.3 70B's shapes are llama-3.1-70b's; " + _OVERVIEW_NOTE),
    Row("trt-overview-h200-llama405b-tp8-1000-1000", TRT_OVERVIEW, "Llama-3.1-405B-Instruct-FP8, 8xH200 SXM TP8",
        "ISL 1000, OSL 1000, 3000 requests queued at once", 3330, "tok/s",
        f"{_OVERVIEW} --sim-model docs/sim/llama-3.1-405b.json --sim-gpu h200 --tp 8 --pg 1000,1000 --requests 3000",
        "out_tps", note=_OVERVIEW_NOTE),
    # ---- Oracle's Llama-3.1-405B FP8 on 8xMI300X, vLLM benchmark_latency
    *[Row(f"oracle-mi300x-405b-b{bs}", ORACLE, "Llama-3.1-405B FP8, 8xMI300X (one instance on all eight GPUs)",
          f"batch {bs}, 128 in, 128 out", s, "s", f"{_ORACLE} -c {bs} --requests {bs}", "batch_latency_s",
          note="TP 8 inferred (one vLLM instance on all eight GPUs); KV cache precision not stated: bf16")
      for bs, s in [(1, 3.530), (8, 3.974), (64, 6.919)]],
]

#: Rows whose model is a mixture of experts (the rest are dense).
MOE_MODELS = ("mixtral", "qwen3-30b-a3b", "qwen3-235b", "deepseek", "gpt-oss")


def is_moe(row: Row) -> bool:
    return any(m in row.flags for m in MOE_MODELS)


__all__ = ["READS", "ROWS", "Row", "Source", "is_moe"]

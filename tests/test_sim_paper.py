"""The sim against SARATHI's own numbers (arXiv 2308.16369), spec sheets only, chunk size 256.

Tolerances are stated per check. Where the roofline cannot reach the paper's
figure the test pins what the sim does and says why (docs/sim.md has the table).
"""
from __future__ import annotations

import math

import pytest

from prefillbench import engine
from prefillbench.backends.sim.cost import Batch, CostModel
from prefillbench.bench.paper import compare, workload
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench.workloads import make_requests
from strategies import make_strategy

RATIO_TOL = 0.15


def within(value: float, paper: float, tol: float = RATIO_TOL) -> bool:
    return abs(value / paper - 1) <= tol


@pytest.fixture(scope="module")
def a6000_13b() -> CostModel:
    return CostModel(load_model_spec("llama-13b"), load_gpu_spec("a6000"))


# ---- Table 2: LLaMA-13B on an A6000 -------------------------------------------------------
def test_table2_prefill_1024(a6000_13b):
    ms = 1e3 * a6000_13b.seconds(Batch(((0, 1024, True),)))
    assert within(ms, 235), ms  # sim 228 ms


def test_table2_decode_only_batch_of_4(a6000_13b):
    ms = 1e3 * a6000_13b.seconds(Batch((), (1024,) * 4))
    assert within(ms, 50), ms  # sim 44.6 ms: the roofline has no per-step overhead


def test_table2_mixed_1021_prefill_plus_3_decodes(a6000_13b):
    ms = 1e3 * a6000_13b.seconds(Batch(((0, 1021, True),), (1024,) * 3))
    assert within(ms, 238), ms  # sim 232 ms


def test_table2_piggybacked_decode_is_several_times_cheaper(a6000_13b):
    decode_only = a6000_13b.seconds(Batch((), (1024,) * 4)) / 4
    mixed = a6000_13b.seconds(Batch(((0, 1021, True),), (1024,) * 3))
    marginal = (mixed - a6000_13b.seconds(Batch(((0, 1021, True),)))) / 3
    ratio = decode_only / marginal
    # Paper: 12.49 ms vs ~1.2 ms, about 10x. The sim gives 7.4x at 1K contexts, with any attainable
    # fractions: 3 decodes re-read 2.5 GB of KV, 3.3 ms even at 100% of 768 GB/s, while the paper's
    # 238 - 235 ms leaves 3.7 ms for them (the roofline bound, and 1.5% of two noisy step times).
    assert 6.0 <= ratio <= 12.0, ratio


# ---- End to end, single GPU -------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama13b_a6000():
    # 1K sequences at P:D 50 (1004 prompt + 20 generated), 6 in flight, 60 requests closed loop.
    return compare("llama-13b", "a6000", workload(1024, 50), 6)


@pytest.fixture(scope="module")
def llama33b_a100():
    # 2K sequences at P:D 50, 5 in flight (what fits beside 65 GB of weights on an 80 GB A100).
    return compare("llama-33b", "a100-sxm", workload(2048, 50), 5)


def test_llama13b_a6000_decode_speedup(llama13b_a6000):
    assert within(llama13b_a6000.decode_speedup, 5.45), llama13b_a6000.decode_speedup  # sim 4.90


def test_llama13b_a6000_end_to_end(llama13b_a6000):
    assert within(llama13b_a6000.e2e(), 1.33), llama13b_a6000.e2e()  # sim 1.39


def test_llama33b_a100_decode_speedup(llama33b_a100):
    assert within(llama33b_a100.decode_speedup, 4.25), llama33b_a100.decode_speedup  # sim 4.25


def test_llama33b_a100_end_to_end(llama33b_a100):
    assert within(llama33b_a100.e2e(), 1.235), llama33b_a100.e2e()  # paper 1.22-1.25, sim 1.29


@pytest.mark.parametrize("batch", [4, 6, 8])
def test_throughput_gain_peaks_near_c_over_b_minus_1(batch):
    grid = [10, 20, 30, 40, 50, 60, 80, 100, 150, 200]
    gains = {pd: compare("llama-13b", "a6000", workload(1024, pd), batch, requests=8 * batch).e2e() for pd in grid}
    peak = max(gains, key=gains.get)
    target = 256 / (batch - 1)
    # The grid is coarse: accept the peak within 35% of C/(B-1) (85, 51, 37 for B = 4, 6, 8).
    assert abs(math.log(peak / target)) <= math.log(1.35), (peak, target, gains)


# ---- GPT-3 on 64 A100s, TP 8 x PP 8 ---------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt3_pipeline():
    test = workload(1024, 50)
    out = {}
    for name in ("sequential", "chunked"):
        backend = SimBackend(load_model_spec("gpt3-175b"), load_gpu_spec("a100-sxm"), tp=8, pp=8)
        requests = make_requests(test, 240, backend.vocab_size, seed=1)
        record = engine.run(backend, make_strategy(name, 256), requests, 48)
        stats = backend.pipeline_stats
        out[name] = (len(record.requests) * test.tokens_per_request / record.wall, stats)
    return out


def test_gpt3_pipeline_bubbles_shrink_several_fold(gpt3_pipeline):
    base = gpt3_pipeline["sequential"][1]["median_bubble_per_request_s"]
    chunked = gpt3_pipeline["chunked"][1]["median_bubble_per_request_s"]
    # Paper: 6.29x. The sim's uniform chunked micro-batches leave almost no bubble (no jitter, no
    # varying prompt lengths), so its ratio is far larger (~70x): assert "several-fold" only.
    assert base / chunked >= 3, (base, chunked)


def test_gpt3_pipeline_throughput_rises(gpt3_pipeline):
    ratio = gpt3_pipeline["chunked"][0] / gpt3_pipeline["sequential"][0]
    # Paper: 1.91x; the sim gives 1.46x (-24%, outside +-15%): see docs/sim.md for why.
    assert 1.3 <= ratio <= 2.2, ratio


def test_gpt3_stage_busy_fraction_rises(gpt3_pipeline):
    base = gpt3_pipeline["sequential"][1]["stage_busy_fraction"]
    chunked = gpt3_pipeline["chunked"][1]["stage_busy_fraction"]
    assert len(base) == len(chunked) == 8
    assert min(chunked) > max(base)


# ---- KV capacity ------------------------------------------------------------------------------------
def test_kv_capacity_bounds_the_batch():
    from prefillbench import engine
    from prefillbench.bench.workloads import TestSpec

    backend = SimBackend(load_model_spec("llama-13b"), load_gpu_spec("a6000"))
    fits = backend.max_concurrency(1024)
    assert 20 <= fits <= 32  # (48 GiB - 1 GiB reserve - 24.2 GiB weights) / 0.78 MiB per token / 1K
    requests = make_requests(TestSpec(1000, 24), 80, backend.vocab_size, seed=1)
    record = engine.run(backend, make_strategy("chunked", 256), requests, 64)
    in_step = max(len(s.decode_contexts) + len(s.prefill_chunks) for s in record.steps)
    assert in_step <= fits
    assert backend.clamped and backend.clamped[0][0] == 64 and backend.clamped[0][1] <= fits


def test_llama13b_a6000_decode_speedup_up_to_10x_over_batch_sizes():
    # Paper: "up to 10x" decode throughput over the batch sizes it sweeps; each batch at its P:D = C/(B-1).
    speedups = {b: compare("llama-13b", "a6000", workload(1024, 256 / (b - 1)), b, requests=6 * b).decode_speedup
                for b in (2, 3, 4, 6)}
    assert within(max(speedups.values()), 10.0), speedups  # sim: 10.5x at B=2, 4.9x at B=6
    assert speedups[2] > speedups[3] > speedups[4] > speedups[6]

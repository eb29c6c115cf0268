"""--sim-pricing measured and --sim-overheads: the sim's operators priced by the measured curves, and an engine's
per-step costs on top. The spec pricing stays the default and unchanged."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.backends.sim.cost import Batch, CostModel
from prefillbench.backends.sim.measured import linear, profiles
from prefillbench.backends.sim.measured.attention import shipped_attention
from prefillbench.backends.sim.measured.overheads import ENGINE_OVERHEADS
from prefillbench.backends.sim.pricing import MeasuredPricing, engine_overheads

#: cost.py's names for Vidur's linears
SIM_NAME = {"attn_pre_proj": "qkv_proj", "attn_post_proj": "attn_out_proj", "mlp_up_proj": "mlp_gate_up",
            "mlp_down_proj": "mlp_down"}
REL = 1e-9  # the same arithmetic in two places: floating-point order only


def _measured(model: str, gpu: str, tp: int = 1, overheads: str | None = None) -> CostModel:
    m, g = load_model_spec(model), load_gpu_spec(gpu)
    return CostModel(m, g, tp, pricing=MeasuredPricing.for_gpu(g),
                     overheads=engine_overheads(overheads, g, tp) if overheads else None)


def _ops(cm: CostModel, n: int) -> dict[str, float]:
    return {op.name: op.seconds for op, _ in cm.layer_ops(Batch(chunks=((0, n, True),)))}


def test_the_sims_linears_are_the_curves_on_the_profiles_held_out_rows():
    """Meta-Llama-3-8B is a held-out model of Vidur's A100 profile (no curve saw it) with llama-3.1-8b's shapes: the
    sim's four linears of a layer at every measured TP and token count are the GEMM curve's price of that very row
    (so the sim counts the FLOPs and bytes the profile's rows do), and they are nearer the measured medians than the
    spec sheet's flat roofline."""
    gemm, _ = linear.shipped_curves("a100")  # what the sim prices by
    peaks = linear.PEAKS["a100"]
    rows = [r for r in profiles.load_rows("a100") if r.model == "Meta-Llama-3-8B" and r.is_gemm]
    assert not any(r.fit for r in rows) and len(rows) >= 4 * 4 * 10
    err_measured, err_spec = [], []
    models = {tp: (_measured("llama-3.1-8b", "a100-sxm", tp),
                   CostModel(load_model_spec("llama-3.1-8b"), load_gpu_spec("a100-sxm"), tp)) for tp in (1, 2, 4, 8)}
    for r in rows:
        measured, spec = models[r.tp]
        sim = _ops(measured, r.n_tokens)[SIM_NAME[r.op]]
        assert sim == pytest.approx(float(gemm.seconds(r.flops, r.nbytes, peaks.flops, peaks.mem_bw)), rel=REL)
        err_measured.append(abs(sim / r.median_s - 1))
        err_spec.append(abs(_ops(spec, r.n_tokens)[SIM_NAME[r.op]] / r.median_s - 1))
    assert np.median(err_measured) < np.median(err_spec)


def test_attention_and_elementwise_are_their_curves_at_the_gpus_own_peaks():
    """On an H200 (not profiled) the curves' shares price it at its own peaks: decode attention streams its bytes
    at the A100 profile's decode share of 4.8 TB/s, prefill attention's rate rises with the query rows."""
    cm = _measured("llama-3.1-8b", "h200")
    g, curve = cm.gpu, shipped_attention()
    decode = {op.name: op for op, _ in cm.layer_ops(Batch(decodes=(2048,) * 32))}["decode_attention"]
    assert decode.seconds == pytest.approx(curve.decode_seconds(decode.bytes, decode.flops, g.flops, g.mem_bw), rel=REL)
    prefill = {op.name: op for op, _ in cm.layer_ops(Batch(chunks=((0, 512, True),)))}["prefill_attention"]
    heads = 32
    diag = 4.0 * 128 * heads * 512 * 513 / 2
    assert prefill.flops == pytest.approx(diag)  # a chunk with no context is all diagonal
    assert prefill.seconds == pytest.approx(curve.prefill_seconds(prefill.flops, prefill.bytes, g.flops, g.mem_bw,
                                                                  heads * 512, diag), rel=REL)
    # a longer chunk runs its FLOPs faster (more query rows in flight), as the profile shows
    long = {op.name: op for op, _ in cm.layer_ops(Batch(chunks=((0, 4096, True),)))}["prefill_attention"]
    assert long.flops / long.seconds > 1.5 * prefill.flops / prefill.seconds


def test_measured_steps_cost_more_than_the_roofline_where_steps_are_small():
    """The issue's example: DeepSeek-V3 on 8 H200s at TP 8, one decode. The spec sheet's roofline prices it at 2.7 ms;
    the measured kernels (floors, the ridge, NCCL's small-message latency: two all-reduces a layer, 61 layers) cost
    more, and most where the step is smallest."""
    spec = CostModel(load_model_spec("deepseek-v3"), load_gpu_spec("h200"), 8)
    measured = _measured("deepseek-v3", "h200", 8)
    one, big = Batch(decodes=(2048,)), Batch(chunks=((0, 8192, True),))
    assert spec.seconds(one) == pytest.approx(2.68e-3, rel=0.01)
    assert measured.seconds(one) > 2 * spec.seconds(one)
    assert measured.seconds(one) / spec.seconds(one) > measured.seconds(big) / spec.seconds(big)
    allreduce = next(op for op, _ in measured.tail_ops(1) if op.name == "tp_allreduce")
    flat = next(op for op, _ in spec.tail_ops(1) if op.name == "tp_allreduce")
    assert allreduce.seconds > flat.seconds  # NCCL's measured latency, not 10 us


@pytest.mark.parametrize("overheads", [None, "vllm", "sarathi"])
def test_the_fast_path_prices_every_step_as_the_breakdown_does(overheads):
    """The sim prices most steps by fast_seconds and traces them by step_cost: the same time, measured or not."""
    rng = random.Random(7)
    for model, gpu, tp in (("llama-3.1-8b", "h100-sxm", 1), ("qwen3-30b-a3b", "h200", 2), ("gpt-oss-20b", "a100-sxm", 1)):
        cm = _measured(model, gpu, tp, overheads)
        for _ in range(30):
            chunks = tuple((rng.randrange(0, 3000), rng.randrange(1, 700), rng.random() < 0.5) for _ in range(rng.randrange(0, 3)))
            decodes = tuple(rng.randrange(1, 4000) for _ in range(rng.randrange(0 if chunks else 1, 80)))
            b = Batch(chunks, decodes)
            windows = {w: sum(min(c, w) for c in decodes) for w in cm.windows} if cm.windows and decodes else None
            fast = cm.fast_seconds([(s, n) for s, n, _ in chunks], len(decodes), sum(decodes), b.n_emit, windows)
            assert fast == pytest.approx(cm.step_cost(b).seconds, rel=REL)


def test_an_engines_overheads_are_its_presets_terms():
    """vLLM overlaps its host work with the GPU (async scheduling): a decode step whose kernels outlast the host
    pays only the exposed part (0.16 ms) and a CUDA-graph replay in place of its launches. Sarathi-Serve as Vidur
    profiled it runs eager and in turn: every kernel's launch (hidden behind a long step's GPU time) and all of its
    host time, growing with the batch."""
    plain = CostModel(load_model_spec("llama-3.1-70b"), load_gpu_spec("h100-sxm"), 4, pricing=MeasuredPricing.for_gpu(load_gpu_spec("h100-sxm")))
    vllm, sarathi = _measured("llama-3.1-70b", "h100-sxm", 4, "vllm"), _measured("llama-3.1-70b", "h100-sxm", 4, "sarathi")
    v, s = ENGINE_OVERHEADS["vllm"], ENGINE_OVERHEADS["sarathi"]
    for batch in (1, 64):
        b = Batch(decodes=(1024,) * batch)
        plain.allreduce_engine = "vllm"  # each engine's GPU time runs its own all-reduce (measured/allreduce.py)
        gpu = plain.seconds(b)
        assert gpu > v.graph_launch_s and gpu > v.cpu_seconds(batch, batch, 4) - v.exposed_s
        assert vllm.seconds(b) == pytest.approx(gpu + v.exposed_s, rel=REL)
        plain.allreduce_engine = "nccl"  # Sarathi-Serve's torch.distributed
        gpu = plain.seconds(b)
        kernels, _, _ = sarathi.kernels
        assert sarathi.seconds(b) == pytest.approx(max(gpu, kernels * s.launch_s) + s.cpu_seconds(batch, batch, 4), rel=REL)
    # the terms are in the breakdown, by name
    names = {op.name for op in vllm.step_cost(Batch(decodes=(1024,))).stages[0].ops}
    assert {"engine_launch", "engine_cpu", "engine_exposed"} <= names


def test_the_default_is_the_measured_pricing_where_a_profile_covers_the_gpu_and_says_so(run_cli, tmp_path, monkeypatch):
    """Issue 57: with no --sim-pricing a GPU a profile covers is priced by its measured curves with vLLM's
    overheads, a device none covers (a CPU) by spec sheets; the first stderr line says which and why."""
    from prefillbench.backends.sim import backend as sim_backend

    monkeypatch.setattr(sim_backend, "_SAID", set())  # lines are said once a process: earlier tests said them
    args = ["run", "--backend", "sim", "--sim-model", "llama-3.1-8b", "--sim-gpu", "h200", "--pg", "512,32", "-c", "1,8",
            "-s", "sarathi-serve", "--chunk-size", "256", "-r", "1", "-p", "0", "-n", "0", "--no-results-file",
            "--no-progress", "--no-verdict"]
    docs = {}
    for name, extra in (("default", []), ("spec", ["--sim-pricing", "spec", "--sim-overheads", "none"]),
                        ("measured", ["--sim-pricing", "measured"])):
        code, out, err = run_cli(*args, *extra, "--export", str(tmp_path / f"{name}.json"))
        assert code == 0, err
        docs[name] = (json.loads((tmp_path / f"{name}.json").read_text()), err)
    rows = {k: [r["tbt_p50_ms"] for r in d["results"]] for k, (d, _) in docs.items()}
    assert rows["default"] == rows["measured"] and rows["measured"] != rows["spec"]
    meta, err = docs["measured"][0]["metadata"], docs["default"][1]  # said once a process: by the first run
    assert meta["sim_pricing"] == "measured" and meta["sim_pricing_profile"] == "h100" and meta["sim_overheads"] == "vllm"
    assert "H200 is not profiled; priced by H100-SXM's measured curves" in err  # said, and in the metadata
    assert any("H200 is not profiled" in a for a in meta["sim_approximations"])
    default_meta, default_err = docs["default"][0]["metadata"], docs["default"][1]
    assert default_meta["sim_pricing"] == "measured" and default_meta["sim_overheads"] == "vllm"
    line = ("prefillbench: sim: priced by measured curves (the default: H100-SXM's measured profile covers H200) "
            "with vllm's overheads (measured pricing's default)")
    assert line in default_err.splitlines() and default_meta["sim_pricing_line"] == line.split("sim: ", 1)[1]
    assert "priced by spec sheets (--sim-pricing) with no engine overheads (--sim-overheads)" in docs["spec"][1]
    code, out, err = run_cli("run", "--backend", "sim", "--sim-model", "mistral-7b", "--sim-dtype", "int4", "--sim-gpu",
                             "cpu", "--pg", "32,4", "-p", "0", "-n", "0", "-c", "1", "-r", "1", "--no-results-file",
                             "--no-progress")
    assert code == 0, err
    assert "priced by spec sheets (the default: no measured profile covers CPU) with no engine overheads" in err


@pytest.mark.parametrize("extra, words", [
    (["--sim-gpu", "cpu", "--sim-pricing", "measured"], "no measured profile prices CPU"),
    (["--sim-pricing", "roofline"], "'roofline' is not one of spec, measured"),
    (["--sim-overheads", "triton"], "'triton' is not one of vllm, vllm-v0, sglang, tensorrt-llm, sarathi, none"),
])
def test_bad_pricing_flags_fail_in_one_line(run_cli, extra, words):
    code, out, err = run_cli("run", "--backend", "sim", "--pg", "32,8", "-c", "1", "-r", "1", "--no-results-file", *extra)
    assert code == 2 and words in err and "Traceback" not in err


def test_the_profiles_peaks_are_the_presets():
    """measured/ may not import the presets, so it copies the profiled GPUs' peaks: they must stay the presets'."""
    for profile, preset in (("h100", "h100-sxm"), ("a100", "a100-sxm")):
        spec = load_gpu_spec(preset)
        assert (linear.PEAKS[profile].flops, linear.PEAKS[profile].mem_bw) == (spec.flops, spec.mem_bw)


def test_the_first_step_after_a_wait_pays_the_host_work_an_overlapping_engine_hides_when_busy():
    from prefillbench.backends.sim.backend import SimBackend
    from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
    from prefillbench.step import PrefillChunk, Step

    sim = SimBackend(load_model_spec("llama-13b"), load_gpu_spec("h100"), pricing="measured", overheads="vllm")
    sim.prepare(4, 1024, 512)
    step = Step(prefills=(PrefillChunk(1, tuple(range(64)), 0, True),))
    cold = sim.clock; sim.execute(step); cold = sim.clock - cold
    sim.release(1)
    busy = sim.clock; sim.execute(step); busy = sim.clock - busy
    sim.release(1)
    sim.wait_until(sim.clock + 1.0, idle=True)
    again = sim.clock; sim.execute(step); again = sim.clock - again
    cpu = sim.overheads.cpu_seconds(1, 64, 1)
    hidden = cpu - min(sim.overheads.exposed_s, cpu)  # what overlap hides while busy (the device takes longer here)
    assert 0 < hidden < busy
    # busy: max(cpu - exposed, device) + exposed = device + exposed; after a wait: cpu + device
    assert cold == pytest.approx(busy + hidden, rel=1e-12) and again == pytest.approx(cold, rel=1e-12)


#: fast_seconds and an engine's step time before fast_seconds built no Op per term and no dict per step (recorded
#: at 19bb4d9): (overheads, chunks, decodes, their context, emitting rows, after idle, seconds)
RECORDED_FAST = [
    (None, (), 8, 9000, 8, False, 0.00698747780476434), (None, ((0, 512),), 16, 30000, 16, False, 0.01812887920680703),
    (None, (), 1, 700, 1, True, 0.006502805244262163), (None, ((100, 2000), (0, 48)), 0, 0, 1, False, 0.05411270077839874),
    ("vllm", (), 8, 9000, 8, False, 0.00714747780476434), ("vllm", ((0, 512),), 16, 30000, 16, False, 0.01828887920680703),
    ("vllm", (), 1, 700, 1, True, 0.0069297682033229915),
    ("vllm", ((100, 2000), (0, 48)), 0, 0, 1, False, 0.05427270077839874)]
#: (overheads, GPU seconds, sequences, tokens, decode only, after idle, terms()["step"]), recorded at 19bb4d9 (TP 2)
RECORDED_STEP = [
    ("vllm", 0.004, 8, 8, True, False, 0.0041600000000000005), ("vllm", 0.02, 40, 2100, False, False, 0.02016),
    ("vllm", 0.0001, 1, 1, True, True, 0.0005269629590608284), ("vllm", 0.0009, 200, 200, True, False, 0.004385921277283947),
    ("sarathi", 0.004, 8, 8, True, False, 0.012299400000000002),
    ("sarathi", 0.02, 40, 2100, False, False, 0.029873056453558505),
    ("sarathi", 0.0001, 1, 1, True, True, 0.00961926265078408),
    ("sarathi", 0.0009, 200, 200, True, False, 0.019405438721351025), ("sglang", 0.004, 8, 8, True, False, 0.004),
    ("sglang", 0.02, 40, 2100, False, False, 0.02), ("sglang", 0.0001, 1, 1, True, True, 0.0005269629590608284),
    ("sglang", 0.0009, 200, 200, True, False, 0.004385921277283947)]


def test_the_fast_path_and_an_engines_step_time_are_the_floats_they_were():
    """Every simulated step is priced by fast_seconds and, with an engine's overheads, step_seconds: cut for speed,
    they must give the same floats as before (==, not approx: a capacity search compares their sums)."""
    for overheads, chunks, n, ctx, emit, idle, seconds in RECORDED_FAST:
        assert _measured("llama-3.1-8b", "h100-sxm", 1, overheads).fast_seconds(list(chunks), n, ctx, emit, None,
                                                                                idle) == seconds
    for overheads, gpu_s, seqs, tokens, decode_only, idle, seconds in RECORDED_STEP:
        cm = _measured("llama-3.1-8b", "h100-sxm", 2, overheads)
        n_kernels, pieces, eager = cm.kernels
        args = (gpu_s, seqs, tokens, 2, n_kernels, decode_only, idle)
        assert cm.overheads.terms(*args, eager_kernels=eager, graph_pieces=pieces)["step"] == seconds
        assert cm.overheads.step_seconds(*args, eager_kernels=eager, graph_pieces=pieces) == seconds

"""The measured pricing's terms fitted by calibrate: the same curves and host line as the profiled pricing, with a
device's own numbers (issue 45: a calibrated and an uncalibrated sim differ only in numbers)."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from prefillbench.backends.sim import calibration_measured as measured_cal
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.calibration import sweep_points
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.backends.sim.cost import Batch
from prefillbench.backends.sim.specs import SimConfigError
from prefillbench.cli import main

TRUTH = {"gemm_compute_eff": 0.6, "gemm_memory_eff": 0.7, "gemm_sharpness": 3.0, "gemm_floor_s": 5e-6,
         "elementwise_memory_eff": 0.5, "elementwise_floor_s": 3e-6, "prefill_attention_eff": 0.4,
         "decode_attention_eff": 0.3, "cpu_base_s": 2e-4, "cpu_per_seq_s": 2e-5}
SPEC_FIT = {"compute_fraction": 0.8, "memory_fraction": 0.85, "step_overhead_s": 1e-4, "decode_attention_fraction": 1.0}


def random_batches(n: int, seed: int, offset: int = 1024, chunk: int = 512, decodes: int = 24,
                   context: int = 1500) -> list[Batch]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        chunks = ((rng.randrange(0, offset + 1), rng.randrange(1, chunk + 1), True),) if rng.random() < 0.7 else ()
        ctxs = tuple(rng.randrange(1, context + 1) for _ in range(rng.randrange(0 if chunks else 1, decodes + 1)))
        out.append(Batch(chunks, ctxs))
    return out


#: What a sweep of whole steps identifies: the GEMM curve's shares and sharpness, the elementwise share, decode
#: attention's share and the host time per sequence. The three per-step constants (the GEMM and elementwise floors,
#: the host base) enter every step's time by fixed kernel counts, so only their sum is identified; and prefill
#: attention's compute share only from below (every shape's attention is bandwidth-bound at the true share, so any
#: share above the most intense shape's knee fits). Where the solver ends in those directions depends on the BLAS
#: (AVX-512's OpenBLAS kernels ended at 0.293 for 0.4 before the sweep had its (512, 512) chunk, AVX2's at 0.4).
IDENTIFIED = ("gemm_compute_eff", "gemm_memory_eff", "gemm_sharpness", "elementwise_memory_eff",
              "decode_attention_eff", "cpu_per_seq_s")


def test_the_fit_prices_steps_it_never_saw_as_the_device_does():
    """Steps priced by known curves and a known host line stand for a device: fitted on the sweep's shapes, the
    calibrated curves price other shapes within the sweep's span (chunks of up to 512 at offsets up to 512, whose
    attention is no more compute-intense than the sweep's chunk of 512 at 512; up to 8 decodes at up to 768
    positions) as the device does. The model is exact, so the only error left is the solver's: least squares stops at
    a relative change of 1e-8 in its cost, far below 1e-6 in a step's log time, and every term it identifies is the
    device's to that precision (IDENTIFIED); the rest are asserted through the prices they make."""
    model, gpu = load_model_spec("llama-13b"), load_gpu_spec("a100")
    fit_batches = [p.batch for p in sweep_points(2048)]
    truth_s = measured_cal.price(model, gpu, TRUTH, fit_batches)
    fitted = measured_cal.fit(model, gpu, fit_batches, list(truth_s), measured_cal.start(SPEC_FIT))
    assert {k: fitted[k] for k in IDENTIFIED} == pytest.approx({k: TRUTH[k] for k in IDENTIFIED}, rel=1e-6)
    held_out = random_batches(40, 7, offset=512, chunk=512, decodes=8, context=768)
    got, want = measured_cal.price(model, gpu, fitted, held_out), measured_cal.price(model, gpu, TRUTH, held_out)
    assert np.max(np.abs(got / want - 1)) < 1e-6
    assert np.max(np.abs(measured_cal.price(model, gpu, fitted, fit_batches) / truth_s - 1)) < 1e-6


def test_the_sweep_pins_prefill_attention_where_a_shorter_sweep_leaves_it_free():
    """The sweep's chunk of 512 at 512 is what bounds prefill attention's share: fitted without it, a share that
    makes that chunk compute-bound prices it wrong, and the full sweep's fit prices it right."""
    model, gpu = load_model_spec("llama-13b"), load_gpu_spec("a100")
    pin = [p.batch for p in sweep_points(2048) if p.chunk == (512, 512)]
    assert len(pin) == 1
    low = {**TRUTH, "prefill_attention_eff": 0.3}  # fits every other sweep shape as exactly as the truth does
    others = [p.batch for p in sweep_points(2048) if p.chunk != (512, 512)]
    assert np.max(np.abs(measured_cal.price(model, gpu, low, others) / measured_cal.price(model, gpu, TRUTH, others)
                         - 1)) < 1e-12
    assert abs(measured_cal.price(model, gpu, low, pin)[0] / measured_cal.price(model, gpu, TRUTH, pin)[0] - 1) > 1e-3


def test_a_calibrated_measured_sim_has_the_uncalibrated_ones_terms_with_its_own_numbers(tmp_path):
    model, gpu = load_model_spec("llama-13b"), load_gpu_spec("a100")
    cal = {"fitted": {"compute_fraction": 0.5, "memory_fraction": 0.5, "step_overhead_s": 0.01, "step_jitter": 0.0},
           "measured": {"fitted": TRUTH}}
    calibrated = SimBackend(model, gpu, calibration=cal, pricing="measured")
    profiled = SimBackend(model, gpu, pricing="measured")
    assert calibrated.pricing.profile == "calibrated" and profiled.pricing.profile == "a100"
    assert calibrated.overheads.name == "calibrated" and calibrated.overheads.cpu_base_s == TRUTH["cpu_base_s"]
    # the spec fit's fractions and step overhead are not applied under measured pricing: the curves hold the device
    assert calibrated.gpu.compute_fraction == gpu.compute_fraction and calibrated.gpu.step_overhead_s == 0.0
    for b in random_batches(20, 3):
        names = [op.name for stage in calibrated.cost.step_cost(b).stages for op in stage.ops]
        assert names == [op.name for stage in profiled.cost.step_cost(b).stages for op in stage.ops]
        assert calibrated.cost.seconds(b) == pytest.approx(measured_cal.price(model, gpu, TRUTH, [b])[0], rel=1e-12)
        assert calibrated.cost.seconds(b) != pytest.approx(profiled.cost.seconds(b), rel=1e-3)
    # an engine named on the command line still wins over the calibration's host line
    assert SimBackend(model, gpu, calibration=cal, pricing="measured", overheads="sglang").overheads.name == "sglang"


def test_a_file_without_the_measured_fit_is_refused_under_measured_pricing_in_one_line():
    model, gpu = load_model_spec("llama-13b"), load_gpu_spec("a100")
    old = {"fitted": {"compute_fraction": 0.5, "memory_fraction": 0.5, "step_overhead_s": 0.01}}
    with pytest.raises(SimConfigError, match="no fit of the measured pricing's terms"):
        SimBackend(model, gpu, calibration=old, calibration_path="old.json", pricing="measured")
    assert SimBackend(model, gpu, calibration=old).gpu.compute_fraction == 0.5  # spec pricing reads it as before
    zero = {**old, "measured": {"fitted": {**TRUTH, "gemm_compute_eff": 0.0}}}
    with pytest.raises(SimConfigError, match="gemm_compute_eff = 0 is outside"):
        SimBackend(model, gpu, calibration=zero, calibration_path="zero.json", pricing="measured")


def test_calibrate_fits_both_pricings_and_the_sim_runs_measured_on_the_calibration(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--backend", "torch", "-m", str(tiny_checkpoint), "--device", "cpu", "--quick",
                 "--repeats", "1", "--export", str(out)]) == 0
    cal = json.loads(out.read_text())
    part = cal["measured"]
    assert set(part["fitted"]) == set(measured_cal.PARAMS) and len(part["steps"]) == len(cal["steps"])
    assert "the measured pricing's terms" in capsys.readouterr().out
    export = tmp_path / "run.json"
    assert main(["run", "--backend", "sim", "--sim-pricing", "measured", "--calibration", str(out), "-p", "64", "-n",
                 "4", "-c", "2", "-r", "2", "-s", "sequential", "--export", str(export), "--no-progress"]) == 0
    assert "sim CPU calibrated" in capsys.readouterr().out
    meta = json.loads(export.read_text())["metadata"]
    assert meta["sim_pricing"] == "measured" and meta["sim_pricing_profile"] == "calibrated"
    assert meta["sim_overheads"] == "calibrated" and meta["sim_calibrated"]
    assert any("fitted by calibrate on CPU" in line for line in meta["sim_approximations"])


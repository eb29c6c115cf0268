"""Calibration: the fit recovers known fractions; the sweep runs on a real (tiny, random) torch model."""
from __future__ import annotations

import json

import pytest

from prefillbench.cli import main
from prefillbench.backends.sim.calibration import (FITTED_KEYS, JITTER_KEY, SHAPE_KEYS, Sample, errors, fit, jitter,
                                                   load_calibration, sweep_points)
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.backends.sim.cost import Batch, CostModel
from prefillbench.backends.sim.specs import SimConfigError


def synthetic_samples(model, gpu, truth):
    cm = CostModel(model, gpu.with_calibration(truth))
    out = []
    for p in sweep_points(2048):
        out.append(Sample(p, p.batch, cm.seconds(p.batch)))
    return out


@pytest.mark.parametrize("truth", [
    {"compute_fraction": 0.55, "memory_fraction": 0.7, "step_overhead_s": 0.004},
    {"compute_fraction": 0.05, "memory_fraction": 0.3, "step_overhead_s": 0.0},
    # llama.cpp on a CPU: decode attention far below the GEMMs, mixed steps cut into micro-batches
    {"compute_fraction": 0.04, "memory_fraction": 0.3, "step_overhead_s": 0.003, "decode_attention_fraction": 0.05,
     "mixed_step_factor": 1.2},
])
def test_fit_recovers_known_fractions(truth):
    model, gpu = load_model_spec("mistral-7b"), load_gpu_spec("a6000")
    samples = synthetic_samples(model, gpu, truth)
    fitted = fit(model, gpu, samples)
    assert set(fitted) == set(FITTED_KEYS + SHAPE_KEYS)
    assert fitted["compute_fraction"] == pytest.approx(truth["compute_fraction"], rel=0.02)
    assert fitted["memory_fraction"] == pytest.approx(truth["memory_fraction"], rel=0.02)
    assert fitted["step_overhead_s"] == pytest.approx(truth["step_overhead_s"], abs=2e-4)
    # a device the roofline already prices gets no shape terms (1 is the spec sheet's)
    assert fitted["decode_attention_fraction"] == pytest.approx(truth.get("decode_attention_fraction", 1.0), rel=0.05)
    assert fitted["mixed_step_factor"] == pytest.approx(truth.get("mixed_step_factor", 1.0), rel=0.01)
    errs = errors(model, gpu.with_calibration(fitted), samples)
    assert max(abs(e["error"]) for e in errs) < 0.02


def test_a_calibration_from_before_the_shape_terms_prices_as_the_roofline_did(tmp_path):
    from prefillbench.backends.sim.backend import SimBackend

    model, gpu = load_model_spec("mistral-7b"), load_gpu_spec("a6000")
    old = {"compute_fraction": 0.3, "memory_fraction": 0.6, "step_overhead_s": 0.002}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"fitted": old}))
    sim = SimBackend(model, gpu, calibration=load_calibration(path))
    assert (sim.gpu.decode_attention_fraction, sim.gpu.mixed_step_factor) == (1.0, 1.0)
    mixed = Batch(((0, 256, True),), (300, 900))
    assert sim.cost.seconds(mixed) == CostModel(model, gpu.with_calibration(old)).seconds(mixed)
    # and the terms, once fitted, do what they say: decode attention 20x slower, the mixed step 1.25x its operators
    new = SimBackend(model, gpu, calibration={"fitted": {**old, "decode_attention_fraction": 0.05, "mixed_step_factor": 1.25}})
    ops = new.cost.step_cost(mixed).breakdown()
    assert ops["decode_attention"]["seconds"] == pytest.approx(20 * sim.cost.step_cost(mixed).breakdown()["decode_attention"]["seconds"])
    assert new.cost.seconds(mixed) == pytest.approx(1.25 * (new.cost.seconds(mixed) - ops["mixed_step"]["seconds"]))
    decode_only = Batch((), (300, 900))
    assert "mixed_step" not in new.cost.step_cost(decode_only).breakdown()


def test_the_jitter_is_the_pooled_spread_of_log_time_among_repeats_and_the_sim_draws_from_it():
    import math
    import statistics

    from strategies import make_strategy

    from prefillbench import engine
    from prefillbench.backends.sim.backend import SimBackend
    from prefillbench.bench.pricing import pricer
    from prefillbench.bench.workloads import TestSpec, make_requests

    a, b = sweep_points(2048)[:2]
    batch = Batch(((0, 8, True),))
    samples = [Sample(a, batch, t) for t in (1.0, math.exp(0.1), math.exp(-0.1))] + [Sample(b, batch, 2.0)] * 2
    assert jitter(samples) == pytest.approx(math.sqrt(0.02 / 3))  # 5 samples of 2 points: 3 degrees of freedom
    assert jitter(samples[:1] + samples[3:4]) == 0.0  # no repeats, no spread known

    model, gpu = load_model_spec("mistral-7b"), load_gpu_spec("a100")
    fitted = {"compute_fraction": 0.5, "memory_fraction": 0.6, "step_overhead_s": 0.002, JITTER_KEY: 0.1}
    sim = SimBackend(model, gpu, calibration={"fitted": fitted})
    requests = make_requests(TestSpec(700, 60, spread=0.5), 24, sim.vocab_size, 3)
    runs = [engine.run(sim, make_strategy("chunked", 256), requests, 4) for _ in range(2)]
    assert [s.seconds for s in runs[0].steps] == pytest.approx([s.seconds for s in runs[1].steps], rel=1e-9)  # same draws
    price = pricer(sim.cost)
    logs = [math.log(s.seconds / price(s)) for s in runs[0].steps]
    assert len(logs) > 300
    assert statistics.median(logs) == pytest.approx(0.0, abs=0.02) and statistics.stdev(logs) == pytest.approx(0.1, rel=0.15)
    exact = SimBackend(model, gpu, calibration={"fitted": {**fitted, JITTER_KEY: 0.0}})
    run = engine.run(exact, make_strategy("chunked", 256), requests, 4)
    assert [s.seconds for s in run.steps] == pytest.approx([pricer(exact.cost)(s) for s in run.steps], rel=1e-9)


def test_bad_calibration_file(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"fitted": {"compute_fraction": 0.5}}))
    with pytest.raises(SimConfigError, match="has no fitted"):
        load_calibration(path)


def test_calibrate_on_a_tiny_torch_model_then_run_the_sim(tiny_checkpoint, tmp_path, capsys):
    out, errs = tmp_path / "cal.json", tmp_path / "errors.csv"
    assert main(["calibrate", "--backend", "torch", "-m", str(tiny_checkpoint), "--device", "cpu", "--quick",
                 "--repeats", "1", "--export", str(out), "--errors", str(errs)]) == 0
    cal = json.loads(out.read_text())
    assert set(cal["fitted"]) == set(FITTED_KEYS + SHAPE_KEYS + (JITTER_KEY,)) and cal["fitted"][JITTER_KEY] == 0.0  # one repeat: no spread
    assert cal["model"]["hidden"] == 64 and cal["model"]["dtype_bytes"] == 4 and cal["gpu"]["name"] == "CPU"
    assert len(cal["steps"]) == len(errs.read_text().splitlines()) - 1 > 5
    printed = capsys.readouterr().out
    assert "per-step error" in printed
    # Each fraction in words (a fraction at the fit's ceiling says that roof never bound a step), and the next command.
    assert "compute fraction" in printed and "memory fraction" in printed
    assert "decode attention" in printed and "mixed-step factor" in printed
    assert f"next: prefillbench run --backend sim --calibration {out}" in printed

    # The calibrated sim runs the same model on the same device, and says it is calibrated.
    assert main(["run", "--backend", "sim", "--calibration", str(out), "-p", "64", "-n", "0", "-c", "1", "-r", "1",
                 "-s", "sequential", "--no-results-file", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "sim CPU calibrated" in captured.out
    assert "calibrated from" in captured.err


def test_a_fraction_is_told_in_words_and_one_at_the_ceiling_says_that_roof_never_bound():
    from prefillbench.backends.sim.calibration import FRACTION_CEILING, describe_fraction

    assert describe_fraction("compute", 0.42, "CPU") == "compute fraction 0.42: the backend attains 42.0% of CPU's nominal compute roof"
    at_ceiling = describe_fraction("memory", FRACTION_CEILING, "CPU")
    assert "ceiling" in at_ceiling and "never lets memory limit a step" in at_ceiling and "1000" in at_ceiling


def test_a_workloads_step_shapes_join_the_sweep():
    from prefillbench.backends.sim.backend import SimBackend
    from prefillbench.backends.sim.calibration import Point, calibrate, workload_points

    points = workload_points(256, 32, [512, 32, 64], 8192)
    # the whole prompt; each budget's chunk at a boundary halfway in, beside 4 decodes halfway through; decodes alone
    assert points == [Point((0, 256), 0, 0), Point((96, 32), 4, 272), Point((64, 64), 4, 272), Point((0, 256), 4, 272),
                      Point(None, 4, 272), Point(None, 8, 272)]
    assert workload_points(0, 32, [32], 8192) == []
    # A backend with the sim's own times: its calibration keeps every point it was given, each once.
    model, gpu = load_model_spec("mistral-7b"), load_gpu_spec("a6000")
    cal = calibrate(SimBackend(model, gpu), model, gpu, quick=True, repeats=1, extra=points + points[:1])
    labels = [s["point"] for s in cal["steps"]]
    assert {p.label for p in points} <= set(labels) and len(labels) == len(set(labels))

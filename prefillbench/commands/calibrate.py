"""`prefillbench calibrate`: run a real backend through the sim's sweep, fit the sim to it, and check the fit.

It sits above both the backends and the sim: it loads a real backend, hands it to the sim's
sweep and fit (prefillbench.backends.sim.calibration, which knows no backend class), and with --check
runs the engine on the real backend and on the calibrated SimBackend side by side.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pandas as pd
from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends import load_backend
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.commands.options import CalibrateOptions
from prefillbench.models import default_model_path
from prefillbench.writers import check_writable, csv_text, json_text, write_atomic
from prefillbench.backends.sim.calibration import (calibrate, calibration_specs, describe_fraction, describe_shape_terms,
                                                   model_spec_of)
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.bench.workloads import TestSpec, make_requests


# ---- real vs sim on a closed-loop run -----------------------------------------------------------------
def compare_run(backend, cal: dict[str, Any], n_prompt: int, n_gen: int, concurrency: int, requests: int,
                chunk: int = 64) -> dict[str, Any]:
    """Sequential and chunked on the real backend and on the calibrated sim: throughputs and step errors."""
    model, gpu = calibration_specs(cal)
    sim = SimBackend(model, gpu)
    test = TestSpec(n_prompt, n_gen)
    reqs = make_requests(test, requests, backend.vocab_size, seed=3)
    out: dict[str, Any] = {"test": test.name, "concurrency": concurrency, "chunk": chunk}
    step_errors = []
    for name in ("sequential", "chunked"):
        strategy = make_strategy(name, chunk)
        engine.run(backend, strategy, reqs[:1], 1)  # warm-up
        real = engine.run(backend, strategy, reqs, concurrency)
        simulated = engine.run(sim, strategy, reqs, concurrency)
        out[f"real_{name}"] = len(reqs) * test.tokens_per_request / real.wall
        out[f"sim_{name}"] = len(reqs) * test.tokens_per_request / simulated.wall
        for r, s in zip(real.steps, simulated.steps):
            step_errors.append(s.seconds / r.seconds - 1)
    out["real_ratio"] = out["real_chunked"] / out["real_sequential"]
    out["sim_ratio"] = out["sim_chunked"] / out["sim_sequential"]
    out["ratio_error"] = out["sim_ratio"] / out["real_ratio"] - 1
    out["median_abs_step_error"] = float(np.median(np.abs(step_errors)))
    return out


def sim_specs_for(real, model: str | None, sim_model: str | None = None, sim_gpu: str | None = None):
    """The sim's model shapes and nominal device for a real backend: named, or read from the backend's model."""
    if sim_model:
        spec = load_model_spec(sim_model)
    elif real.name == "gguf":
        spec = load_model_spec(model or default_model_path())  # shapes from the GGUF metadata
    else:
        spec = model_spec_of(real)
    return spec, load_gpu_spec(sim_gpu or ("CPU" if real.device == "CPU" else "a100-sxm"))


def cmd_calibrate(options: CalibrateOptions) -> int:
    """Fit the sim's attainable fractions and step overhead to a real backend."""
    output, errors, backend, model = options.output, options.errors, options.load.backend, options.load.model
    for path in (output, errors):
        if path:
            check_writable(path)  # before minutes of sweeping, not after
    real = load_backend(backend, model, **options.load.load_options())
    spec, nominal = sim_specs_for(real, model, options.sim_model, options.sim_gpu)
    print(f"prefillbench: calibrating the sim against {real.model_name} on {real.label} "
          f"(nominal spec {nominal.name})", file=sys.stderr)

    def progress(i, n, p):
        print(f"\r  sweep {i}/{n}: {p.label:<32}", end="", file=sys.stderr, flush=True)

    cal = calibrate(real, spec, nominal, quick=options.quick, repeats=options.repeats, progress=progress)
    print(file=sys.stderr)
    if options.check:
        cal["check"] = compare_run(real, cal, *options.check_run)
    write_atomic(output, json_text(cal))
    if errors:
        write_atomic(errors, csv_text(pd.DataFrame(cal["steps"], columns=["point", "measured_ms", "predicted_ms", "error"])))
    f = cal["fitted"]
    print(describe_fraction("compute", f["compute_fraction"], nominal.name))
    print(describe_fraction("memory", f["memory_fraction"], nominal.name))
    print(f"step overhead {f['step_overhead_s'] * 1e3:.3f} ms: the fixed cost of one step beyond its compute and memory time")
    for line in describe_shape_terms(f):
        print(line)
    print(f"per-step error over {len(cal['steps'])} steps: median {cal['median_abs_error']:.1%}, "
          f"p90 {cal['p90_abs_error']:.1%}")
    if options.check:
        c = cal["check"]
        print(f"{c['test']} c={c['concurrency']}: chunked/sequential throughput real {c['real_ratio']:.3f}, "
              f"sim {c['sim_ratio']:.3f} ({c['ratio_error']:+.1%}); median step error {c['median_abs_step_error']:.1%}")
    print(f"wrote {output}")
    print(f"next: prefillbench run --backend sim --calibration {output} ...  (or prefillbench tune --calibration {output} ...)")
    return 0


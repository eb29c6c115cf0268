"""`prefillbench calibrate`: run a real backend through the sim's sweep, fit the sim to it, and check the fit.

It sits above both the backends and the sim: it loads a real backend, hands it to the sim's
sweep and fit (prefillbench.backends.sim.calibration, which knows no backend class), and with --check
runs the engine on the real backend and on the calibrated SimBackend side by side. A serving engine
(--backend llama-server, or server: launched or at --url) executes no step: it is probed with requests
whose steps are known (bench.server_probes) and the same fit runs on what they measured.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends import load_backend
from prefillbench.backends.base import ServingBackend
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.commands.options import CalibrateOptions
from prefillbench.models import default_model_path
from prefillbench.writers import check_writable, csv_text, json_text, write_atomic
from prefillbench.backends.sim.calibration import (calibrate, calibration_specs, describe_fraction, describe_shape_terms,
                                                   model_spec_of)
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.bench import server_probes
from prefillbench.bench.workloads import TestSpec, make_requests
from prefillbench.errors import UsageError


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
    elif isinstance(real, ServingBackend):
        # the served model's own file: a GGUF's metadata (llama-server), a Hugging Face folder's config.json (vLLM)
        path = real.model_path if real.launch or model else None
        if not path or not (Path(path).is_file() or (Path(path) / "config.json").is_file()):
            raise UsageError(f"the sim needs the shapes of the model {real.label} serves: give --sim-model "
                             "(a preset, a config.json or a GGUF file)")
        spec = load_model_spec(path)
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
    if isinstance(real, ServingBackend):
        try:
            return _calibrate_server(options, real)
        finally:
            real.close()
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
    print(measured_form_line(cal))
    if options.check:
        c = cal["check"]
        print(f"{c['test']} c={c['concurrency']}: chunked/sequential throughput real {c['real_ratio']:.3f}, "
              f"sim {c['sim_ratio']:.3f} ({c['ratio_error']:+.1%}); median step error {c['median_abs_step_error']:.1%}")
    print(f"wrote {output}")
    print(f"next: prefillbench run --backend sim --calibration {output} ...  (or prefillbench tune --calibration {output} ...)")
    return 0



# ---- a serving engine: probed, then the same fit ------------------------------------------------------------
#: A step jitter above this says the probes' times are the machine's noise more than the engine's steps: 0.76-1.0
#: on llama-server with 2 threads on 2 cores beside a vLLM, 0.05 on the stub, 0.11 on an eager vLLM here.
NOISY_JITTER = 0.3


def probe_server(real, plan: server_probes.ProbePlan, model: str | None, sim_model: str | None, sim_gpu: str | None,
                 err=None) -> dict[str, Any]:
    """The calibration of a serving engine from the plan's probes; `real` a server backend (launched, or at --url).
    Launched, it runs the engine's own strategy at the plan's budget with the plan's slots, so that each probe's
    steps are the ones the analysis assumes; at --url the server's configuration stands, and is said to."""
    err = err or sys.stderr
    spec, nominal = sim_specs_for(real, model, sim_model, sim_gpu)
    strategy = real.engine.default_strategy
    where = real.label if real.launch else f"the server at {real.url}"
    print(f"prefillbench: calibrating the sim on {where} with probes whose steps are known: {plan.describe()}", file=err)
    if not real.launch:
        print(f"prefillbench: note: {where} runs its own configuration; the probes assume its token budget holds "
              f"{plan.budget} tokens in one step and it runs {plan.slots} requests at once (a smaller one splits "
              "the probes' steps and the fit prices them whole)", file=err)

    def serve(requests, concurrency, watch=None):
        return real.serve(strategy, plan.budget, requests, concurrency, watch=watch)

    tty = getattr(err, "isatty", lambda: False)()

    def progress(i, n, label):  # one line rewritten on a terminal, a line a probe in a log
        print(f"\r  probe {i}/{n}: {label:<32}" if tty else f"  probe {i}/{n}: {label}", end="" if tty else "\n",
              file=err, flush=True)

    measured = server_probes.measure(serve, plan, real.vocab_size, progress)
    if tty:
        print(file=err)
    cal = server_probes.fit_probes(measured, spec, nominal, plan)
    cal.update({"backend": real.label, "backend_model": real.model_name, "backend_weights": real.weights})
    cal["probes"].update({"engine": real.engine.name, "strategy": strategy if real.launch else "as served",
                          "budget": plan.budget if real.launch else None, "slots": plan.slots if real.launch else None,
                          "server_command": " ".join(real.argv) if real.argv else None})
    return cal


def describe_probes(cal: dict[str, Any]) -> list[str]:
    """Each probe's measured and fitted time, the held-out shape marked, then the errors of the fit and the check."""
    lines = [f"{'probe':<30} {'what is measured':<42} {'measured ms':>11} {'fitted ms':>10} {'error':>7}"]
    for r in cal["steps"]:
        lines.append(f"{r['point']:<30} {r['probe']:<42} {r['measured_ms']:>11.2f} {r['predicted_ms']:>10.2f} "
                     f"{r['error']:>+7.1%}" + ("  held out" if r["held_out"] else ""))
    fitted = [r for r in cal["steps"] if not r["held_out"]]
    lines.append(f"fit error over {len(fitted)} probes: median {cal['median_abs_error']:.1%}, p90 {cal['p90_abs_error']:.1%}")
    if cal.get("held_out_abs_error") is not None:
        lines.append(f"held-out check ({cal['probes']['held_out']}, not in the fit): error {cal['held_out_abs_error']:.1%}")
    else:
        lines.append(f"held-out check ({cal['probes']['held_out']}): no sample came back (no decoder's token came in "
                     "those prompts' step: an engine that runs prompts apart from the decodes, or steps too erratic to match)")
    spread = cal["fitted"].get("step_jitter", 0.0)
    if spread > NOISY_JITTER:
        lines.append(f"warning: one shape's step times spread by {spread:.2f} (log standard deviation): the machine was "
                     "shared, or the engine's threads outnumber its free cores (llama.cpp's wait on every thread at "
                     "each step); calibrate with the machine alone, or with fewer threads (-t 1)")
    for why in cal["probes"].get("skipped", []):
        lines.append(f"skipped: {why}")
    if cal["probes"].get("failed_requests"):
        lines.append(f"{cal['probes']['failed_requests']} probe request(s) failed and were left out")
    return lines


def measured_form_line(cal: dict[str, Any]) -> str:
    """The measured pricing's fit (for --sim-pricing measured --calibration) in one line, or why there is none."""
    m = cal.get("measured") or {}
    if "fitted" not in m:
        return f"the measured pricing's terms: not fitted ({m.get('not_fitted', 'no sweep')})"
    held = (f", held out {m['held_out_abs_error']:.1%}" if m.get("held_out_abs_error") is not None else "")
    return (f"the measured pricing's terms (curves and host line, for --sim-pricing measured --calibration): per-step "
            f"error median {m['median_abs_error']:.1%}, p90 {m['p90_abs_error']:.1%}{held}")


def _calibrate_server(options: CalibrateOptions, real) -> int:
    if options.check:
        raise UsageError(f"--check steps the backend; {real.label} schedules its own steps: the held-out probe is "
                         "the fit's check there")
    plan = server_probes.plan(quick=options.quick, context=real.context_length, repeats=options.repeats)
    cal = probe_server(real, plan, options.load.model, options.sim_model, options.sim_gpu)
    write_atomic(options.output, json_text(cal))
    if options.errors:
        write_atomic(options.errors, csv_text(pd.DataFrame(
            cal["steps"], columns=["point", "probe", "held_out", "measured_ms", "predicted_ms", "error"])))
    f = cal["fitted"]
    print(describe_fraction("compute", f["compute_fraction"], cal["nominal_gpu"]))
    print(describe_fraction("memory", f["memory_fraction"], cal["nominal_gpu"]))
    print(f"step overhead {f['step_overhead_s'] * 1e3:.3f} ms: the fixed cost of one step beyond its compute and memory "
          "time (a request's way in and out included)")
    for line in describe_shape_terms(f) + describe_probes(cal):
        print(line)
    print(measured_form_line(cal))
    print(f"wrote {options.output}")
    backend = f"server --engine {real.engine.name}" + (f" --url {real.url}" if not real.launch else "") \
        if real.name == "server" else real.name
    print(f"next: prefillbench tune --backend {backend} --calibration {options.output} ...  "
          f"(or prefillbench run --backend sim --calibration {options.output} ...)")
    return 0

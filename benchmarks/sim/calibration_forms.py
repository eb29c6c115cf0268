"""The sim calibrated on a real backend both ways, fit and test apart: the spec pricing's fractions (five
parameters) against the measured pricing's curves and host line (ten), each fitted on half of the sweep's points
and tested on the other half.

The full calibration sweep (chunks of 8-512 at offsets 0-768, 1-8 decodes at 32-768 positions, chunk + decode
mixes) runs once on the backend, `--repeats` timings a point, medians kept; the points are split alternately in
sweep order (every kind of step on both sides), and each form is fitted on one half and priced on the other; then
the halves swap. Printed: each point's measured time and both forms' error where it was held out, then the median
and p90 |error| of each form on its fit half and its held-out half. `--samples FILE` keeps the measured medians
(JSON) and `--from FILE` refits them without measuring.

    python -m benchmarks.sim.calibration_forms --backend gguf
"""
from __future__ import annotations

import argparse
import json

from prefillbench.backends import load_backend
from prefillbench.backends.sim import calibration_measured as measured_form
from prefillbench.backends.sim.cost import Batch
from prefillbench.backends.sim.fit_errors import error_stats
from prefillbench.backends.sim.calibration import (Point, Sample, errors, fit, measure, medians,
                                                   sweep_points)
from prefillbench.commands.calibrate import sim_specs_for

from benchmarks.lib import cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="gguf", choices=["gguf"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", default="", help="write the measured medians here (JSON)")
    parser.add_argument("--from", dest="from_file", default="", help="refit medians written by --samples")


def _save(path: str, samples: list[Sample], spec, nominal) -> None:
    # the step as timed: the median repeat's decodes sat a few positions past the point's context
    rows = [{"chunk": s.point.chunk, "n_decodes": s.point.n_decodes, "ctx": s.point.ctx, "seconds": s.seconds,
             "batch_chunks": s.batch.chunks, "batch_decodes": s.batch.decodes} for s in samples]
    with open(path, "w") as f:
        json.dump({"model": spec.name, "device": nominal.name, "samples": rows}, f, indent=1)


def _load(path: str) -> list[Sample]:
    out = []
    for r in json.load(open(path))["samples"]:
        point = Point(tuple(r["chunk"]) if r["chunk"] else None, r["n_decodes"], r["ctx"])
        batch = Batch(tuple(map(tuple, r["batch_chunks"])), tuple(r["batch_decodes"]))
        out.append(Sample(point, batch, r["seconds"]))
    return out


def _both_forms(spec, nominal, fit_half: list[Sample], test_half: list[Sample]) -> dict[str, tuple[list, list]]:
    """Each form's errors on the half it was fitted on and on the half it never saw."""
    spec_fit = fit(spec, nominal, fit_half)
    gpu = nominal.with_calibration(spec_fit)
    out = {"spec (5 fractions)": ([e["error"] for e in errors(spec, gpu, fit_half)],
                                  [e["error"] for e in errors(spec, gpu, test_half)])}
    curves = measured_form.fit(spec, nominal, [s.batch for s in fit_half], [s.seconds for s in fit_half],
                               measured_form.start(spec_fit))

    def errs(half):
        return [e["error"] for e in measured_form.errors(spec, nominal, curves, [s.point.label for s in half],
                                                          [s.batch for s in half], [s.seconds for s in half])]

    out["measured (10 curve terms)"] = (errs(fit_half), errs(test_half))
    return out


def _stat(errs: list[float]) -> str:
    st = error_stats(errs)
    return f"{st['median_abs_error']:.1%} / {st['p90_abs_error']:.1%}"


def main(args: argparse.Namespace) -> None:
    if args.from_file:
        samples = _load(args.from_file)
        real = None
    else:
        real = load_backend(args.backend, None)
    spec, nominal = sim_specs_for(real, None) if real else sim_specs_for(load_backend(args.backend, None), None)
    if real:
        points = sweep_points(min(real.context_length, spec.max_context))
        samples = medians(measure(real, points, args.repeats))
        if args.samples:
            _save(args.samples, samples, spec, nominal)
    halves = (samples[0::2], samples[1::2])
    results = [_both_forms(spec, nominal, halves[k], halves[1 - k]) for k in (0, 1)]
    forms = list(results[0])
    print(f"{len(samples)} points on {spec.name}, {args.backend}; fitted on one half, tested on the other, then "
          "swapped\n")
    print(f"{'point':<34}{'measured ms':>12}" + "".join(f"{f.split(' (')[0] + ' held out':>22}" for f in forms))
    held = {f: [None] * len(samples) for f in forms}
    for k in (0, 1):
        test_idx = list(range(len(samples)))[1 - k::2]
        for f in forms:
            for i, e in zip(test_idx, results[k][f][1]):
                held[f][i] = e
    for i, s in enumerate(samples):
        print(f"{s.point.label:<34}{s.seconds * 1e3:12.2f}" + "".join(f"{held[f][i]:+22.1%}" for f in forms))
    print(f"\n{'form':<28}{'fit median / p90':>20}{'held-out median / p90':>26}")
    for f in forms:
        fit_errs = results[0][f][0] + results[1][f][0]
        test_errs = results[0][f][1] + results[1][f][1]
        print(f"{f:<28}{_stat(fit_errs):>20}{_stat(test_errs):>26}")


if __name__ == "__main__":
    cli.run(__name__)

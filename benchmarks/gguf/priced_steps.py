"""gguf steps against their price on a sim calibrated just before: is tune's step-time ratio the machine's drift?

Calibrates the sim on the gguf backend as tune --quick does (the quick sweep and the workload's step shapes),
prints each point's error under the fit with and without its two shape terms (decode attention's share, the
mixed-step factor: docs/sim.md), then alternates open-loop runs of chunked (32) and sequential on the --quick
workload (pp256+tg32, Poisson, near each one's capacity), and prints, per run, each kind of step's measured
seconds over the calibrated sim's price for the same steps. Drift moves both strategies alike, round by round;
a step shape the calibration prices wrong stays apart.

    python -m benchmarks.gguf.priced_steps [--rounds 3] [--requests 10]
"""
from __future__ import annotations

import argparse

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends import load_backend
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.calibration import errors, fit, measure, medians, sweep_points, workload_points
from prefillbench.bench.pricing import STEP_KINDS, priced_by_kind, pricer
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, make_requests
from prefillbench.commands.calibrate import sim_specs_for

from benchmarks.lib import cli

#: (strategy, budget, req/s): each near its capacity on this workload on the 2-core VM (tune --quick).
RUNS = (("chunked", 32, 0.55), ("sequential", None, 0.23))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=10)


def main(args: argparse.Namespace) -> None:
    real = load_backend("gguf", None)
    spec, nominal = sim_specs_for(real, None)
    test = TestSpec(256, 32)
    ctx = min(real.context_length, spec.max_context)
    points = sweep_points(ctx, quick=True)
    points += [p for p in workload_points(test.n_prompt, test.n_gen, [32, 64, 128, 256], ctx) if p not in points]
    samples = medians(measure(real, points))
    fits = {"3 parameters": fit(spec, nominal, samples, shape_terms=False), "5 parameters": fit(spec, nominal, samples)}
    errs = {name: errors(spec, nominal.with_calibration(f), samples) for name, f in fits.items()}
    print(f"{'point':<34}{'measured ms':>12}" + "".join(f"{name:>14}" for name in fits))
    for i, s in enumerate(samples):
        print(f"{s.point.label:<34}{s.seconds * 1e3:12.1f}" + "".join(f"{e[i]['error']:+14.0%}" for e in errs.values()))
    for name, e in errs.items():
        a = sorted(abs(x["error"]) for x in e)
        print(f"{name}: median |error| {a[(len(a) - 1) // 2]:.0%}, p90 {a[int(0.9 * (len(a) - 1))]:.0%}; fitted "
              + ", ".join(f"{k} {v:.4g}" for k, v in fits[name].items()))
    sim = SimBackend(spec, nominal.with_calibration(fits["5 parameters"]))
    price = pricer(sim.cost)
    for rnd in range(args.rounds):
        for strategy, budget, rate in RUNS:
            seed = 42 + rnd
            times = ArrivalSpec("poisson", rate).times(args.requests, seed, test)
            run = engine.run(real, make_strategy(strategy, budget or 256), make_requests(test, args.requests, real.vocab_size, seed, times), 0)
            print(f"round {rnd} {strategy:>10}: " + "; ".join(
                f"{STEP_KINDS[kind]} {took:5.1f} s / priced {priced:5.1f} s = {took / priced:.2f}x"
                for kind, (took, priced) in priced_by_kind(run.steps, price).items() if priced), flush=True)


if __name__ == "__main__":
    cli.run(__name__)

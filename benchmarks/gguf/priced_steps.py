"""gguf steps against their price on a sim calibrated just before: is tune's step-time ratio the machine's drift?

Calibrates the sim on the gguf backend (the quick sweep tune uses), then alternates open-loop runs of
chunked (32) and sequential on the --quick workload (pp256+tg32, Poisson, near each one's capacity), and
prints, per run, each kind of step's measured seconds over the calibrated sim's price for the same steps.
Drift moves both strategies alike, round by round; a step shape the calibration prices wrong stays apart.

    python -m benchmarks.gguf.priced_steps [--rounds 3] [--requests 10]
"""
from __future__ import annotations

import argparse

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends import load_backend
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.calibration import calibrate, calibration_specs
from prefillbench.bench.pricing import pricer
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
    cal = calibrate(real, spec, nominal, quick=True)
    model, gpu = calibration_specs(cal)
    price = pricer(SimBackend(model, gpu, calibration=cal).cost)
    test = TestSpec(256, 32)
    for rnd in range(args.rounds):
        for strategy, budget, rate in RUNS:
            seed = 42 + rnd
            times = ArrivalSpec("poisson", rate).times(args.requests, seed, test)
            run = engine.run(real, make_strategy(strategy, budget or 256), make_requests(test, args.requests, real.vocab_size, seed, times), 0)
            kinds: dict[str, list[float]] = {"with a prompt chunk": [0.0, 0.0], "decode-only": [0.0, 0.0]}
            for s in run.steps:
                k = kinds["with a prompt chunk" if s.prefill_chunks else "decode-only"]
                k[0] += s.seconds
                k[1] += price(s)
            print(f"round {rnd} {strategy:>10}: " + "; ".join(
                f"{name} {took:5.1f} s / priced {priced:5.1f} s = {took / priced:.2f}x"
                for name, (took, priced) in kinds.items() if priced), flush=True)


if __name__ == "__main__":
    cli.run(__name__)

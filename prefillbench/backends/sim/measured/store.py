"""The curves the sim prices with, fitted once and shipped as numbers: data/fitted_curves.json.

Fitting them when a run starts made the sim's numbers depend on the machine: scipy's least_squares stops at
parameters that move with the BLAS under it (OpenBLAS' Haswell and SkylakeX kernels put the fitted curves 1e-10
apart, and every simulated step time with them), so the step an AVX2 machine priced was not the float an AVX-512
one priced, and a capacity search could land on another rate. The file is what `python -m
prefillbench.backends.sim.measured.refit --write` fits from the shipped samples; tests/test_shipped_curves.py fits
them again and holds the file to the fit's own tolerance. JSON keeps every bit of a float (repr round-trips it).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

FILE = Path(__file__).resolve().parent / "data" / "fitted_curves.json"


@lru_cache(maxsize=1)
def _load() -> dict:
    return json.loads(FILE.read_text())


def section(name: str):
    """One part of the file: "linear" (per profiled GPU), "attention", "collectives"."""
    return _load()[name]


def section_tree() -> dict:
    """The whole file."""
    return _load()


def dumps(sections: dict) -> str:
    return json.dumps(sections, indent=1, sort_keys=True) + "\n"

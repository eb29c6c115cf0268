"""Serving runs that cannot mean anything: refused before the run, or warned about before and after it.

Pure functions: `before_run` raises ServingError (a one-line refusal with a
suggestion) or returns warnings; `after_run` reads the rows and returns
warnings. The command prints them.

How many requests an asked rate needs: the offered rate is estimated from the
N - 1 gaps between N arrivals, each gap drawn with mean 1/rate and coefficient
of variation 1/sqrt(shape) (1 for Poisson). Their mean has a relative error of
about 1/sqrt(shape (N - 1)), so the estimate is within a tolerance e for
N >= 1 / (shape e^2) + 1: 401 requests for 5% on a Poisson process.
"""
from __future__ import annotations

import math
from collections import defaultdict

from prefillbench.bench.cases import DEFAULT_OPEN_LOOP_REQUESTS, BenchConfig
from prefillbench.bench.metrics import ResultRow
from prefillbench.bench.workloads import TestSpec

RATE_TOLERANCE = 0.05  # the offered rate within 5% of the asked one
# Figures that differ between strategies whenever their schedules do.
_SCHEDULE_FIGURES = ("throughput", "ttft_p50_ms", "ttft_p99_ms", "tbt_p99_ms", "e2e_p99_ms")


class ServingError(ValueError):
    """A serving run whose result could not mean anything: one line, with what to run instead."""


def requests_for_rate(shape: float = 1.0, tolerance: float = RATE_TOLERANCE) -> int:
    """Arrivals needed for the offered rate to be within `tolerance` of the asked one (one standard error)."""
    return math.ceil(1.0 / (shape * tolerance**2)) + 1


def rate_error(n_requests: int, shape: float = 1.0) -> float:
    """The offered rate's relative standard error over n arrivals; inf for fewer than two."""
    return 1.0 / math.sqrt(shape * (n_requests - 1)) if n_requests > 1 else math.inf


def _pg_hint(tests: list[TestSpec]) -> str:
    prompt = max((t.n_prompt for t in tests), default=0) or 512
    gen = max((t.n_gen for t in tests), default=0) or 128
    return f"--pg {prompt},{gen}"


def _names(tests: list[TestSpec]) -> str:
    return " and ".join(t.name for t in tests)


def before_run(config: BenchConfig) -> list[str]:
    """Warnings for a run about to start; ServingError where nothing it could print would mean anything."""
    warnings = []
    slo = config.slo
    prompt_only = [t for t in config.tests if t.kind == "pp"]
    if slo is not None and slo.tbt_ms is not None and prompt_only:
        why = (f"{_names(prompt_only)} emit{'s' if len(prompt_only) == 1 else ''} one token per request: there are no gaps "
               f"between tokens, so a TBT objective cannot be missed there")
        if len(prompt_only) == len(config.tests):
            raise ServingError(f"--slo tbt={slo.tbt_ms:g}: {why}; give {_pg_hint(config.tests)} for requests that prefill and decode")
        warnings.append(f"--slo tbt={slo.tbt_ms:g}: {why} (goodput there counts only the other objectives)")
    if config.arrival in ("poisson", "gamma"):
        shape = 1.0 if config.arrival == "poisson" else config.burstiness
        needed = requests_for_rate(shape)
        counted = [t for t in config.tests if t.workload is None and t.sessions is None]
        n = config.requests or DEFAULT_OPEN_LOOP_REQUESTS
        if counted and n < needed:
            warnings.append(
                f"{n} requests per rate: the offered rate of {n} {config.arrival} arrivals is only known to about "
                f"±{100 * rate_error(n, shape):.0f}% of the asked one (1/sqrt(N-1)); --requests {needed} brings it "
                f"within {100 * RATE_TOLERANCE:g}%")
        if not any(t.kind == "pp+tg" for t in config.tests):
            warnings.append(
                f"{_names(config.tests)} {'has' if len(config.tests) == 1 else 'have'} no decode alongside prefill, "
                f"and mixing the two is where the strategies differ: expect little between them; "
                f"{_pg_hint(config.tests)} gives requests that need both")
    return warnings


def _alike(rows: list[ResultRow]) -> bool:
    def same(a: float, b: float) -> bool:
        both_nan = math.isnan(a) and math.isnan(b)
        return both_nan or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)

    first = rows[0]
    return all(same(getattr(r, f), getattr(first, f)) for r in rows[1:] for f in _SCHEDULE_FIGURES)


def after_run(rows: list[ResultRow]) -> list[str]:
    """Warnings from the measured rows: strategies that all measured alike, achieved rates above the offered."""
    warnings = []
    groups: dict[tuple, list[ResultRow]] = defaultdict(list)
    for r in rows:
        groups[(r.model, r.backend, r.test, r.concurrency, r.arrival, r.rate)].append(r)
    alike = [key for key, group in groups.items() if len({(r.strategy, r.chunk_size) for r in group}) > 1 and _alike(group)]
    if alike and len(alike) == len([g for g in groups.values() if len(g) > 1]):
        tests = list(dict.fromkeys(key[2] for key in alike))
        n = len({(r.strategy, r.chunk_size) for key in alike for r in groups[key]})
        mixed = [t for t in tests if "+" in t]
        why = ("the load never put a prefill beside a decode: raise --rate or -c" if mixed else
               "these tests have no decode alongside prefill, where the strategies differ: use --pg PP,TG")
        warnings.append(f"all {n} strategies measured alike on {' and '.join(tests)} at every load: {why}")
    above = [r for r in rows if r.achieved_rps > r.offered_rps]
    if above:
        r = above[0]
        warnings.append(
            f"achieved above offered on {len(above)} row(s) (e.g. {r.strategy} {r.test}: {r.achieved_rps:.2f} vs "
            f"{r.offered_rps:.2f} req/s): offered counts the {r.requests - 1} gaps between {r.requests} arrivals over "
            f"their span, achieved all {r.requests} completions from the first arrival to the last completion, so with "
            f"few requests a server that keeps up reads above offered ({r.requests}/{r.requests - 1} alone is "
            f"+{100 / max(r.requests - 1, 1):.0f}%); more --requests make the two agree")
    return warnings

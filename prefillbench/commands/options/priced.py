"""Where a strategy that prices its steps (slo-budget) can run, checked before anything loads.

It needs a TBT or TPOT SLO to aim each step at, a cost model to price steps by (the sim's own, or a calibration
file of a real backend: --calibration, or tune's own sweep) and an engine that takes a budget per step (no serving
engine does). Named with -s where it cannot run: one line and a non-zero exit. In a default list (no -s): left out,
so that a run without an SLO still runs every other strategy.
"""
from __future__ import annotations

from dataclasses import replace

from prefillbench.bench.slo_pricing import prices_steps, step_limit_ms
from prefillbench.errors import UsageError

__all__ = ["checked", "pricing_file", "server_refusal", "why_not"]


def server_refusal(name: str, backend: str) -> UsageError:
    return UsageError(f"{name} cannot run on the {backend} backend: it chooses each step's prompt budget, and no serving "
                      "engine takes a per-step budget from outside; run it on --backend sim, gguf or torch")


def why_not(name: str, load, tbt_ms: float | None, tpot_ms: float | None, priced: bool, elsewhere: str = "") -> str:
    """Why `name` cannot run here ('' where it can). `priced`: the run has a cost model to price steps by;
    `elsewhere`: a layout it does not run in (--disaggregate, tune --gpus), named."""
    if load.served_engine() is not None:
        return str(server_refusal(name, load.name))
    if elsewhere:
        return f"{name} runs on one engine: {elsewhere} does not run it"
    if step_limit_ms(tbt_ms, tpot_ms) is None:
        return f"{name} holds each step within the TBT (or TPOT) SLO: give --slo tbt=MS (or tpot=MS)"
    if not priced:
        return (f"{name} prices its steps by a calibration of the {load.name} backend: give --calibration FILE "
                f"(prefillbench calibrate --backend {load.name} writes one)")
    return ""


def checked(names: list[str], given: bool, load, tbt_ms: float | None, tpot_ms: float | None, priced: bool,
            elsewhere: str = "") -> list[str]:
    """`names` with each strategy that prices its steps checked (why_not): refused where -s named it (`given`), left
    out of a default list."""
    out = []
    for name in names:
        reason = why_not(name, load, tbt_ms, tpot_ms, priced, elsewhere) if prices_steps(name) else ""
        if reason and given:
            raise UsageError(reason)
        if not reason:
            out.append(name)
    return out


def pricing_file(names: list[str], load):
    """(load, calibration): on a real step backend running a strategy that prices its steps, --calibration is the
    file its steps are priced by, taken out of the backend's options (which would name it as ignored); on the sim it
    stays the sim's own (and prices the run as it calibrates the sim)."""
    if load.name == "sim" or not any(prices_steps(n) for n in names) or not load.calibration:
        return load, load.calibration if load.name == "sim" else None
    return replace(load, calibration=None), load.calibration

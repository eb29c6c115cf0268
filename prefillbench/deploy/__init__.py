"""Deployments: how many engine instances serve a workload, and what each one runs.

A colocated deployment is one engine (engine.run on one backend): prompts and decodes share its steps, and a
strategy decides how. A disaggregated one (disaggregated.py) keeps them apart: prefill instances, decode
instances, and the KV's transfer between them (links.py). Either is engine loops on backends, recorded as one
run; `run_requests` is where bench asks for one or the other.
"""
from __future__ import annotations

from collections.abc import Callable

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends.base import Backend
from prefillbench.deploy.disaggregated import Disaggregation, SimDeployment
from prefillbench.engine import Progress, RunRecord
from prefillbench.sequence import Request

__all__ = ["Disaggregation", "close_deployments", "deployment_for", "run_requests"]


_built: dict[tuple[int, Disaggregation], object] = {}


def deployment_for(backend: Backend, spec: Disaggregation):
    """The deployment's instances, built once per backend and layout (every case and probe reuses them): sim
    instances (disaggregated.py), or llama.cpp in two processes (gguf_split.py)."""
    key = (id(backend), spec)
    if key not in _built:
        if backend.name == "gguf":
            from prefillbench.deploy.gguf_split import GGUFDeployment

            _built[key] = GGUFDeployment(backend, spec)
        else:
            _built[key] = SimDeployment(backend, spec)
    return _built[key]


def close_deployments() -> None:
    """Stop what the deployments started (the gguf prefill process): the command's end, or a test's."""
    while _built:
        _, deployment = _built.popitem()
        if hasattr(deployment, "close"):
            deployment.close()


def run_requests(backend: Backend, strategy: str, chunk_size: int | None, requests: list[Request], concurrency: int,
                 deployment: Disaggregation | None = None, on_tokens: Callable[[int], None] | None = None,
                 stop: Callable[[Progress], bool] | None = None) -> RunRecord:
    """The requests on the backend as one engine (`deployment` None), or through a disaggregated deployment of
    its instances (which runs to the end: `stop` watches one engine's progress)."""
    if deployment is None:
        return engine.run(backend, make_strategy(strategy, chunk_size), requests, concurrency, on_tokens=on_tokens,
                          stop=stop)
    return deployment_for(backend, deployment).run(strategy, chunk_size, requests, concurrency, on_tokens)

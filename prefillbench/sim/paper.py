"""SARATHI's (arXiv 2308.16369) experiments, rebuilt on the sim: used by the tests and `docs/sim.md`.

Ratios are measured the way the paper defines them:
- decode speed-up: per-token decode time in decode-only batches (the baseline's
  decode steps) over the marginal per-token decode time when decodes ride along
  with a prefill chunk (a mixed step's time minus the same step without its decodes);
- end-to-end: tokens per second of the whole closed-loop run, chunked over baseline.
"""
from __future__ import annotations

from dataclasses import dataclass

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends.sim_backend import SimBackend
from prefillbench.engine import RunRecord, StepRecord
from prefillbench.workloads import TestSpec, make_requests

from .cost import Batch
from .specs import load_gpu_spec, load_model_spec


def workload(seq_len: int, pd_ratio: float) -> TestSpec:
    """A sequence of `seq_len` tokens split into prompt and generation at P:D = `pd_ratio`."""
    n_gen = max(1, round(seq_len / (pd_ratio + 1)))
    return TestSpec(seq_len - n_gen, n_gen)


def batch_of(rec: StepRecord, with_decodes: bool = True) -> Batch:
    chunks = tuple((start, length, False) for start, length in rec.prefill_chunks)
    if chunks and rec.n_pad:
        s, n, e = chunks[-1]
        chunks = chunks[:-1] + ((s, n + rec.n_pad, e),)
    return Batch(chunks, tuple(rec.decode_contexts) if with_decodes else ())


def decode_only_ms_per_token(run: RunRecord) -> float:
    steps = [s for s in run.steps if s.decode_contexts and not s.prefill_chunks]
    return 1e3 * sum(s.seconds for s in steps) / sum(len(s.decode_contexts) for s in steps)


def piggyback_ms_per_token(backend: SimBackend, run: RunRecord) -> float:
    steps = [s for s in run.steps if s.decode_contexts and s.prefill_chunks]
    marginal = sum(s.seconds - backend.cost.seconds(batch_of(s, with_decodes=False)) for s in steps)
    return 1e3 * marginal / sum(len(s.decode_contexts) for s in steps)


def throughput(run: RunRecord, test: TestSpec) -> float:
    return len(run.requests) * test.tokens_per_request / run.wall


@dataclass
class Comparison:
    test: TestSpec
    batch: int
    runs: dict[str, RunRecord]
    decode_ms: float  # baseline decode-only, per token
    piggyback_ms: float  # chunked, marginal per piggybacked decode
    throughputs: dict[str, float]

    @property
    def decode_speedup(self) -> float:
        return self.decode_ms / self.piggyback_ms

    def e2e(self, baseline: str = "sequential") -> float:
        return self.throughputs["chunked"] / self.throughputs[baseline]


def compare(model: str, gpu: str, test: TestSpec, batch: int, *, chunk: int = 256, requests: int | None = None,
            tp: int = 1, pp: int = 1, strategies=("sequential", "chunked"), **gpu_overrides) -> Comparison:
    spec = load_gpu_spec(gpu)
    if gpu_overrides:
        spec = spec.with_calibration(gpu_overrides)
    backend = SimBackend(load_model_spec(model), spec, tp=tp, pp=pp)
    reqs = make_requests(test, requests or 10 * batch, backend.vocab_size, seed=1)
    runs = {name: engine.run(backend, make_strategy(name, chunk), reqs, batch) for name in strategies}
    return Comparison(
        test, batch, runs,
        decode_only_ms_per_token(runs["sequential"]),
        piggyback_ms_per_token(backend, runs["chunked"]) if pp == 1 else float("nan"),
        {name: throughput(run, test) for name, run in runs.items()},
    )

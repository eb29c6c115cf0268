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
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.engine import RunRecord, StepRecord
from prefillbench.bench.pricing import batch_of
from prefillbench.bench.workloads import TestSpec, make_requests

from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.backends.sim.cost import Batch


def workload(seq_len: int, pd_ratio: float) -> TestSpec:
    """A sequence of `seq_len` tokens split into prompt and generation at P:D = `pd_ratio`."""
    n_gen = max(1, round(seq_len / (pd_ratio + 1)))
    return TestSpec(seq_len - n_gen, n_gen)


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


# ---- the validation table (python -m prefillbench.sim.paper) ------------------------------------------------
def table2(gpu_overrides: dict | None = None) -> dict[str, float]:
    from prefillbench.backends.sim.cost import CostModel

    spec = load_gpu_spec("a6000")
    if gpu_overrides:
        spec = spec.with_calibration(gpu_overrides)
    cm = CostModel(load_model_spec("llama-13b"), spec)
    prefill = cm.seconds(Batch(((0, 1024, True),)))
    decode4 = cm.seconds(Batch((), (1024,) * 4))
    mixed = cm.seconds(Batch(((0, 1021, True),), (1024,) * 3))
    marginal = (mixed - cm.seconds(Batch(((0, 1021, True),)))) / 3
    return {"prefill_ms": prefill * 1e3, "decode4_ms": decode4 * 1e3, "mixed_ms": mixed * 1e3,
            "piggyback_ratio": decode4 / 4 / marginal}


def gpt3_pipeline(seq_len: int = 1024, pd_ratio: float = 50, per_micro_batch: int = 6, requests_per_slot: int = 5):
    from strategies import make_strategy as _make

    test = workload(seq_len, pd_ratio)
    conc = 8 * per_micro_batch
    out = {}
    for name in ("sequential", "chunked"):
        backend = SimBackend(load_model_spec("gpt3-175b"), load_gpu_spec("a100-sxm"), tp=8, pp=8)
        reqs = make_requests(test, conc * requests_per_slot, backend.vocab_size, seed=1)
        record = engine.run(backend, _make(name, 256), reqs, conc)
        stats = backend.pipeline_stats
        out[name] = (throughput(record, test), stats)
    return {
        "bubble_ratio": out["sequential"][1]["median_bubble_per_request_s"] / out["chunked"][1]["median_bubble_per_request_s"],
        "throughput_ratio": out["chunked"][0] / out["sequential"][0],
        "busy_sequential": out["sequential"][1]["stage_busy_fraction"],
        "busy_chunked": out["chunked"][1]["stage_busy_fraction"],
    }


def main() -> None:
    rows = []
    t2 = table2()
    rows += [("Table 2: 1024-token prefill (ms)", 235, t2["prefill_ms"]),
             ("Table 2: decode-only batch of 4 (ms)", 50, t2["decode4_ms"]),
             ("Table 2: 1021 prefill + 3 decodes (ms)", 238, t2["mixed_ms"]),
             ("Table 2: decode-only / piggybacked cost per decode", 12.49 / 1.17, t2["piggyback_ratio"])]
    c13 = compare("llama-13b", "a6000", workload(1024, 50), 6)
    rows += [("LLaMA-13B A6000 1K B6 P:D50 decode speed-up", 5.45, c13.decode_speedup),
             ("LLaMA-13B A6000 1K B6 P:D50 end-to-end", 1.33, c13.e2e())]
    c33 = compare("llama-33b", "a100-sxm", workload(2048, 50), 5)
    rows += [("LLaMA-33B A100 2K B5 P:D50 decode speed-up", 4.25, c33.decode_speedup),
             ("LLaMA-33B A100 2K B5 P:D50 end-to-end", 1.235, c33.e2e())]
    for b in (4, 6, 8):
        grid = [10, 20, 30, 40, 50, 60, 80, 100, 150, 200]
        gains = {pd: compare("llama-13b", "a6000", workload(1024, pd), b, requests=8 * b).e2e() for pd in grid}
        rows.append((f"P:D of peak gain, B={b} (paper: C/(B-1))", 256 / (b - 1), max(gains, key=gains.get)))
    g = gpt3_pipeline()
    rows += [("GPT-3 TP8xPP8 median bubble reduction", 6.29, g["bubble_ratio"]),
             ("GPT-3 TP8xPP8 end-to-end", 1.91, g["throughput_ratio"])]
    print("| check | paper | sim | sim/paper |")
    print("| --- | ---: | ---: | ---: |")
    for name, paper, sim in rows:
        print(f"| {name} | {paper:.3g} | {sim:.3g} | {sim / paper - 1:+.0%} |")


if __name__ == "__main__":
    main()

"""Speculative decoding on the sim (prefillbench/backends/sim/drafting.py): the acceptance law, `verified` as the
engine reads it, the verify step's price and the drafter's per method."""
from __future__ import annotations

import math
import random

import pytest

from prefillbench import engine
from prefillbench.backends.base import BackendError
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.breakdown import Batch
from prefillbench.backends.sim.drafting import Acceptance, draft_layer
from prefillbench.sequence import Request
from prefillbench.speculation import parse_spec
from prefillbench.step import DecodeToken, Step
from strategies import make_strategy


def test_acceptance_follows_the_truncated_geometric_law_and_is_fixed_by_sequence_and_position():
    acc, k, p = Acceptance((0.7,), "0.7"), 3, 0.7
    counts = [0] * (k + 1)
    n = 40_000
    for i in range(n):
        counts[acc.accepted(i % 400, 1000 + i, k)] += 1
    law = [p ** i * (1 - p) for i in range(k)] + [p ** k]
    for got, want in zip(counts, law):  # binomial standard error at n draws, 5 sigma
        assert abs(got / n - want) < 5 * math.sqrt(want * (1 - want) / n)
    assert acc.mean_accepted(3) == pytest.approx(0.7 + 0.49 + 0.343)
    assert [acc.accepted(5, 77, 3) for _ in range(3)] == [acc.accepted(5, 77, 3)] * 3  # no stream: a hash


def requests(n: int = 40, seed: int = 0):
    rng = random.Random(seed)
    return [Request(tuple(rng.randrange(3, 1000) for _ in range(rng.randint(64, 512))), rng.randint(16, 96),
                    arrival_s=i * 0.01) for i in range(n)]


def run(spec: str, strategy: str = "vllm-v1", budget: int = 1024, model: str = "llama-3.1-8b"):
    backend = SimBackend.load(model, "h100-sxm", sim_pricing="spec")
    return backend, engine.run(backend, make_strategy(strategy, budget, parse_spec(spec)), requests(), 32)


@pytest.mark.parametrize("accept", [0.0, 0.6, 1.0])
def test_the_engine_keeps_what_the_sim_verifies_and_every_request_ends_with_its_tokens(accept):
    _, plain = run("off")
    _, spec = run(f"eagle:3:accept={accept}")
    assert [len(r.tokens) for r in spec.requests] == [len(r.tokens) for r in plain.requests]
    # tokens that appear together came from one verify step: none with nothing kept, up to 4 with everything
    together = [len(r.token_times) - len(set(r.token_times)) for r in spec.requests]
    decoded = sum(len(r.tokens) - 1 for r in spec.requests)
    if accept == 0.0:
        assert sum(together) == 0
    elif accept == 1.0:
        assert sum(together) > 0.7 * decoded  # 3 of every 4 tokens, less the requests' first and last steps
    else:
        assert 0.2 * decoded < sum(together) < 0.7 * decoded


def test_a_verify_step_costs_more_than_a_plain_decode_and_less_than_as_many_decodes():
    backend = SimBackend.load("llama-3.1-8b", "h100-sxm", sim_pricing="spec")
    cost = backend.cost
    plain = cost.seconds(Batch((), (2048,) * 64))
    verify = cost.seconds(Batch((), (), ((2047, 4),) * 64))
    four = cost.seconds(Batch((), (2048,) * 256))
    assert plain < verify < four  # the weights read once, the context once a sequence
    # the fast path prices it to the same float as the operator sum
    assert cost.fast_seconds([], 0, 0, 256, None, False, [(2047, 4)] * 64) == verify


def test_the_drafter_costs_nothing_for_ngram_one_layer_for_eagle_and_mtp_a_small_model_for_draft():
    backend = SimBackend.load("llama-3.1-8b", "h100-sxm", sim_pricing="spec")
    steps = {}
    for spec in ("eagle:3:accept=0.7", "draft:3:accept=0.7"):
        backend.speculate(parse_spec(spec))
        steps[spec.split(":")[0]] = backend.drafting.draft_seconds(64, 64 * 2048, 3)
    target = backend.cost.seconds(Batch((), (2048,) * 64))
    assert 0 < steps["eagle"] < steps["draft"] < 3 * target  # one layer < a 1B model < the 8B target, K times
    assert steps["eagle"] < 3 * target / 8
    assert draft_layer(backend.model).n_layers == 1
    moe = draft_layer(SimBackend.load("deepseek-v3", "h200", tp=8, sim_pricing="spec").model)
    assert moe.n_experts and moe.is_moe_layer(0)  # DeepSeek-V3's MTP module is an MoE layer


def test_ngram_on_the_sim_is_refused_in_one_line():
    backend = SimBackend.load("llama-3.1-8b", "h100-sxm", sim_pricing="spec")
    with pytest.raises(BackendError, match="cannot run --spec ngram:3"):
        engine.run(backend, make_strategy("vllm-v1", 256, parse_spec("ngram:3")), requests(2), 2)


def test_verified_keeps_the_accepted_drafts_then_differs():
    backend = SimBackend.load("llama-3.1-8b", "h100-sxm", sim_pricing="spec")
    backend.speculate(parse_spec("eagle:3:accept=0.5"))
    backend.prepare(8, 4096, 4096)
    result = backend.execute(Step(decodes=tuple(DecodeToken(i, 7, 100 + i, (0, 0, 0)) for i in range(8))))
    for seq_id, answer in result.verified.items():
        kept = backend.drafting.acceptance.accepted(seq_id, 100 + seq_id, 3)
        assert answer[:kept] == (0,) * kept and len(answer) == 4
        assert kept == 3 or answer[kept] != 0
        assert result.next_tokens[seq_id] == answer[0]


def test_tune_says_at_which_budgets_speculation_pays_and_where_it_stops():
    from prefillbench.bench.capacity import Criteria, Probe, SearchResult
    from prefillbench.bench.tune import Config, ConfigResult
    from prefillbench.report.spec_verdict import rules_of, spec_lines

    def result(name: str, budget: int, capacity: float) -> ConfigResult:
        fail = Probe(capacity * 1.05, False, None)
        return ConfigResult(Config(name, budget), Criteria(100.0), [SearchResult(capacity, [fail])])

    k3 = "vllm-v1 · spec eagle:3:accept=0.7"
    assert rules_of(k3) == "vllm-v1"
    rows = [result("vllm-v1", 512, 10.0), result(k3, 512, 14.0), result("vllm-v1", 8192, 20.0), result(k3, 8192, 12.0)]
    lines = spec_lines(rows)
    assert lines[0].startswith("vllm-v1, budget 512: spec off 10.000 req/s; eagle:3:accept=0.7 14.000 (+40%, beats)")
    assert "speculation pays" in lines[0] and "does not pay" in lines[1] and "(-40%, loses to)" in lines[1]
    assert lines[2] == "speculation stops paying at vllm-v1, budget 8192 (it pays at vllm-v1, budget 512)"
    assert spec_lines([r for r in rows if "spec" not in r.config.strategy]) == []

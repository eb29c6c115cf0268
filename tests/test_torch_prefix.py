"""The torch backend's prefix cache (prefixes.py: entries copied in rows of the static KV cache): a cached prefix
gives the logits of a plain forward pass over the whole prompt, prompts resume after it and compute only the rest,
entries are evicted under the cache's capacity, and a Mooncake trace's hit rate is what its block ids imply."""
from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from prefillbench import engine
from prefillbench.backends.prefix import PrefixSettings
from prefillbench.backends.torch.backend import LOGIT_TOLERANCE, TorchBackend
from prefillbench.sequence import Request
from strategies import make_strategy
from tiny_models import TEST_DEVICE, reference_logits, tiny_model

from mooncake_traces import write_conversations

SHARED, OWN, GEN, BLOCK = 96, 24, 4, 16


def _requests(n=5, seed=0):
    rng = np.random.default_rng(seed)
    system = tuple(rng.integers(100, 250, size=SHARED).tolist())
    return [Request(system + tuple(rng.integers(100, 250, size=OWN).tolist()), GEN) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama")


@pytest.mark.parametrize("name, c", [("sequential", 1), ("chunked", 2), ("sarathi-serve", 3), ("padded", 2),
                                     ("chunked", 5)])
def test_a_cached_prefix_gives_the_logits_of_a_plain_forward_pass(tiny, name, c):
    model, reference = tiny
    backend = TorchBackend(model, "tiny-llama", TEST_DEVICE, prefix=PrefixSettings(True, BLOCK))
    reqs = _requests()
    run = engine.run(backend, make_strategy(name, 32), reqs, c, keep_logits=True)
    cached = [r.cached_tokens for r in run.requests]
    # Every prompt after the first to start finds the shared blocks (at c=5 all start together: only those whose
    # first chunk comes after the first prompt's blocks are computed).
    assert sum(cached) >= 2 * SHARED and all(n % BLOCK == 0 and n <= SHARED for n in cached), cached
    computed = sum(n for step in run.steps for _, n in step.prefill_chunks)
    assert computed == sum(len(r.prompt) for r in reqs) - sum(cached)
    tol = LOGIT_TOLERANCE[backend.dtype]
    for req, rec in zip(reqs, run.requests):
        ref = reference_logits(reference, list(req.prompt) + rec.tokens[:-1]).numpy()
        got = np.stack(rec.logits)
        want = ref[len(req.prompt) - 1:]
        # float32 summation order moves a logit by < 1e-4; a wrong or missing cached position by whole units.
        assert np.abs(got - want).max() <= tol.max_abs, (name, c)
    meta = backend.metadata()
    assert meta["prefix_cache"] == "on" and meta["prefix_cache_hit_tokens"] == sum(cached)
    assert meta["prefix_cache_copied_tokens"] >= sum(cached)  # each hit copied, and each entry made


def test_without_the_cache_nothing_is_reused(tiny):
    model, _ = tiny
    backend = TorchBackend(model, "tiny-llama", TEST_DEVICE)
    run = engine.run(backend, make_strategy("sequential"), _requests(3), 1)
    assert not backend.caches_prefixes and all(not r.cached_tokens for r in run.requests)
    assert backend.metadata()["prefix_cache"] == "off"


def test_the_cache_evicts_under_its_capacity(tiny):
    # Two 64-token prefixes alternating, a cache of 6 blocks of 16: each prompt's 4 blocks push the other's out.
    model, _ = tiny
    rng = np.random.default_rng(1)
    a, b = (tuple(rng.integers(100, 250, size=64).tolist()) for _ in range(2))
    reqs = [Request((a if i % 2 == 0 else b) + (200 + i,), 2) for i in range(6)]
    roomy = TorchBackend(model, "tiny-llama", TEST_DEVICE, prefix=PrefixSettings(True, BLOCK))
    assert [r.cached_tokens for r in engine.run(roomy, make_strategy("sequential"), reqs, 1).requests] == [0, 0] + [64] * 4
    small = TorchBackend(model, "tiny-llama", TEST_DEVICE, prefix=PrefixSettings(True, BLOCK, capacity=6 * BLOCK))
    run = engine.run(small, make_strategy("sequential"), reqs, 1)
    assert [r.cached_tokens for r in run.requests] == [0] * 6
    assert small.metadata()["prefix_cache_evicted_blocks"] >= 16


def test_a_mooncake_trace_hits_what_its_block_ids_imply(tiny_folder, tmp_path, run_cli):
    trace = write_conversations(tmp_path / "conv.jsonl", 3, 3, gap_ms=4000)
    result = run_cli("run", "--backend", "torch", "-m", tiny_folder, "--device", "cpu", "--workload", str(trace),
                     "--token-scale", "0.0625", "--time-scale", "0.1", "-s", "sequential", "-o", "csv",
                     "--no-results-file", "--no-verdict", "--kernels", "torch")
    assert result.code == 0, result.err
    row = next(csv.DictReader(io.StringIO(result.out)))
    measured, implied = float(row["prefix_hit_rate"]), float(row["prefix_hit_implied"])
    assert implied > 0.3 and abs(measured - implied) <= 0.02


def test_verify_feeds_each_sessions_turn_its_own_tokens_whatever_order_a_run_admitted_them():
    # Two runs of the same sessions admit later turns as earlier ones finish, so in different orders: --verify must
    # pair a turn with the same turn, not with whatever was admitted at the same index (it compared 20 of 48
    # positions wrongly before, on every backend).
    from prefillbench.bench.cases import in_request_order, teacher_forced
    from prefillbench.engine import RunRecord
    from prefillbench.engine.records import RequestRecord

    requests = [Request((1, 2, 3), 2, session=s, turn=t) for s in range(2) for t in range(2)]
    admitted = [(0, 0), (1, 0), (1, 1), (0, 1)]  # session 1's second turn entered before session 0's
    records = [RequestRecord(3, 0.0, [0.0, 0.1], [10 * s + t, 100 + 10 * s + t], session=s, turn=t) for s, t in admitted]
    run = RunRecord(0.0, 1.0, records, [])
    assert [(r.session, r.turn) for r in in_request_order(run)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    forced = teacher_forced(requests, run)
    assert [f.forced_tokens for f in forced] == [(10 * r.session + r.turn, 100 + 10 * r.session + r.turn) for r in requests]


def test_verify_holds_with_the_cache_on_over_multi_turn_sessions(tiny_folder, run_cli):
    result = run_cli("run", "--backend", "torch", "-m", tiny_folder, "--device", "cpu", "--workload",
                     "sessions:n=2,turns=3,system=64,message=8,answer=4,think=0.05", "--arrival", "poisson", "--rate", "4",
                     "-s", "sequential,chunked,sarathi-serve", "--chunk-size", "16", "--verify", "--no-results-file",
                     "--no-verdict", "--kernels", "torch")
    assert result.code == 0, result.err
    assert "prefix cache on" in result.err and "verify: all 2 comparisons agree within tolerance" in result.err

"""gguf's prefix cache on llama.cpp's unified KV cache: the same logits as computing every prompt whole (teacher
forced, within the backend's own tolerance), prompts resuming after their cached prefix, entries evicted without
losing a shared prefix, and the hit rate of a Mooncake trace against what its block ids imply."""
from __future__ import annotations

import numpy as np
import pytest

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends.gguf import GGUFBackend
from prefillbench.backends.prefix import PrefixSettings
from prefillbench.sequence import Request

from mooncake_traces import write_conversations


def _requests(n=5, shared=96, own=24, gen=4, seed=0):
    rng = np.random.default_rng(seed)
    system = tuple(rng.integers(100, 250, size=shared).tolist())
    return [Request(system + tuple(rng.integers(100, 250, size=own).tolist()), gen) for _ in range(n)]


def _teacher_forced(path, reqs, strategy, c, **load):
    """Logits of every emitted position, each request fed the tokens of a run with the cache off."""
    off_backend = GGUFBackend.load(path, threads=1)
    off = engine.run(off_backend, strategy, reqs, c, keep_logits=True)
    off_backend.close()
    forced = [Request(r.prompt, r.n_gen, forced_tokens=tuple(o.tokens)) for r, o in zip(reqs, off.requests)]
    backend = GGUFBackend.load(path, threads=1, **load)
    on = engine.run(backend, strategy, forced, c, keep_logits=True)
    return off, on, backend


@pytest.mark.parametrize("name, c", [("sequential", 1), ("chunked", 2), ("sarathi-serve", 3), ("padded", 2)])
def test_a_cached_prefix_gives_the_logits_of_computing_it(tiny_gguf_path, name, c):
    reqs = _requests()
    off, on, backend = _teacher_forced(tiny_gguf_path, reqs, make_strategy(name, 32), c, prefix_cache="on")
    tol = backend.logit_tolerance()
    cached = [r.cached_tokens for r in on.requests]
    assert sum(cached) >= 3 * 96 and all(n % 16 == 0 and n <= 96 for n in cached)
    worst = max(float(np.abs(np.array(a) - np.array(b)).max())
                for x, y in zip(off.requests, on.requests) for a, b in zip(x.logits, y.logits))
    # A wrong or missing cell moves a logit by whole units; batch composition on f32 weights by < 0.02.
    assert worst <= tol.max_abs, (name, worst)
    computed = sum(n for step in on.steps for _, n in step.prefill_chunks)
    assert computed == sum(len(r.prompt) for r in reqs) - sum(cached)
    backend.close()


def test_the_cache_evicts_under_its_capacity_and_keeps_what_another_entry_shares(tiny_gguf_path):
    # Two 64-token prefixes alternating, a cache of 6 blocks of 16: each prompt's 4 blocks push the other's out.
    rng = np.random.default_rng(1)
    a, b = (tuple(rng.integers(100, 250, size=64).tolist()) for _ in range(2))
    reqs = [Request((a if i % 2 == 0 else b) + (200 + i,), 2) for i in range(6)]
    backend = GGUFBackend.load(tiny_gguf_path, threads=1, prefix_cache="on")
    assert [r.cached_tokens for r in engine.run(backend, make_strategy("sequential"), reqs, 1).requests] == [0, 0] + [64] * 4
    backend.prefix = PrefixSettings(True, 16, capacity=6 * 16)
    run = engine.run(backend, make_strategy("sequential"), reqs, 1)
    assert [r.cached_tokens for r in run.requests] == [0] * 6
    assert backend.metadata()["prefix_cache_evicted_blocks"] >= 16
    backend.close()


def test_a_mooncake_trace_hits_what_its_block_ids_imply(tiny_gguf_path, tmp_path, run_cli):
    # Three conversations of growing history (each turn's prompt is the last one's blocks plus one), replayed
    # slowly enough that no two prompts overlap: the measured hit rate is the implied one.
    trace = write_conversations(tmp_path / "conv.jsonl", 3, 3, gap_ms=4000)
    result = run_cli("run", "-m", tiny_gguf_path, "--workload", str(trace), "--token-scale", "0.0625",
                     "--time-scale", "0.1", "-s", "sequential", "-o", "csv", "--no-results-file", "--no-verdict", "-t", "1")
    assert result.code == 0, result.err
    import csv, io
    row = next(csv.DictReader(io.StringIO(result.out)))
    measured, implied = float(row["prefix_hit_rate"]), float(row["prefix_hit_implied"])
    assert implied > 0.3 and abs(measured - implied) <= 0.02
    assert "prefix cache on" in result.err

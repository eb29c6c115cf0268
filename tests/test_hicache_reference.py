"""engine/hicache.py against SGLang 0.5.23's own HiCache (UnifiedRadixCache with init_hicache, its host pool and cache
controller, driven in-process by benchmarks/engine/sglang_hicache.py with stand-ins only for the CUDA copies):
seeded random runs of inserts, lookups, locks, loads, evictions and event polls, each write policy, every answer and
the pools' sizes after every operation equal."""
from __future__ import annotations

import pytest

from benchmarks.engine.sglang_hicache_check import compare, random_run, reference
from prefillbench.engine.hicache import WRITE_POLICIES, HiRadixCache


@pytest.fixture(scope="module")
def answered():
    runs = [random_run(seed, 400, policy) for seed in (1, 2, 3, 4) for policy in WRITE_POLICIES]
    return runs, reference(runs)


def test_every_operation_answers_as_sglangs_hicache_under_each_write_policy(answered):
    runs, answers = answered
    rows, first = compare(runs, answers)
    assert first is None, first
    # the runs exercise what they claim: loads that loaded, under each policy
    for policy in WRITE_POLICIES:
        assert sum(row[5] for row in rows if row[1] == policy) >= 10


class MostRecentHostLeafFirst(HiRadixCache):
    """A wrong rule: the host evicts its most recently used leaf."""

    def evict_host(self, num_tokens):
        for node in self.host_leaves:
            node.last_access = -node.last_access
        try:
            return super().evict_host(num_tokens)
        finally:
            for node in self.host_leaves:
                node.last_access = -node.last_access


class LoadsBelowTheThreshold(HiRadixCache):
    """A wrong rule: any host hit is loaded, however short."""

    def load_path(self, last, best, host):
        import prefillbench.engine.hicache as hicache

        saved, hicache.LOAD_BACK_THRESHOLD = hicache.LOAD_BACK_THRESHOLD, 1
        try:
            return super().load_path(last, best, host)
        finally:
            hicache.LOAD_BACK_THRESHOLD = saved


class NoWriteThroughLock(HiRadixCache):
    """A wrong rule: a written-through node is evictable before its write's ack."""

    def _write_through(self, node):
        super()._write_through(node)
        writing, self.writing = self.writing, []
        for x in writing:
            self.dec_lock_ref(x)


@pytest.mark.parametrize("wrong", [MostRecentHostLeafFirst, LoadsBelowTheThreshold, NoWriteThroughLock])
def test_the_comparison_tells_a_wrong_rule(answered, wrong):
    runs, answers = answered
    _, first = compare(runs, answers, wrong)
    assert first is not None


# ---------------------------------------------------------------- the strategies against SGLang's scheduler with it

from benchmarks.engine.sglang_sessions import HICACHE_PRESETS, random_hicache_cases  # noqa: E402
from benchmarks.engine.sglang_steps import Comparison, references, strategy_iterations  # noqa: E402


@pytest.fixture(scope="module")
def scheduled():
    """SGLang's own scheduler with HiCache (sglang_reference.py, hicache_ratio set) on the HiCache presets and ten
    random session cases: its iterations, one run of the reference."""
    jobs = [(p.name, p.trace(), p.config) for p in HICACHE_PRESETS] + random_hicache_cases(1, 10)
    return jobs, references([(trace, config) for _, trace, config in jobs])


def comparisons(scheduled) -> list[Comparison]:
    jobs, theirs = scheduled
    return [Comparison(name, config, its, strategy_iterations(trace, config)) for (name, trace, config), its in
            zip(jobs, theirs, strict=True)]


def test_the_strategies_run_every_step_sglangs_scheduler_runs_with_hicache(scheduled):
    """Every iteration (batches, where each prompt starts, retractions, ratio, tokens evicted and tokens loaded back
    from the host so far) equal, each write policy, mixed or not."""
    results = comparisons(scheduled)
    for c in results:
        assert not c.mismatches, c.first_mismatch()
    presets = results[:len(HICACHE_PRESETS)]
    assert all(c.loaded(c.sglang) > 1000 for c in presets)
    assert {c.config.hicache_write_policy for c in presets} == set(WRITE_POLICIES)
    assert sum(c.retractions(c.sglang) for c in presets) > 0


def test_the_comparison_tells_loading_from_recomputing_and_lpm_by_the_gpu_prefix_alone(scheduled, monkeypatch):
    jobs, theirs = scheduled[0][:1], scheduled[1][:1]
    monkeypatch.setattr(HiRadixCache, "load_path", lambda self, last, best, host: 0)  # every host hit recomputed
    assert comparisons((jobs, theirs))[0].mismatches
    monkeypatch.undo()
    monkeypatch.setattr(HiRadixCache, "host_hit", lambda self, seq_id: 0)  # LPM and admission blind to the host
    assert comparisons((jobs, theirs))[0].mismatches

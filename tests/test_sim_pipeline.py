"""The pipeline, driven by the engine: micro-batches in flight, sequences never in two at once, bubbles and busy stages."""
from __future__ import annotations

import pytest

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench.workloads import TestSpec, make_requests
from strategies import STRATEGIES, make_strategy

# These take every visible sequence into one step, so their micro-batches cannot overlap.
TAKE_ALL = {"padded", "packed", "orca", "static"}


class Recording:
    """Wraps a strategy and remembers the sequences of every step it builds."""

    steady_decodes = False  # it must see every step

    def __init__(self, inner):
        self.inner, self.name, self.seq_ids = inner, inner.name, []

    def next_step(self, waiting, running):
        step = self.inner.next_step(waiting, running)
        if step:
            self.seq_ids.append({c.seq_id for c in step.prefills} | {d.seq_id for d in step.decodes})
        return step

    def max_step_tokens(self, prompt_len, concurrency):
        return self.inner.max_step_tokens(prompt_len, concurrency)

    def reset(self):
        self.inner.reset()

    def attach(self, memory, engine_max_num_seqs=None, prefix_cache=False):
        self.inner.attach(memory, engine_max_num_seqs, prefix_cache)

    def idle(self):
        self.inner.idle()

    def __getattr__(self, name):  # the rest of the strategy's contract (its memory policy, block size) is the inner's
        return getattr(self.inner, name)


@pytest.mark.parametrize("name", [n for n, c in STRATEGIES.items() if not c.needs_price])  # slo-budget: test_slo_budget.py
def test_a_sequence_is_never_in_two_micro_batches_at_once(name):
    backend = SimBackend.load("llama-13b", "a100", tp=2, pp=4)
    strategy = Recording(make_strategy(name, 128))
    requests = make_requests(TestSpec(300, 12), 24, backend.vocab_size, seed=0)
    record = engine.run(backend, strategy, requests, 12)
    stats = backend.pipeline_stats
    assert len(record.requests) == 24 and all(len(r.tokens) == 12 for r in record.requests)
    spans = [(s.start, s.end) for s in record.steps]
    assert len(spans) == len(strategy.seq_ids)
    in_flight_max = 0
    for i, (s_i, e_i) in enumerate(spans):
        overlapping = [j for j, (s_j, e_j) in enumerate(spans) if j != i and s_j < e_i and s_i < e_j]
        in_flight_max = max(in_flight_max, 1 + len([j for j in overlapping if spans[j][0] <= s_i]))
        for j in overlapping:
            assert not strategy.seq_ids[i] & strategy.seq_ids[j]
    assert in_flight_max <= 4  # never more than pp micro-batches in flight
    if name not in TAKE_ALL:
        assert in_flight_max > 1
    assert len(stats["stage_busy_fraction"]) == 4


def test_pipeline_emits_the_same_tokens_as_one_gpu():
    requests = make_requests(TestSpec(200, 6), 6, 32000, seed=0)
    one = engine.run(SimBackend.load("llama-13b", "a100"), make_strategy("chunked", 64), requests, 3)
    four = engine.run(SimBackend.load("llama-13b", "a100", pp=4), make_strategy("chunked", 64), requests, 3)
    assert [r.tokens for r in one.requests] == [r.tokens for r in four.requests]


def test_uniform_micro_batches_keep_every_stage_busy():
    # Decode-only micro-batches of equal size: after the fill, no stage waits.
    backend = SimBackend.load("llama-13b", "a100", pp=4)
    requests = make_requests(TestSpec(1, 64), 16, backend.vocab_size, seed=0)
    record = engine.run(backend, make_strategy("sequential"), requests, 16)
    stats = backend.pipeline_stats
    assert min(stats["stage_busy_fraction"]) > 0.8

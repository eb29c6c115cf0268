"""The sim's shortcuts give what the long way gives, to the float (issue 68's speed work): a windowed model's run
whose sequences stay within every window takes the dense path, and one past a window keeps the windowed path."""
from __future__ import annotations

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench.workloads import TestSpec, make_requests


def run(backend: SimBackend, test: TestSpec, strategy: str, keep_windows: bool):
    if keep_windows:  # the windowed path forced on, as it ran every run before
        prepare = backend.prepare

        def windowed(max_sequences, max_seq_len, max_step_tokens):
            prepare(max_sequences, max_seq_len, max_step_tokens)
            backend._windows = backend.model.windows
            backend._kv_capacity = backend.cost.kv_capacity_positions()

        backend.prepare = windowed
    reqs = make_requests(test, 40, backend.vocab_size, 3)
    return engine.run(backend, make_strategy(strategy, 256), reqs, 24)


def test_a_run_within_mistral_7b_window_prices_as_the_windowed_path_did():
    test = TestSpec(1730, 415, spread=0.9)  # tune's Mistral workload: its longest sequence is below 4096
    for strategy in ("chunked", "vllm-v1"):
        fast_backend, slow_backend = SimBackend.load("mistral-7b", "a100"), SimBackend.load("mistral-7b", "a100")
        fast = run(fast_backend, test, strategy, keep_windows=False)
        assert not fast_backend._windows  # the dense path ran
        slow = run(slow_backend, test, strategy, keep_windows=True)
        assert [r.token_times for r in fast.requests] == [r.token_times for r in slow.requests]
        assert [r.tokens for r in fast.requests] == [r.tokens for r in slow.requests]
        assert fast_backend.clock == slow_backend.clock and fast_backend.n_steps == slow_backend.n_steps


def test_a_run_past_the_window_keeps_the_windowed_path():
    backend = SimBackend.load("mistral-7b", "a100")
    run(backend, TestSpec(4000, 300), "chunked", keep_windows=False)
    assert backend._windows == backend.model.windows and backend._held == 0

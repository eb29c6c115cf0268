"""Multi-turn sessions: each turn's prompt the history plus a new message, the next turn arriving its think time
after the last token (a closed loop per session), and a prefix cache turning the resent history into hits."""
from __future__ import annotations

import pytest

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench.sessions import SessionSpec
from prefillbench.backends.prefix_cache import implied_hits


def test_a_turns_prompt_is_the_history_then_its_message():
    spec = SessionSpec(n=2, turns=3, system=64, message=16, answer=8)
    reqs = spec.requests(5000, seed=1, arrivals=[0.0, 1.0])
    s0 = [r for r in reqs if r.session == 0]
    assert [r.turn for r in s0] == [0, 1, 2] and all(r.n_gen == 8 for r in reqs)
    system = s0[0].prompt[:64]
    assert all(r.prompt[:64] == system for r in reqs)  # one system prompt for every session
    for before, after in zip(s0, s0[1:]):
        # the next prompt resends this one and an 8-token answer, then a message of 8 to 24 tokens
        assert after.prompt[:len(before.prompt)] == before.prompt
        assert 8 + 8 <= len(after.prompt) - len(before.prompt) <= 8 + 24
    calls = SessionSpec(n=1, turns=3, system=64, message=16, answer=8, history=False).requests(5000, 1, [0.0])
    assert all(len(c.prompt) <= 64 + 24 and c.prompt[:64] == calls[0].prompt[:64] for c in calls)
    assert spec.lengths(1) == [(len(r.prompt), r.n_gen) for r in reqs]


@pytest.mark.parametrize("text, message", [
    ("sessions:n=0", "n must be at least 1"), ("sessions:turns=2.5", "whole number"),
    ("sessions:speed=3", "is not one of"), ("sessions:think=-1", "think must be 0 or more"),
])
def test_bad_session_specs_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        SessionSpec.parse(text)


def test_the_next_turn_arrives_its_think_time_after_the_last_token():
    spec = SessionSpec(n=3, turns=4, system=128, message=32, answer=8, think=0.75)
    reqs = spec.requests(32000, seed=2, arrivals=[0.0, 0.2, 0.4])
    run = engine.run(SimBackend.load("llama-13b", "a100"), make_strategy("chunked", 64), reqs, 0)
    assert len(run.requests) == 12
    by_turn = {(r.session, r.turn): r for r in run.requests}
    for (s, t), r in by_turn.items():
        if t:
            before = by_turn[(s, t - 1)]
            assert r.arrival - before.token_times[-1] == pytest.approx(0.75, abs=1e-9)
            assert r.arrival >= before.token_times[-1]


def test_with_a_cache_later_turns_hit_their_history():
    spec = SessionSpec(n=4, turns=3, system=256, message=48, answer=16, think=0.5)
    reqs = spec.requests(32000, seed=3, arrivals=[0.0, 0.1, 0.2, 0.3])
    on = engine.run(SimBackend.load("llama-13b", "a100", prefix_cache="on"), make_strategy("sequential"), reqs, 0)
    by_turn = {(r.session, r.turn): r for r in on.requests}
    assert by_turn[(0, 0)].cached_tokens == 0
    assert all(by_turn[(s, 0)].cached_tokens == 256 for s in (1, 2, 3))  # the system prompt, 16 blocks
    later = [r for r in on.requests if r.turn > 0]
    for r in later:  # a later turn finds at least every full block of the turn before it
        assert r.cached_tokens >= by_turn[(r.session, r.turn - 1)].prompt_len // 16 * 16
    cached = sum(r.cached_tokens for r in on.requests)
    assert cached / sum(r.prompt_len for r in on.requests) == pytest.approx(
        implied_hits([r.prompt for r in reqs], 16)[0] / sum(len(r.prompt) for r in reqs), abs=0.02)
    off = engine.run(SimBackend.load("llama-13b", "a100"), make_strategy("sequential"), reqs, 0)
    ttft = lambda run: sorted(r.token_times[0] - r.arrival for r in run.requests if r.turn > 0)[len(later) // 2]
    assert ttft(on) < ttft(off)


@pytest.mark.parametrize("args, message", [
    ([], "arrive in an open loop"),
    (["--arrival", "poisson", "--rate", "1", "--token-scale", "0.5"], "the trace-reading flags do not apply"),
])
def test_session_runs_are_checked_in_one_line(args, message, run_cli):
    result = run_cli("run", "--backend", "sim", "--workload", "sessions:n=2,turns=2", "-s", "sequential",
                     "--no-results-file", *args)
    assert result.code == 2 and message in result.err.strip().splitlines()[-1]


def test_tune_refuses_sessions_in_one_line_and_names_capacity(run_cli):
    """capacity searches sessions (the rate they start at: tests/test_capacity_sessions.py); tune does not."""
    result = run_cli("tune", "--backend", "sim", "--workload", "sessions:n=2", "--slo", "tbt=100")
    assert result.code == 2 and "multi-turn sessions run with `prefillbench capacity`" in result.err

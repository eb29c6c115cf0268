"""The engine's admission on its own: the bisection that fits sequences to a bounded KV cache, and which requests
enter when (closed and open loop)."""
from __future__ import annotations

import math

import pytest

from prefillbench.backends.base import BackendError
from prefillbench.engine.admission import Admission, fit
from prefillbench.sequence import Request


class Cache:
    """A backend whose cache holds `room` tokens, steps included: n sequences of `seq_len` fit beside a step of
    `step_tokens` when n * seq_len + step_tokens <= room."""

    kv_cache_tokens = None  # no --kv-cache-tokens
    engine_max_num_seqs = None

    def __init__(self, room: int, max_num_seqs: int | None = None, kv_cache_tokens: int | None = None) -> None:
        self.cache_room = room
        self.engine_max_num_seqs = max_num_seqs
        self.kv_cache_tokens = kv_cache_tokens
        self.asked: list[int] = []
        self.clamps: list[tuple[int, int]] = []
        self.limits: list[str] = []

    def own_kv_capacity_tokens(self, max_step_tokens: int) -> int:
        return max(0, self.cache_room - max_step_tokens)

    def kv_capacity_tokens(self, max_step_tokens: int) -> int:
        own = self.own_kv_capacity_tokens(max_step_tokens)
        return own if self.kv_cache_tokens is None else min(own, self.kv_cache_tokens)

    def max_concurrency(self, max_seq_len: int, max_step_tokens: int) -> int | None:
        fits = self.own_kv_capacity_tokens(max_step_tokens) // max_seq_len
        return fits if self.engine_max_num_seqs is None else min(fits, self.engine_max_num_seqs)

    def note_clamp(self, asked: int, allowed: int, limit: str = "") -> None:
        self.clamps.append((asked, allowed))
        self.limits.append(limit)

    def room(self) -> str:
        return f"{self.cache_room} tokens"


class PerSequence:
    """A strategy whose largest step is one token per sequence in flight (a decode of each)."""

    spec = "per-sequence"

    def max_step_tokens(self, longest_prompt: int, n: int) -> int:
        return n


def test_fit_keeps_what_fits_and_says_nothing():
    backend = Cache(room=1000)
    assert fit(backend, PerSequence(), 9, 50, 100) == 9  # 9 * 100 + 9 <= 1000
    assert backend.clamps == []


def test_fit_bisects_to_the_most_that_fit_with_their_steps():
    backend = Cache(room=1000)
    # n * 100 + n <= 1000: 9 fit, 10 do not (10 * 100 + 10 > 1000) though the cache alone holds 10
    assert fit(backend, PerSequence(), 64, 50, 100) == 9
    assert backend.clamps == [(64, 9)]


class WholePrompts(PerSequence):
    """A strategy whose largest step is every admitted prompt at once (padded, orca)."""

    spec = "whole-prompts"

    def max_step_tokens(self, longest_prompt: int, n: int) -> int:
        return longest_prompt * n


def test_the_clamp_names_the_kv_tokens_where_a_step_changes_nothing():
    backend = Cache(room=1000)
    assert fit(backend, PerSequence(), 64, 50, 100) == 9
    # without a step 10 would fit (1000 // 100), with one of 10 tokens only 9: the step binds, by the room of one
    assert backend.limits == ["per-sequence's step activations: its largest step, 10 tokens for 10 sequences, takes "
                              "the room of 1; the KV alone holds 10 at their whole length"]
    backend = Cache(room=1050)  # 10 * 100 + 10 <= 1050: the 11th is kept out by the KV alone
    assert fit(backend, PerSequence(), 64, 50, 100) == 10
    assert backend.limits == ["KV tokens: 1,050 hold 10 sequences of 100 tokens at their whole length"]


def test_the_clamp_names_the_step_activations_of_whole_prompts():
    backend = Cache(room=1000)
    # n * 100 + 50 * n <= 1000: 6; the KV alone holds 10
    assert fit(backend, WholePrompts(), 64, 50, 100) == 6
    assert backend.limits[0].startswith("whole-prompts's step activations: its largest step, 350 tokens for 7 "
                                        "sequences, takes the room of 4; the KV alone holds 10")


def test_the_clamp_names_max_num_seqs_and_kv_cache_tokens():
    backend = Cache(room=100_000, max_num_seqs=8)
    assert fit(backend, PerSequence(), 64, 50, 100) == 8
    assert backend.limits == ["max_num_seqs 8"]
    backend = Cache(room=100_000, kv_cache_tokens=450)
    assert fit(backend, PerSequence(), 64, 50, 100) == 4
    assert backend.limits == ["--kv-cache-tokens 450 holds 4 sequences of 100 tokens at their whole length"]


def test_fit_fails_when_not_one_sequence_fits():
    with pytest.raises(BackendError, match="not one sequence of 100 tokens fits in 50 tokens"):
        fit(Cache(room=50), PerSequence(), 4, 50, 100)


def test_fit_takes_no_bound_as_room_for_all():
    class Unbounded(Cache):
        def max_concurrency(self, max_seq_len, max_step_tokens):
            return None

    assert fit(Unbounded(0), PerSequence(), 1000, 50, 100) == 1000


def requests(arrivals):
    return [Request((1, 2, 3), 4, a) for a in arrivals]


def test_a_closed_loop_fills_to_the_cap_at_once():
    admission = Admission(requests([None] * 5), False, 3, start=10.0)
    admission.admit(10.5)
    assert list(admission.live) == [0, 1, 2] and len(admission.pending) == 2
    assert [s.arrival for s in admission.waiting] == [10.5] * 3 and admission.running == []
    assert admission.next_arrival() is None  # full: the next enters when one finishes
    del admission.live[1]
    admission.admit(11.0)
    assert list(admission.live) == [0, 2, 3] and admission.live[3].arrival == 11.0


def test_an_open_loop_admits_what_has_arrived():
    admission = Admission(requests([0.0, 1.0, 1.0, 5.0]), True, 4, start=100.0)
    assert admission.next_at == 100.0
    admission.admit(100.5)
    assert list(admission.live) == [0] and admission.next_arrival() == 101.0
    admission.admit(101.0)  # arrivals at the same time enter together, in order
    assert list(admission.live) == [0, 1, 2] and [s.arrival for s in admission.waiting] == [100.0, 101.0, 101.0]
    admission.admit(104.999)
    assert list(admission.live) == [0, 1, 2] and admission.next_arrival() == 105.0
    admission.admit(200.0)
    assert list(admission.live) == [0, 1, 2, 3] and admission.live[3].arrival == 105.0
    assert admission.next_arrival() is None and admission.next_at == math.inf


def test_an_open_loop_at_its_cap_waits_for_a_finish_not_an_arrival():
    admission = Admission(requests([0.0, 0.0, 2.0]), True, 1, start=0.0)
    admission.admit(3.0)
    assert list(admission.live) == [0] and admission.next_arrival() is None
    del admission.live[0]
    assert admission.next_arrival() == 0.0  # arrived already: admitted on the next pass
    admission.admit(3.0)
    assert list(admission.live) == [1] and admission.live[1].arrival == 0.0  # its arrival, not when it entered


def test_an_empty_prompt_goes_straight_to_running():
    admission = Admission([Request((), 2)], False, 1, start=0.0)
    admission.admit(0.0)
    assert admission.waiting == [] and [s.seq_id for s in admission.running] == [0]

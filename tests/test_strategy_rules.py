"""Each strategy's scheduling rule on hand-built requests: which request is in which step, step by step."""
from __future__ import annotations

import pytest

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.sequence import Sequence
from prefillbench.step import Step
from prefillbench.bench.workloads import TestSpec, make_requests
from prefillbench.sequence import Request
from strategies import STRATEGIES, make_strategy
from prefillbench.backends.fake import FakeBackend

# Request 0: a 6-token prompt and 3 tokens; 1: 3 tokens and 1; 2: 4 tokens and 2 (admitted when one finishes).
REQUESTS = [Request(tuple(range(10, 16)), 3), Request(tuple(range(20, 23)), 1), Request(tuple(range(30, 34)), 2)]


def layout(step: Step) -> tuple[list[tuple[int, int, int, int]], list[int]]:
    """(sequence, start, length, pad) of each prompt chunk, and the decoding sequences."""
    return [(c.seq_id, c.start, len(c.tokens), c.pad) for c in step.prefills], [d.seq_id for d in step.decodes]


def schedule(name: str, size: int = 256, requests=REQUESTS, concurrency: int = 2) -> list:
    backend = FakeBackend()
    record = engine.run(backend, make_strategy(name, size), requests, concurrency)
    assert [len(r.tokens) for r in record.requests] == [r.n_gen for r in requests]
    return [layout(s) for s in backend.steps]


def seq(i: int, prompt_len: int, prefilled: int = 0, generated=()) -> Sequence:
    s = Sequence(i, tuple(range(prompt_len)), 4, 0.0, n_prefilled=prefilled)
    s.generated = list(generated)
    return s


def test_static_admits_a_batch_and_no_one_else_until_all_of_it_finishes():
    assert schedule("static") == [
        ([(0, 0, 6, 0), (1, 0, 3, 3)], []),  # the batch's prompts, padded to the longest
        ([], [0]),  # request 1 is done and request 2 has arrived, but waits: the batch is not done
        ([], [0]),
        ([(2, 0, 4, 0)], []),  # the batch is done: the next one starts
        ([], [2]),
    ]


def test_static_schedules_nothing_while_its_batch_is_out_of_sight():
    # In the sim's pipeline, sequences in flight are not shown to the strategy.
    static = make_strategy("static")
    a, b = seq(0, 4), seq(1, 4)
    static.next_step([a, b], [])
    a.n_prefilled = b.n_prefilled = 4
    a.generated, b.generated = [5], [6]
    assert not static.next_step([seq(2, 4)], [])  # members in flight, a newcomer waiting: nothing starts
    assert layout(static.next_step([seq(2, 4)], [a])) == ([], [0])
    a.generated = b.generated = [5, 6, 7, 8]  # both finished
    assert layout(static.next_step([seq(2, 4)], [])) == ([(2, 0, 4, 0)], [])


def test_orca_joins_new_prompts_whole_to_the_running_decodes():
    assert schedule("orca") == [
        ([(0, 0, 6, 0), (1, 0, 3, 0)], []),  # both prompts whole, packed without pads
        ([(2, 0, 4, 0)], [0]),  # request 2 joins at the next iteration, beside request 0's decode
        ([], [0, 2]),
    ]


def test_orca_never_exceeds_the_requests_in_flight():
    requests = [Request(tuple(range(5 + i)), 3) for i in range(7)]
    steps = schedule("orca", requests=requests, concurrency=3)
    assert max(len({c[0] for c in p} | set(d)) for p, d in steps) == 3
    assert all(length == 5 + s for p, _ in steps for s, start, length, _ in p)  # prompts are never split


def test_packed_runs_all_waiting_prompts_back_to_back_and_pauses_decodes():
    assert schedule("packed") == [
        ([(0, 0, 6, 0), (1, 0, 3, 0)], []),  # no pads, unlike padded
        ([(2, 0, 4, 0)], []),  # request 0's decode waits while a prompt waits
        ([], [0, 2]),
        ([], [0]),
    ]


def test_padded_is_packed_plus_pads():
    padded, packed = schedule("padded"), schedule("packed")
    assert [[(s, a, n) for s, a, n, _ in p] for p, _ in padded] == [[(s, a, n) for s, a, n, _ in p] for p, _ in packed]
    assert padded[0][0][1][3] == 3 and all(pad == 0 for p, _ in packed for *_, pad in p)


def test_sarathi_serve_fills_a_token_budget_decodes_first_then_prompts_in_progress_then_new():
    assert schedule("sarathi-serve", 4) == [
        ([(0, 0, 4, 0)], []),  # a new prompt takes the whole budget
        ([(0, 4, 2, 0), (1, 0, 2, 0)], []),  # request 0's last 2 tokens, then 2 of the new request 1: two prompts chunked
        ([(1, 2, 1, 0)], [0]),  # 1 decode, then request 1's rest (1 token); the budget is not filled: no one else waits
        ([(2, 0, 3, 0)], [0]),  # request 2 arrived: 1 decode + 3 of its tokens
        ([(2, 3, 1, 0)], []),
        ([], [2]),
    ]


def test_sarathi_serve_takes_prompts_in_progress_before_new_ones():
    step = make_strategy("sarathi-serve", 6).next_step([seq(0, 9), seq(1, 9, prefilled=5)], [seq(2, 3, 3, [7])])
    assert layout(step) == ([(1, 5, 4, 0), (0, 0, 1, 0)], [2])


def test_sarathi_serve_never_drops_a_decode_for_the_budget():
    running = [seq(i, 3, 3, [7]) for i in range(3)]
    assert layout(make_strategy("sarathi-serve", 2).next_step([seq(9, 5)], running)) == ([], [0, 1, 2])


def test_every_strategy_bounds_its_steps_by_max_step_tokens():
    requests = [Request(tuple(range(3 + 4 * i)), 4) for i in range(9)]
    for name in [n for n, c in STRATEGIES.items() if not c.needs_price]:  # slo-budget's bound: test_slo_budget.py
        for size in (3, 5, 64):
            strategy = make_strategy(name, size)
            backend = FakeBackend()
            engine.run(backend, strategy, requests, 4)
            bound = strategy.max_step_tokens(max(len(r.prompt) for r in requests), 4)
            assert max(s.n_tokens for s in backend.steps) <= bound, (name, size)


@pytest.mark.parametrize("pp", [1, 4])
@pytest.mark.parametrize("name", [n for n, c in STRATEGIES.items() if not c.needs_price])  # slo-budget: test_slo_budget.py
def test_every_strategy_runs_on_the_sim(name, pp):
    requests = make_requests(TestSpec(300, 8), 10, 32000, seed=0)
    ref = engine.run(SimBackend.load("llama-13b", "a100"), make_strategy("sequential"), requests, 4)
    record = engine.run(SimBackend.load("llama-13b", "a100", pp=pp), make_strategy(name, 128), requests, 4)
    # The sim's tokens depend only on (sequence, position): every strategy must feed every position once.
    assert [r.tokens for r in record.requests] == [r.tokens for r in ref.requests]
    assert record.wall > 0

"""The SGLang strategies (strategies/sglang.py, sglang_budget.py) against the rules of SGLang 0.5.23's scheduler as
read (../shared/notes/sglang-and-kv-memory.md; each test names the function): prefill first, one prompt in
progress, the budget shared by the prompts of a batch, admission by expected future tokens at new_token_ratio, the
full batch after NO_TOKEN, retraction of the fewest outputs to the tail, the ratio's decay, reset and re-estimate.
tests/test_sglang_schedules.py compares every step with SGLang's own code where its environment is installed."""
from __future__ import annotations

import math

import pytest

from prefillbench import engine
from prefillbench.backends.fake import FakeBackend
from prefillbench.engine.memory import KVMemory
from prefillbench.sequence import Request, Sequence
from prefillbench.step import Preemption
from strategies import make_strategy
from strategies.sglang import INIT_RATIO, MIN_RATIO, RATIO_DECAY, RETRACT_DECODE_STEPS
from strategies.sglang_budget import CLIP


def attached(name: str, budget: int, memory: KVMemory | None = None, cap: int | None = None):
    strategy = make_strategy(name, budget)
    strategy.reset()
    strategy.attach(memory if memory is not None else KVMemory(None, 1), cap)
    return strategy


def decoding(i: int, prompt: int, generated: int, n_gen: int = 100) -> Sequence:
    s = Sequence(i, tuple(range(prompt)), n_gen, 0.0, n_prefilled=prompt)
    s.generated = list(range(generated))
    return s


def run(reqs, name="sglang", budget=64, kv_tokens=None, concurrency=0):
    backend = FakeBackend(seconds_per_token=0.0, seconds_per_step=1.0)
    backend.kv_cache_tokens = kv_tokens
    return engine.run(backend, make_strategy(name, budget), reqs, concurrency)


def kinds(record) -> list[str]:
    return ["mixed" if s.prefill_chunks and s.decode_contexts else "prefill" if s.prefill_chunks else "decode"
            for s in record.steps]


# ---------------------------------------------------------------- the batch (get_next_batch_to_run)


def test_a_long_prompt_stalls_every_running_decode_for_each_of_its_chunks_by_default():
    # golden behaviour 1: a prompt of N tokens at chunked_prefill_size C is ceil(N/C) prefill batches in a row
    reqs = [Request(tuple(range(16)), 40, arrival_s=0.0), Request(tuple(range(1000, 1000 + 300)), 4, arrival_s=5.5)]
    record = run(reqs, budget=64)
    k = kinds(record)
    at = next(i for i, s in enumerate(record.steps) if s.prefill_chunks and s.prefill_chunks[0][1] == 64)
    assert k[at:at + math.ceil(300 / 64)] == ["prefill"] * 5 and k[at + 5] == "decode"
    # the first request made no token while the long prompt's chunks ran
    first = record.requests[0].token_times
    assert not any(record.steps[at].start < t <= record.steps[at + 4].end for t in first)


def test_mixed_chunk_carries_the_decodes_in_every_chunk_the_budget_less_their_number():
    reqs = [Request(tuple(range(16)), 40, arrival_s=0.0), Request(tuple(range(1000, 1000 + 300)), 4, arrival_s=5.5)]
    record = run(reqs, name="sglang-mixed", budget=64)
    long = [s for s in record.steps if s.prefill_chunks and s.prefill_chunks[0][0] + s.prefill_chunks[0][1] > 16]
    assert len(long) == math.ceil(300 / 63) and all(len(s.decode_contexts) == 1 for s in long)
    assert [s.prefill_chunks[0][1] for s in long[:-1]] == [63] * (len(long) - 1)


def test_only_one_prompt_is_in_progress_and_it_goes_first_with_the_budget_shared_by_the_batch():
    waiting = [Sequence(i, tuple(range(100 * i, 100 * i + n)), 8, 0.0) for i, n in enumerate((40, 50, 30))]
    strategy = attached("sglang", 64)
    step = strategy.next_step(waiting, [])
    # the first whole (40), the second chunked to what the batch has left (24), the third not tried
    assert [(c.seq_id, len(c.tokens)) for c in step.prefills] == [(0, 40), (1, 24)] and strategy.chunked == 1
    waiting[0].n_prefilled, waiting[1].n_prefilled = 40, 24
    step = strategy.next_step(waiting[1:], [])
    assert [(c.seq_id, c.start, len(c.tokens)) for c in step.prefills] == [(1, 24, 26), (2, 0, 30)]


def test_admission_charges_running_requests_their_expected_output_at_the_ratio():
    # PrefillAdder: rem_total = free - sum(min(max_new - out, CLIP) * ratio); admitted iff ext + max_new + 1 < it
    memory = KVMemory(1000, 1)
    running = [decoding(0, 100, 1, n_gen=501)]
    memory.grow(0, 101)
    free, expected = 899, 500 * INIT_RATIO  # 549 left for the new request's prompt, output and page
    fits = Sequence(1, tuple(range(48)), 500, 0.0)  # 48 + 500 + 1 = 549: not below 549
    assert not attached("sglang", 256, memory).next_step([fits], running).prefills
    fits = Sequence(1, tuple(range(47)), 500, 0.0)
    assert attached("sglang", 256, memory).next_step([fits], running).prefills[0].seq_id == 1
    assert free - expected == 549
    # ignore_eos: the running request is charged its whole output, and its future is simulated
    assert not attached("sglang:ignore-eos=1", 256, memory).next_step([fits], running).prefills


def test_the_estimate_is_clipped_at_4096_tokens_a_request():
    memory = KVMemory(20000, 1)
    running = [decoding(0, 10, 1, n_gen=100001)]
    memory.grow(0, 11)
    # charged min(100000, 4096) * 0.7 = 2867.2: a request of 10000 + 4096 + 1 fits in 19989 - 2867.2
    big = Sequence(1, tuple(range(10000)), 100000, 0.0)
    strategy = attached("sglang", 20000, memory)
    assert strategy.next_step([big], running).prefills[0].seq_id == 1
    assert CLIP == 4096


def test_no_token_marks_the_batch_full_until_a_request_leaves():
    # golden behaviour 2: after NO_TOKEN with others running, no prefill is tried until one leaves
    memory = KVMemory(400, 1)
    running = [decoding(0, 100, 1, n_gen=200)]
    memory.grow(0, 102)
    strategy = attached("sglang", 256, memory)
    big = Sequence(1, tuple(range(200)), 50, 0.0)  # 200 + 50 + 1 > 298 - 199 * 0.7
    step = strategy.next_step([big], running)
    assert not step.prefills and [d.seq_id for d in step.decodes] == [0] and strategy.batch_is_full
    small = Sequence(2, tuple(range(4)), 2, 0.0)  # 4 + 2 + 1 would fit
    step = strategy.next_step([small, big], running)  # full: not even the small one is tried
    assert not step.prefills
    other = decoding(3, 10, 1)
    memory.grow(3, 12)
    step = strategy.next_step([small, big], [running[0], other])  # a request joined, none left: still full
    assert not step.prefills
    memory.free(3)
    step = strategy.next_step([small, big], running)  # request 3 left: the flag falls, the queue is tried again
    assert [c.seq_id for c in step.prefills] == [2] and strategy.batch_is_full  # and big stops it once more


# ---------------------------------------------------------------- the ratio (NewTokenRatioTracker)


def test_the_ratio_falls_each_pure_decode_step_to_its_floor_and_only_then():
    strategy = attached("sglang", 64)
    running = [decoding(0, 10, 1)]
    values = []
    for _ in range(700):
        values.append(dict(strategy.next_step([], running).policy_values)["new_token_ratio"])
    assert values[0] == pytest.approx(INIT_RATIO - RATIO_DECAY, abs=1e-12)
    assert RATIO_DECAY == pytest.approx((0.7 - 0.098) / 600, abs=1e-15) and MIN_RATIO == pytest.approx(0.098)
    assert values[598] > MIN_RATIO and values[599:] == [pytest.approx(MIN_RATIO, abs=1e-12)] * 101
    # a prefill batch does not decay it
    before = strategy.ratio
    strategy.next_step([Sequence(1, (1, 2), 2, 0.0)], running)
    assert strategy.ratio == before
    strategy.idle()  # Scheduler.on_idle, fully idle: back to its start
    assert strategy.ratio == INIT_RATIO


# ---------------------------------------------------------------- retraction (retract_decode)


def test_a_decode_that_does_not_fit_retracts_the_fewest_outputs_first_ties_the_longest_prompt_to_the_tail():
    memory = KVMemory(100, 1)
    running = [decoding(0, 20, 5), decoding(1, 20, 2), decoding(2, 30, 2), decoding(3, 10, 9)]
    for s in running:
        memory.grow(s.seq_id, s.n_tokens - 1)
    memory.grow(99, 100 - memory.used - 2)  # two tokens free for four decodes
    strategy = attached("sglang", 64, memory)
    step = strategy.next_step([], running)
    # fewest outputs first (1 and 2 made 2 each; 2 has the longer prompt), until the rest fit: its 31 tokens do
    assert step.preempted == (Preemption(2, False),)
    assert sorted(d.seq_id for d in step.decodes) == [0, 1, 3]
    kept = (5 + 2 + 9 + RETRACT_DECODE_STEPS * 3) / (3 * 100 + 1)
    assert strategy.ratio == pytest.approx(kept, abs=1e-12)


def test_under_pressure_every_request_ends_with_exactly_its_tokens_and_retractions_are_counted():
    # staggered arrivals: each request admitted beside running ones charged 0.7 of their outputs left, which
    # they then make in full
    reqs = [Request(tuple(range(100 + i, 140 + i)), 100, arrival_s=5.0 * i) for i in range(16)]
    free = run(reqs, budget=64)
    tight = run(reqs, budget=64, kv_tokens=600)
    retracted = sum(r.retractions for r in tight.requests)
    assert retracted >= 1 and retracted == sum(r.preemptions for r in tight.requests)
    assert [r.tokens for r in tight.requests] == [r.tokens for r in free.requests]
    assert all(len(r.token_times) == 100 for r in tight.requests) and tight.kv_peak_fraction == 1.0
    # the ratio rode with the steps
    assert all(dict(s.policy_values).keys() == {"new_token_ratio"} for s in tight.steps)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="ignore-eos"):
        make_strategy("sglang:ignore-eos=2")
    with pytest.raises(ValueError, match="has no setting 'threshold'"):
        make_strategy("sglang-mixed:threshold=4")


def test_a_prefill_batch_that_empties_the_running_batch_takes_the_full_flag_with_it():
    # get_next_batch_to_run: the running batch left empty by a prefill batch (mixed chunk took its decodes) is
    # replaced at the next merge by that batch, whose batch_is_full is ScheduleBatch's default: False. Request 2
    # meets NO_TOKEN in the mixed batch of request 1 (300 + 400 + 1 > 899 - 1 - 199 x 0.7 - 61) and is tried, and
    # fits, in the very next one (checked against SGLang's own code: benchmarks/engine/sglang_steps.py)
    memory = KVMemory(1000, 1)
    r0 = decoding(0, 100, 1, n_gen=200)
    memory.grow(0, 101)
    a, b = Sequence(1, tuple(range(50)), 10, 0.0), Sequence(2, tuple(range(300)), 400, 0.0)
    strategy = attached("sglang-mixed", 256, memory)
    step = strategy.next_step([a, b], [r0])
    assert [(c.seq_id, len(c.tokens)) for c in step.prefills] == [(1, 50)] and strategy.batch_is_full
    memory.grow(0, 102)
    memory.grow(1, 50)
    a.n_prefilled, a.generated = 50, [5]
    r0.generated.append(5)
    step = strategy.next_step([b], [r0, a])
    assert [(c.seq_id, len(c.tokens)) for c in step.prefills] == [(2, 254)]
    assert [d.seq_id for d in step.decodes] == [0, 1] and not strategy.batch_is_full


def test_ignore_eos_admission_inserts_a_later_candidate_as_sglang_does():
    # add_one_req_ignore_eos keeps its request states for the batch: a later candidate is inserted before the first
    # state with as many tokens left or more, and one with more than all of them before the last (the scan leaves
    # its index there). Request 1 (256 left) goes before request 0 (198 left): 546 - 46 - 2 x 256 <= 2, NO_TOKEN;
    # sorted, it would fit (546 - 46 - 2 x 198 > 2, then 500 + 253 - 256 > 1)
    strategy = attached("sglang:ignore-eos=1", 256, KVMemory(800, 1))
    first, second = Sequence(0, tuple(range(253)), 198, 0.0), Sequence(1, tuple(range(45)), 256, 0.0)
    step = strategy.next_step([first, second], [])
    assert [(c.seq_id, len(c.tokens)) for c in step.prefills] == [(0, 253)] and strategy.batch_is_full


# ---------------------------------------------------------------- speculative decoding (arg_groups/speculative_hook.py)


def test_spec_turns_mixing_off_for_ngram_and_a_draft_model_not_for_eagle_and_sets_48_running():
    from prefillbench.speculation import parse_spec

    reqs = [Request(tuple(range(16)), 40, arrival_s=0.0), Request(tuple(range(1000, 1000 + 300)), 4, arrival_s=5.5)]
    for spec, mixes in (("ngram:3", False), ("draft:3:accept=0.6", False), ("eagle:3:accept=0.6", True),
                        ("mtp:2:accept=0.8", True)):
        strategy = make_strategy("sglang-mixed", 64, parse_spec(spec))
        assert strategy.mixes is mixes
        assert any("48" in line for line in strategy.speculation_warnings())
        assert any("disabled" in line for line in strategy.speculation_warnings()) is not mixes
    # ngram with --enable-mixed-chunk asked: every chunk of the long prompt stalls the running decode
    backend = FakeBackend(seconds_per_token=0.0, seconds_per_step=1.0)
    record = engine.run(backend, make_strategy("sglang-mixed", 64, parse_spec("ngram:3")), reqs, 0)
    assert "mixed" not in kinds(record) and kinds(record).count("prefill") >= math.ceil(300 / 64)


def test_spec_caps_running_requests_at_48_where_none_is_given():
    from prefillbench.speculation import parse_spec

    waiting = [Sequence(i, (1, 2, 3), 8, 0.0) for i in range(60)]
    strategy = make_strategy("sglang", 4096, parse_spec("ngram:3"))
    strategy.reset()
    strategy.attach(KVMemory(None, 1), None)
    assert len(strategy.next_step(waiting, []).prefills) == 48
    given = make_strategy("sglang:max-running=50", 4096, parse_spec("ngram:3"))
    given.reset()
    given.attach(KVMemory(None, 1), None)
    assert len(given.next_step(waiting, []).prefills) == 50 and not given.speculation_warnings()


def test_spec_decode_memory_check_keeps_two_k_plus_one_tokens_a_request_and_retracts_sooner():
    from prefillbench.speculation import parse_spec

    def step(spec):
        memory = KVMemory(100, 1)
        running = [decoding(0, 20, 5), decoding(1, 20, 2)]
        for s in running:
            memory.grow(s.seq_id, s.n_tokens - 1)
        memory.grow(99, 100 - memory.used - 10)  # ten tokens free
        strategy = make_strategy("sglang", 64, parse_spec(spec) if spec else None)
        strategy.reset()
        strategy.attach(memory, None)
        return strategy.next_step([], running)

    assert not step(None).preempted  # two tokens: they fit
    # K=1: 2 x 2 = 4 tokens a request, 8 in all: they fit; K=2: 6 a request, 12 > 10: request 1 (fewer outputs) goes
    assert not step("ngram:1").preempted
    assert step("ngram:2").preempted == (Preemption(1, False),)

"""Scheduling logic and timing, on a fake backend with a virtual clock."""
from __future__ import annotations

import math

import pytest

from prefillbench import engine
from prefillbench.bench.metrics import mean_std, request_rate, summarize
from prefillbench.sequence import Sequence
from prefillbench.bench.workloads import TestSpec, make_requests, make_tests
from prefillbench.sequence import Request
from strategies import make_strategy
from prefillbench.backends.fake import FakeBackend


def seq(i, prompt_len, prefilled=0, generated=()):
    s = Sequence(i, tuple(range(prompt_len)), 4, 0.0, n_prefilled=prefilled)
    s.generated = list(generated)
    return s


def test_sequential_runs_one_whole_prompt_before_decodes():
    step = make_strategy("sequential").next_step([seq(0, 10), seq(1, 5)], [seq(2, 3, 3, [7])])
    assert [(c.seq_id, len(c.tokens), c.is_last) for c in step.prefills] == [(0, 10, True)]
    assert step.decodes == ()
    step = make_strategy("sequential").next_step([], [seq(2, 3, 3, [7]), seq(3, 4, 4, [8, 9])])
    assert [(d.seq_id, d.token, d.position) for d in step.decodes] == [(2, 7, 3), (3, 9, 5)]


def test_padded_batches_all_waiting_prompts_to_the_longest():
    step = make_strategy("padded").next_step([seq(0, 10), seq(1, 4)], [seq(2, 3, 3, [7])])
    assert [(len(c.tokens), c.pad) for c in step.prefills] == [(10, 0), (4, 6)]
    assert step.n_tokens == 20 and step.decodes == ()


def test_chunked_takes_one_chunk_of_the_oldest_prompt_plus_all_decodes():
    strategy = make_strategy("chunked", 4)
    step = strategy.next_step([seq(0, 10, prefilled=8), seq(1, 9)], [seq(2, 3, 3, [7])])
    (chunk,) = step.prefills
    assert (chunk.seq_id, chunk.start, len(chunk.tokens), chunk.is_last) == (0, 8, 2, True)
    assert [d.seq_id for d in step.decodes] == [2]
    step = strategy.next_step([seq(1, 9)], [])
    assert (step.prefills[0].start, len(step.prefills[0].tokens), step.prefills[0].is_last) == (0, 4, False)


@pytest.mark.parametrize("bad", [0, -3])
def test_chunk_size_below_one_is_refused(bad):
    with pytest.raises(ValueError, match="chunk size"):
        make_strategy("chunked", bad)


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="unknown strategy 'fifo'"):
        make_strategy("fifo")


def test_test_names_follow_llama_bench():
    tests = make_tests([512, 0], [128], [(512, 128)])
    assert [t.name for t in tests] == ["pp512", "tg128", "pp512+tg128"]
    assert make_tests([512], [0], []) == [TestSpec(512, 0)]


def test_closed_loop_keeps_concurrency_in_flight_and_generates_exactly_n():
    backend = FakeBackend()
    requests = make_requests(TestSpec(20, 6), 7, backend.vocab_size, seed=1)
    record = engine.run(backend, make_strategy("chunked", 8), requests, 3)
    assert len(record.requests) == 7
    assert all(len(r.tokens) == 6 and len(r.token_times) == 6 for r in record.requests)
    assert sorted(backend.released) == list(range(7))
    in_flight = [len({c.seq_id for c in s.prefills} | {d.seq_id for d in s.decodes}) for s in backend.steps]
    assert max(in_flight) == 3
    # Replacements arrive when a request finishes, not at the start.
    assert record.requests[0].arrival == record.start < record.requests[3].arrival


def test_timestamps_come_from_the_backend_clock_after_each_step():
    backend = FakeBackend(seconds_per_token=0.0, seconds_per_step=1.0)
    record = engine.run(backend, make_strategy("sequential"), [Request((1, 2, 3), 3)], 1)
    (req,) = record.requests
    assert req.token_times == [1.0, 2.0, 3.0]
    assert [s.seconds for s in record.steps] == [1.0, 1.0, 1.0]


def test_rates_per_kind_of_test():
    backend = FakeBackend(seconds_per_token=0.0, seconds_per_step=0.5)
    pp = TestSpec(8, 0)
    run = engine.run(backend, make_strategy("sequential"), make_requests(pp, 2, 1000, 0), 2)
    # Two prompts one after the other: first token at 0.5 s and 1.0 s.
    assert [request_rate(pp, r) for r in run.requests] == [16.0, 8.0]
    tg = TestSpec(0, 4)
    run = engine.run(backend, make_strategy("sequential"), make_requests(tg, 1, 1000, 0), 1)
    assert len(run.requests[0].tokens) == 5  # the prompt's token, then 4 timed decode steps
    assert request_rate(tg, run.requests[0]) == pytest.approx(4 / 2.0)
    row = summarize(tg, [run], model="m", backend="b", strategy="sequential", concurrency=1, chunk_size=None)
    assert row.tbt_p50_ms == pytest.approx(500.0) and row.ttft_p50_ms == pytest.approx(500.0)
    assert row.throughput == pytest.approx(4 / 2.5) and row.ms_per_token == pytest.approx(500.0)


def test_mean_std_is_two_pass_and_exact_for_large_offsets():
    values = [1e9 + 1, 1e9 + 2, 1e9 + 3]
    mean, std = mean_std(values)
    assert mean == 1e9 + 2 and std == pytest.approx(1.0)
    assert mean_std([5.0]) == (5.0, 0.0)
    assert all(math.isnan(v) for v in mean_std([]))


def test_pack_lays_out_chunks_pads_and_decodes_in_one_row():
    from prefillbench.step import DecodeToken, PrefillChunk, Step, pack

    step = Step(
        prefills=(PrefillChunk(4, (10, 11), 3, True, pad=2), PrefillChunk(5, (20, 21, 22), 0, False)),
        decodes=(DecodeToken(6, 30, 7), DecodeToken(7, 31, 2)),
    )
    p = pack(step)
    assert p.tokens.tolist() == [10, 11, 11, 11, 20, 21, 22, 30, 31]
    assert p.positions.tolist() == [3, 4, 5, 6, 0, 1, 2, 7, 2]
    assert p.seq_ids.tolist() == [4, 4, 4, 4, 5, 5, 5, 6, 7]
    assert p.chunk_offsets == (0, 4) and p.decode_from == 7
    # Logits only for the last real token of a finishing chunk and for decodes.
    assert p.logit_rows.tolist() == [1, 7, 8] and p.emitting == (4, 6, 7)
    assert step.n_tokens == 9

"""Requests that arrive over time: seeded arrival processes, admission only after arrival, waiting on every clock."""
from __future__ import annotations

import time

import numpy as np
import pytest

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench.cases import BenchConfig, Case
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, WorkloadError, load_workload, make_requests, make_tests, request_lengths, workload_test
from prefillbench.sequence import Request
from strategies import make_strategy
from prefillbench.backends.fake import FakeBackend


def gaps(spec: ArrivalSpec, n: int = 20000, seed: int = 3) -> np.ndarray:
    return np.diff(spec.times(n, seed))


@pytest.mark.parametrize("rate", [0.5, 4.0])
def test_poisson_intervals_are_exponential_at_the_rate(rate):
    g = gaps(ArrivalSpec("poisson", rate))
    assert g.mean() == pytest.approx(1 / rate, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(1.0, abs=0.04)  # exponential: CV 1
    assert (g > 0).all()


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness_sets_the_spread_not_the_rate(burstiness):
    g = gaps(ArrivalSpec("gamma", 2.0, burstiness))
    assert g.mean() == pytest.approx(0.5, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(burstiness ** -0.5, rel=0.06)  # gamma of shape B: CV 1/sqrt(B)


def test_arrivals_are_seeded_and_start_at_zero():
    spec = ArrivalSpec("poisson", 1.0)
    assert spec.times(50, 7) == spec.times(50, 7)
    assert spec.times(50, 7) != spec.times(50, 8)
    assert spec.times(50, 7)[0] == 0.0
    assert ArrivalSpec().times(5, 7) is None  # closed loop: no arrival times
    # The prompts do not depend on the arrivals: the same seed gives the same tokens whatever the rate.
    test = TestSpec(16, 4)
    slow = make_requests(test, 5, 1000, 7, ArrivalSpec("poisson", 0.1).times(5, 7))
    fast = make_requests(test, 5, 1000, 7, ArrivalSpec("poisson", 10).times(5, 7))
    assert [r.prompt for r in slow] == [r.prompt for r in fast]


@pytest.mark.parametrize("bad", [None, 0.0, -1.0])
def test_an_open_loop_needs_a_positive_rate(bad):
    with pytest.raises(ValueError, match="rate"):
        ArrivalSpec("poisson", bad)


def _started_before_arrival(backend: FakeBackend, record: engine.RunRecord) -> list[int]:
    """Sequence ids that appear in a step that started before they arrived."""
    arrival = {i: r.arrival for i, r in enumerate(record.requests)}
    bad = []
    for step, rec in zip(backend.steps, record.steps):
        for seq_id in {c.seq_id for c in step.prefills} | {d.seq_id for d in step.decodes}:
            if rec.start < arrival[seq_id] - 1e-12:
                bad.append(seq_id)
    return bad


@pytest.mark.parametrize("name", ["sequential", "padded", "chunked"])
def test_the_engine_never_starts_a_request_before_it_arrives(name):
    backend = FakeBackend(seconds_per_token=0.001, seconds_per_step=0.01)
    arrivals = ArrivalSpec("poisson", 8.0).times(30, 1)
    requests = make_requests(TestSpec(40, 6), 30, backend.vocab_size, 1, arrivals)
    record = engine.run(backend, make_strategy(name, 16), requests, 0)
    assert len(record.requests) == 30 and all(len(r.tokens) == 6 for r in record.requests)
    assert [r.arrival - record.start for r in record.requests] == pytest.approx(arrivals)
    assert not _started_before_arrival(backend, record)
    assert all(r.first_scheduled >= r.arrival for r in record.requests)
    # At 8 req/s and a few ms per step the system idles between bursts: the clock jumped over the gaps.
    assert record.wall >= arrivals[-1]


def test_a_request_is_scheduled_as_soon_as_it_arrives_on_an_idle_backend():
    backend = FakeBackend(seconds_per_token=0.0, seconds_per_step=0.1)
    requests = [Request((1, 2, 3), 2, 0.0), Request((4, 5), 2, 5.0)]
    record = engine.run(backend, make_strategy("sequential"), requests, 0)
    first, second = record.requests
    assert second.arrival == 5.0 and second.first_scheduled == 5.0  # the idle backend waited for it
    assert second.token_times == pytest.approx([5.1, 5.2])
    assert first.token_times == pytest.approx([0.1, 0.2])


def test_concurrency_caps_an_open_loop_and_the_rest_queue():
    backend = FakeBackend(seconds_per_token=0.0, seconds_per_step=1.0)
    requests = [Request((1, 2), 3, 0.0) for _ in range(5)]
    record = engine.run(backend, make_strategy("chunked", 8), requests, 2)
    in_flight = [len({c.seq_id for c in s.prefills} | {d.seq_id for d in s.decodes}) for s in backend.steps]
    assert max(in_flight) == 2
    # Queued requests keep their arrival at 0: the queueing is part of their TTFT and scheduling delay.
    assert all(r.arrival == 0.0 for r in record.requests)
    assert record.requests[4].first_scheduled == pytest.approx(6.0)


def test_mixed_arrival_times_are_refused():
    with pytest.raises(ValueError, match="every request"):
        engine.run(FakeBackend(), make_strategy("sequential"), [Request((1,), 1, 0.0), Request((1,), 1)], 1)


class WallClockFake(FakeBackend):
    """Real time: steps cost nothing, so any wall time is waiting for arrivals."""

    now = staticmethod(time.perf_counter)
    wait_until = engine.StepBackend.wait_until  # the real backends' wait: sleep


def test_a_real_backend_waits_for_arrivals_in_wall_time():
    backend = WallClockFake(seconds_per_token=0.0, seconds_per_step=0.0)
    requests = [Request((1, 2), 2, t) for t in (0.0, 0.15, 0.3)]
    record = engine.run(backend, make_strategy("chunked", 8), requests, 0)
    assert record.wall >= 0.3
    for r, t in zip(record.requests, (0.0, 0.15, 0.3)):
        assert r.arrival == pytest.approx(record.start + t)
        assert r.first_scheduled >= r.arrival


def test_the_sim_waits_in_virtual_time():
    backend = SimBackend.load("mistral-7b", "a100")
    arrivals = ArrivalSpec("poisson", 0.01).times(8, 0)  # one request every 100 s
    requests = make_requests(TestSpec(512, 16), 8, backend.vocab_size, 0, arrivals)
    began = time.perf_counter()
    record = engine.run(backend, make_strategy("chunked", 256), requests, 0)
    assert time.perf_counter() - began < 5  # nothing slept
    assert record.wall >= arrivals[-1] > 100
    assert all(r.first_scheduled == pytest.approx(r.arrival) for r in record.requests)  # an idle GPU starts at once


def test_arrivals_work_with_the_sims_pipeline():
    backend = SimBackend.load("llama-13b", "a100", tp=2, pp=4)
    arrivals = ArrivalSpec("gamma", 20.0, 0.5).times(24, 0)
    requests = make_requests(TestSpec(300, 8, spread=0.5), 24, backend.vocab_size, 0, arrivals)
    record = engine.run(backend, make_strategy("chunked", 128), requests, 0)
    assert len(record.requests) == 24 and all(r.first_scheduled >= r.arrival for r in record.requests)
    spans = sorted((s.start, s.end) for s in record.steps)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # micro-batches overlap in the stages
    assert backend.pipeline_stats["micro_batches"] == len(record.steps)


# ---- lengths -------------------------------------------------------------------------------------------
def test_len_spread_draws_lengths_uniformly_within_the_range():
    (test,) = make_tests([], [], [(200, 40)], spread=0.5)
    assert test.name == "pp200+tg40±50%"
    lengths = request_lengths(test, 4000, 1)
    prompts = np.array([p for p, _ in lengths])
    gens = np.array([g for _, g in lengths])
    assert prompts.min() == 100 and prompts.max() == 300 and prompts.mean() == pytest.approx(200, rel=0.02)
    assert gens.min() == 20 and gens.max() == 60 and gens.mean() == pytest.approx(40, rel=0.02)
    assert test.max_seq_len == 360
    requests = make_requests(test, 50, 1000, 1)
    assert [(len(r.prompt), r.n_gen) for r in requests] == request_lengths(test, 50, 1)
    assert request_lengths(TestSpec(200, 40), 3, 1) == [(200, 40)] * 3  # no spread: fixed


def test_len_spread_out_of_range_is_refused():
    with pytest.raises(ValueError, match="spread"):
        make_tests([128], [], [], spread=1.0)


def test_workload_files_csv_and_jsonl(tmp_path):
    csv = tmp_path / "trace.csv"
    csv.write_text("prompt_len,gen_len,arrival_s\n100,10,5.0\n300,20,5.5\n50,5,7\n")
    w = load_workload(csv)
    assert w.name == "trace" and w.prompt_lens == (100, 300, 50) and w.gen_lens == (10, 20, 5)
    assert w.arrivals == (0.0, 0.5, 2.0)  # from the first request
    test = workload_test(w)
    assert (test.n_prompt, test.n_gen, test.name, test.max_seq_len) == (150, 12, "trace", 320)
    requests = make_requests(test, 99, 1000, 0, ArrivalSpec("trace").times(99, 0, test))
    assert [(len(r.prompt), r.n_gen, r.arrival_s) for r in requests] == [(100, 10, 0.0), (300, 20, 0.5), (50, 5, 2.0)]
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"prompt_len": 8, "gen_len": 2}\n\n{"prompt_len": 9, "gen_len": 3}\n')
    w = load_workload(jsonl)
    assert w.prompt_lens == (8, 9) and w.arrivals is None


@pytest.mark.parametrize("text, message", [
    ("prompt_len,gen_len\n10,x\n", "gen_len is not a number"),
    ("prompt,gen\n10,2\n", "no prompt_len"),
    ("prompt_len,gen_len\n0,2\n", "at least 1"),
    ("prompt_len,gen_len,arrival_s\n10,2,1\n10,2,\n", "all or none"),
    ("prompt_len,gen_len\n", "no requests"),
])
def test_bad_workload_files_say_why(tmp_path, text, message):
    path = tmp_path / "w.csv"
    path.write_text(text)
    with pytest.raises(WorkloadError, match=message):
        load_workload(path)


# ---- the benchmark's cases -----------------------------------------------------------------------------
def test_a_rate_sweep_makes_one_case_per_rate():
    config = BenchConfig(make_tests([], [], [(64, 8)]), ["sequential", "chunked"], [0], [32], arrival="poisson",
                         rates=[0.5, 1, 2])
    config.validate()
    cases = list(config.cases())
    assert [c.rate for c in cases] == [0.5, 1, 2, 0.5, 1, 2]
    assert config.n_requests(cases[0]) == 10
    reqs = config.requests_for(cases[0], 1000)
    assert reqs[0].arrival_s == 0.0 and reqs[-1].arrival_s > 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(arrival="poisson"), "needs --rate"),
    (dict(rates=[1.0]), "needs --arrival poisson or gamma"),
    (dict(arrival="gamma", rates=[1.0], burstiness=0), "burstiness"),
    (dict(arrival="poisson", rates=[-2.0]), "rate above 0"),
])
def test_bad_arrival_settings_are_refused(kwargs, message):
    config = BenchConfig(make_tests([], [], [(64, 8)]), ["sequential"], [1], **kwargs)
    with pytest.raises(ValueError, match=message):
        config.validate()

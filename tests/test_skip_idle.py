"""--skip-idle: on a real backend's clock, the time no step runs is jumped over, not slept through; the steps
themselves are timed as before."""
from __future__ import annotations

import json
import time

import pytest

from strategies import make_strategy

from prefillbench import cli, engine
from prefillbench.backends.base import StepBackend
from prefillbench.backends.fake import FakeBackend
from prefillbench.sequence import Request

STEP_S = 0.004


class TimedSteps(FakeBackend):
    """Wall time like a real backend: each step sleeps STEP_S, waits go through StepBackend's own clock."""

    def execute(self, step, return_logits=False):
        time.sleep(STEP_S)
        return super().execute(step, return_logits)

    now = StepBackend.now
    wait_until = StepBackend.wait_until


ARRIVALS = (0.0, 0.4, 0.8, 1.2)


def _run(skip: bool):
    backend = TimedSteps(seconds_per_token=0.0, seconds_per_step=0.0)
    backend.skip_idle = skip
    requests = [Request((1, 2, 3), 3, t) for t in ARRIVALS]
    began = time.perf_counter()
    record = engine.run(backend, make_strategy("chunked", 8), requests, 0)
    return record, time.perf_counter() - began, backend


def test_the_clock_jumps_over_idle_time_and_keeps_every_step_timed():
    slept, slept_wall, _ = _run(False)
    skipped, skipped_wall, backend = _run(True)
    assert slept_wall >= ARRIVALS[-1] and skipped_wall < ARRIVALS[-1] / 2  # the 1.2 s of arrivals not waited out
    # on the run's clock both saw the same schedule: each request starts at its arrival, as the sleeping run did
    assert skipped.wall >= ARRIVALS[-1]
    assert backend.idle_skipped == pytest.approx(skipped.wall - sum(s.seconds for s in skipped.steps), abs=0.05)
    for a, b, t in zip(slept.requests, skipped.requests, ARRIVALS):
        assert b.arrival == pytest.approx(skipped.start + t)
        assert b.first_scheduled == pytest.approx(b.arrival, abs=0.02)
        # per-request latencies agree with the sleeping run's to within the steps' own jitter
        assert b.token_times[0] - b.arrival == pytest.approx(a.token_times[0] - a.arrival, abs=0.02)
    assert all(s.seconds >= STEP_S for s in skipped.steps)  # the steps themselves still ran in real time


def test_a_wait_for_a_step_in_flight_is_never_skipped():
    backend = TimedSteps()
    backend.skip_idle = True
    start = backend.now()
    backend.wait_until(start + 0.05, idle=False)
    assert backend.idle_skipped == 0.0 and backend.now() - start >= 0.05
    backend.wait_until(backend.now() + 10.0, idle=True)
    assert backend.idle_skipped == pytest.approx(10.0, abs=0.01)


def test_the_flag_reaches_the_backend_and_the_export(tmp_path, capsys, use_backend):
    from prefillbench.commands.options import TuneOptions

    loaded = []

    def load(*args, **kwargs):
        loaded.append(TimedSteps(seconds_per_token=0.0, seconds_per_step=0.0))
        return loaded[-1]

    use_backend(load)
    assert TuneOptions.from_flags(backend="gguf", quick=True).load.skip_idle is True  # --quick on a real backend
    assert TuneOptions.from_flags(backend="gguf", quick=True, skip_idle=False).load.skip_idle is False
    assert TuneOptions.from_flags(backend="gguf", slo="tbt=300").load.skip_idle is None
    assert TuneOptions.from_flags(backend="sim", sim_model="mistral-7b", sim_gpu="a100", quick=True).load.skip_idle is None
    out = tmp_path / "run.json"
    code = cli.main(["run", "--backend", "gguf", "--pg", "8,2", "--arrival", "poisson", "--rate", "2", "--requests", "4",
                     "-s", "sequential", "--no-warmup", "--skip-idle", "--no-results-file", "--no-progress",
                     "--export", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert loaded[-1].skip_idle and loaded[-1].idle_skipped > 0 and "--skip-idle: where no step runs" in err
    assert json.loads(out.read_text())["metadata"]["skip_idle"] is True


def test_the_flag_is_named_where_it_does_nothing(capsys):
    code = cli.main(["run", "--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "a100", "-p", "64", "-n", "4",
                     "-c", "1", "-r", "1", "--skip-idle", "--no-results-file", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0
    assert "--skip-idle is ignored by the sim backend" in err
    assert "--skip-idle does nothing in a closed loop" in err


def test_quick_is_its_preset_under_whatever_is_given():
    from prefillbench.commands.options import QUICK, TuneOptions

    o = TuneOptions.from_flags(backend="gguf", quick=True)
    assert (o.settings.test.n_prompt, o.settings.test.n_gen) == QUICK["pg"] == (256, 32)
    assert [k.tbt_p99_ms for k in o.criteria] == [500.0] and o.criteria[0].percentile == 99.0
    assert o.settings.requests == 20 and o.settings.precision == pytest.approx(0.10) and o.top_k == 2
    assert sorted({c.budget for c in o.configs if c.budget}) == [32, 64, 128, 256]
    assert sorted({c.strategy for c in o.configs}) == ["chunked", "packed", "sarathi-serve", "sequential", "slo-budget"]
    given = TuneOptions.from_flags(backend="gguf", quick=True, slo="tbt=300", requests=30, chunk_size=[64])
    assert [k.tbt_p99_ms for k in given.criteria] == [300.0] and given.settings.requests == 30
    assert sorted({c.budget for c in given.configs if c.budget}) == [64]


def test_quick_keeps_a_value_given_even_when_it_is_the_plain_default():
    """--quick --precision 5 --top-k 3 is 5% and 3: the preset fills only what was not given."""
    from prefillbench.commands.options import DEFAULT_TOP_K, TuneOptions

    given = TuneOptions.from_flags(backend="gguf", quick=True, precision=5.0, top_k=DEFAULT_TOP_K)
    assert given.settings.precision == pytest.approx(0.05) and given.top_k == DEFAULT_TOP_K == 3
    plain = TuneOptions.from_flags(backend="gguf", slo="tbt=100")
    assert plain.settings.precision == pytest.approx(0.05) and plain.top_k == DEFAULT_TOP_K

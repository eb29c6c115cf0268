"""Serving runs that cannot mean anything are refused or warned about (issue 28, finding 3)."""
from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest

from prefillbench import cli
from prefillbench.bench import serving_checks
from prefillbench.bench.cases import BenchConfig
from prefillbench.bench.metrics import SLO
from prefillbench.bench.workloads import ArrivalSpec, TestSpec
from rows import make_row

SIM = ["run", "--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "a100", "--no-progress", "--no-results-file"]


def config(tests, **kw) -> BenchConfig:
    base = dict(strategies=["sequential", "chunked"], concurrency=[0], arrival="poisson", rates=[1.0], repetitions=1)
    base.update(kw)
    return BenchConfig(tests=tests, **base)


def test_a_tbt_slo_on_prompt_only_tests_is_refused_with_a_suggestion(capsys):
    assert cli.main([*SIM, "-p", "512", "-n", "0", "--arrival", "poisson", "--rate", "1", "--slo", "tbt=100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no gaps between tokens" in err and "--pg 512,128" in err


def test_a_tbt_slo_beside_a_prompt_only_test_is_warned_about():
    warnings = serving_checks.before_run(config([TestSpec(512, 0), TestSpec(512, 128)], slo=SLO(tbt_ms=100)))
    assert any(w.startswith("--slo tbt=100: pp512 emits one token") for w in warnings)
    assert not any("no decode alongside prefill" in w for w in warnings)  # pp512+tg128 mixes them


def test_tests_without_decode_beside_prefill_are_warned_about_in_an_open_loop():
    warnings = serving_checks.before_run(config([TestSpec(512, 0), TestSpec(0, 128)], requests=500))
    (w,) = warnings
    assert "pp512 and tg128 have no decode alongside prefill" in w and "--pg 512,128" in w


def test_too_few_requests_for_the_rate_says_how_many_are_needed():
    (w, _) = serving_checks.before_run(config([TestSpec(512, 0)]))  # the default 10 requests
    assert "±33%" in w and "--requests 401" in w
    assert not any("requests per rate" in w for w in serving_checks.before_run(config([TestSpec(64, 8)], requests=401)))
    # gamma intervals of shape 4 vary half as much as Poisson's: a quarter of the requests.
    assert serving_checks.requests_for_rate(4.0) == 101


def test_the_rate_error_is_one_over_root_n():
    # What the warning claims, checked on the arrival process itself: the offered rate's relative spread.
    for n in (10, 101):
        errors = []
        for seed in range(400):
            times = ArrivalSpec("poisson", 2.0).times(n, seed)
            errors.append((n - 1) / times[-1] / 2.0 - 1)
        assert float(np.std(errors)) == pytest.approx(serving_checks.rate_error(n), rel=0.25)


row = partial(make_row, test="pp512", n_prompt=512, concurrency=0, requests=10, repetitions=1, ttft_p50_ms=30.0,
              ttft_p99_ms=31.0, arrival="poisson", rate=1.0, offered_rps=1.19, achieved_rps=1.0)


def test_strategies_that_all_measured_alike_are_named():
    rows = [row(strategy=s) for s in ("sequential", "padded", "orca")]
    (w,) = serving_checks.after_run(rows)
    assert w.startswith("all 3 strategies measured alike on pp512") and "--pg" in w
    assert serving_checks.after_run(rows[:2] + [row(strategy="orca", ttft_p99_ms=40.0)]) == []


def test_achieved_above_offered_is_explained():
    rows = [row(achieved_rps=1.31), row(strategy="padded", ttft_p50_ms=20.0)]
    (w,) = serving_checks.after_run(rows)
    assert "achieved above offered on 1 row(s)" in w and "9 gaps between 10 arrivals" in w and "+11%" in w


def test_a_default_serving_run_warns_on_stderr(capsys):
    code = cli.main([*SIM, "-p", "0", "-n", "0", "--pg", "64,8", "--arrival", "poisson", "--rate", "1",
                     "-s", "sequential,chunked", "-o", "csv"])
    out, err = capsys.readouterr()
    assert code == 0 and "warning: 10 requests per rate" in err and "warning" not in out

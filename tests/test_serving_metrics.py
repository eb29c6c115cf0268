"""Serving metrics on hand-built traces: TPOT, end-to-end, scheduling delay, rates, SLOs and goodput."""
from __future__ import annotations

import math

import pytest

from prefillbench.report import compare
from prefillbench.report import tables
from prefillbench.report.exports import load_results
from prefillbench.engine import RequestRecord, RunRecord
from prefillbench.bench.metrics import SLO, Load, e2e_ms, sched_delay_ms, summarize, tpot_ms
from prefillbench.bench.workloads import TestSpec


def req(arrival, scheduled, times, prompt_len=10):
    return RequestRecord(prompt_len, arrival, list(times), [1] * len(times), first_scheduled=scheduled)


def trace() -> RunRecord:
    """Four requests; the second waits 0.5 s to be scheduled and then stalls 0.3 s between two tokens."""
    requests = [
        req(0.0, 0.0, [0.1, 0.2, 0.3]),  # TTFT 100, TPOT 100, max TBT 100, E2E 300
        req(0.5, 1.0, [1.2, 1.5, 1.6]),  # TTFT 700, TPOT 200, max TBT 300, E2E 1100, delay 500
        req(1.0, 1.0, [1.1, 1.2, 1.3]),  # TTFT 100, TPOT 100, max TBT 100, E2E 300
        req(2.0, 2.1, [2.3]),  # one token: TTFT 300, no TPOT, E2E 300, delay 100
    ]
    return RunRecord(0.0, 2.5, requests, [])


def test_achieved_rate_when_requests_finish_together():
    # A batch's requests end in one step: the rate is still bounded by the time they took.
    run = RunRecord(0.0, 2.0, [req(0.0, 0.0, [0.5, 1.9]), req(0.4, 0.5, [0.9, 1.9])], [])
    row = summarize(TestSpec(10, 2), [run], model="m", backend="b", strategy="s", concurrency=0, chunk_size=None,
                    load=Load("poisson", 1.0), slo=None)
    assert row.achieved_rps == pytest.approx(2 / 1.9)


def test_per_request_latencies():
    r = trace().requests
    assert tpot_ms(r[1]) == pytest.approx(200.0) and math.isnan(tpot_ms(r[3]))
    assert e2e_ms(r[1]) == pytest.approx(1100.0)
    assert sched_delay_ms(r[1]) == pytest.approx(500.0) and sched_delay_ms(r[0]) == 0.0
    assert math.isnan(sched_delay_ms(RequestRecord(1, 0.0, [1.0], [1])))  # no step known: unknown


def test_slo_met_per_request():
    r = trace().requests
    assert [SLO(tbt_ms=150).met(x) for x in r] == [True, False, True, True]  # one token: no gap to miss
    assert [SLO(ttft_ms=350).met(x) for x in r] == [True, False, True, True]
    assert [SLO(tpot_ms=150).met(x) for x in r] == [True, False, True, True]  # no TPOT: met, as vLLM counts it
    assert [SLO(e2e_ms=301).met(x) for x in r] == [True, False, True, True]
    assert [SLO(ttft_ms=200, e2e_ms=1200).met(x) for x in r] == [True, False, True, False]


def test_summary_of_a_hand_built_open_loop_run():
    run = trace()
    row = summarize(TestSpec(10, 3), [run], model="m", backend="b", strategy="s", concurrency=0, chunk_size=None,
                    load=Load("poisson", 1.5), slo=SLO(tbt_ms=150))
    assert (row.arrival, row.rate, row.burstiness, row.slo) == ("poisson", 1.5, None, "tbt=150")
    assert row.offered_rps == pytest.approx(3 / 2.0)  # 4 arrivals over 2 s
    assert row.achieved_rps == pytest.approx(4 / 2.3)  # 4 completions from the first arrival (0 s) to the last (2.3 s)
    assert row.request_throughput == pytest.approx(4 / 2.5)
    assert row.goodput_rps == pytest.approx(3 / 2.5) and row.slo_met == pytest.approx(0.75)
    assert row.tpot_p50_ms == pytest.approx(100.0)  # of 100, 200, 100 (the one-token request has none)
    assert row.sched_delay_p50_ms == pytest.approx(50.0)  # of 0, 500, 0, 100
    assert row.e2e_p50_ms == pytest.approx(300.0)
    assert row.e2e_p99_ms == pytest.approx(300 + 0.97 * 800)  # numpy's linear percentile of 300, 300, 300, 1100
    assert row.ttft_p90_ms == pytest.approx(300 + 0.7 * 400)
    # The gaps: 100, 100, 300, 100, 100, 100 ms.
    assert row.tbt_p50_ms == pytest.approx(100.0) and row.tbt_p99_ms == pytest.approx(300 - 0.05 * 200)


def test_a_closed_loop_row_has_no_rates_or_goodput():
    row = summarize(TestSpec(10, 3), [trace()], model="m", backend="b", strategy="s", concurrency=4, chunk_size=None)
    assert row.arrival == "closed" and row.rate is None and row.slo == ""
    assert math.isnan(row.offered_rps) and math.isnan(row.goodput_rps) and math.isnan(row.slo_met)
    assert row.request_throughput == pytest.approx(4 / 2.5)


def test_goodput_is_averaged_over_repetitions():
    slow = trace()
    fast = RunRecord(0.0, 1.25, trace().requests, [])
    row = summarize(TestSpec(10, 3), [slow, fast], model="m", backend="b", strategy="s", concurrency=0,
                    chunk_size=None, load=Load("poisson", 1.5), slo=SLO(tbt_ms=150))
    assert row.goodput_rps == pytest.approx((3 / 2.5 + 3 / 1.25) / 2)


def test_spread_lengths_count_each_requests_own_tokens():
    run = RunRecord(0.0, 2.0, [req(0.0, 0.0, [0.5, 1.0], prompt_len=100), req(0.0, 0.5, [1.5, 2.0], prompt_len=300)], [])
    row = summarize(TestSpec(200, 2, spread=0.5), [run], model="m", backend="b", strategy="s", concurrency=2,
                    chunk_size=None)
    assert row.throughput == pytest.approx((102 + 302) / 2.0)
    assert row.ts_mean == pytest.approx((102 / 1.0 + 302 / 2.0) / 2)


@pytest.mark.parametrize("text, expected", [
    ("tbt=200", SLO(tbt_ms=200)),
    ("ttft=1000, tpot=50,TBT=200,e2e=5000", SLO(1000, 50, 200, 5000)),
    ("e2e=2.5", SLO(e2e_ms=2.5)),
])
def test_slo_parses_any_subset(text, expected):
    assert SLO.parse(text) == expected
    assert SLO.parse(str(expected)) == expected


@pytest.mark.parametrize("text, message", [
    ("", "at least one"), ("tbt", "KEY=MS"), ("p99=3", "KEY=MS"), ("tbt=fast", "not a number"),
    ("tbt=0", "positive"), ("tbt=1,tbt=2", "twice"),
])
def test_bad_slos_say_why(text, message):
    with pytest.raises(ValueError, match=message):
        SLO.parse(text)


def open_row(strategy="sequential", rate=1.0, goodput=2.0, **kw):
    run = trace()
    row = summarize(TestSpec(10, 3), [run], model="m", backend="b", strategy=strategy, concurrency=0,
                    chunk_size=None, load=Load("gamma", rate, 0.5), slo=SLO(tbt_ms=150))
    row.goodput_rps = goodput
    for k, v in kw.items():
        setattr(row, k, v)
    return row


@pytest.mark.parametrize("suffix", ["csv", "json", "jsonl"])
def test_exports_carry_the_load_and_slo_and_read_back(tmp_path, suffix):
    rows = [open_row(rate=0.5), open_row(rate=2.0)]
    path = tmp_path / f"r.{suffix}"
    tables.export(path, rows, {"seed": 42})
    back = load_results(str(path)).rows
    assert [(r.arrival, r.rate, r.burstiness, r.slo) for r in back] == [("gamma", 0.5, 0.5, "tbt=150"), ("gamma", 2.0, 0.5, "tbt=150")]
    assert back[0].goodput_rps == 2.0 and back[0].sched_delay_p50_ms == pytest.approx(50.0)
    closed = tmp_path / f"c.{suffix}"
    tables.export(closed, [summarize(TestSpec(10, 3), [trace()], model="m", backend="b", strategy="s",
                                      concurrency=1, chunk_size=None)], {})
    (c,) = load_results(str(closed)).rows
    assert c.rate is None and c.arrival == "closed" and c.slo == ""


def test_compare_joins_rows_by_rate_and_gates_on_goodput(tmp_path):
    base = tmp_path / "base.csv"
    cur = tmp_path / "cur.csv"
    tables.export(base, [open_row(rate=1.0, goodput=2.0), open_row(rate=2.0, goodput=3.0)], {})
    tables.export(cur, [open_row(rate=1.0, goodput=2.0), open_row(rate=2.0, goodput=2.0)], {})
    cmp = compare.compare(load_results(str(base)), load_results(str(cur)), ["goodput_rps"], threshold=10)
    assert len(cmp.entries) == 2
    (bad,) = cmp.regressions
    assert "2/s" in compare.key_label(bad.key)


def test_md_table_of_an_open_loop_shows_the_load_and_the_goodput():
    text = tables.render("md", [open_row(rate=0.5), open_row(strategy="chunked", rate=0.5)], {})
    header = text.splitlines()[0]
    for column in ("arrival req/s", "offered/achieved", "TPOT p50", "E2E p50/p99", "sched p50", "goodput req/s (met tbt=150)"):
        assert column in header
    assert "t/s" not in header
    assert "gamma 0.5 b=0.5" in text and "2.00 (75%)" in text


def test_a_probe_stopped_before_any_request_finished_is_a_row_without_latencies():
    """capacity stops a probe once its SLO has certainly failed; on a server that can be before any request has
    finished (live requests' first tokens already late). That is a failed probe, not an error; a run that was not
    stopped and finished nothing still is one."""
    import math

    from prefillbench.backends.base import BackendError
    from prefillbench.bench.metrics import SLO, Load, summarize
    from prefillbench.bench.workloads import make_tests
    from prefillbench.engine.records import RunRecord

    test = make_tests([], [], [(256, 32)], 0.0)[0]
    args = dict(model="m", backend="b", strategy="sarathi-serve", concurrency=0, chunk_size=64,
                load=Load("poisson", 1.0, None), slo=SLO.parse("tbt=500"))
    row = summarize(test, [RunRecord(0.0, 5.0, [], [], stopped=True)], **args)
    assert math.isnan(row.tbt_p99_ms) and math.isnan(row.ttft_p99_ms) and math.isnan(row.offered_rps)
    assert row.slo_met == 0.0 and row.goodput_rps == 0.0 and row.request_throughput == 0.0
    with pytest.raises(BackendError, match="finished no request"):
        summarize(test, [RunRecord(0.0, 5.0, [], [])], **args)

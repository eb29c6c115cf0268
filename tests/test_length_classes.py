"""Request classes (issue 58, the head-of-line workload): a trace's `class` column, the `mix:` workload, and each
class's TTFT in every row, export and table."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from prefillbench.bench.class_columns import class_columns, ttft_by_class
from prefillbench.bench.mix import MixSpec
from prefillbench.bench.traces import WorkloadError, load_workload
from prefillbench.bench.workloads import make_requests, workload_test
from prefillbench.engine.records import RequestRecord
from prefillbench.report.tables import class_cell
from rows import make_row

MIX = "mix:n=40,short=0.8:64-256,long=0.2:6000-8000,gen=8,seed=3"


def test_the_class_column_is_read_and_carried_to_each_request(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("prompt_len,gen_len,arrival_s,class\n900,4,0.5,long\n20,4,0.0,short\n30,4,0.2, short \n")
    w = load_workload(path)
    # sorted by arrival, each class with its row
    assert w.prompt_lens == (20, 30, 900) and w.classes == ("short", "short", "long")
    reqs = make_requests(workload_test(w), len(w), 1000, seed=0, arrivals=list(w.arrivals))
    assert [(len(r.prompt), r.length_class) for r in reqs] == [(20, "short"), (30, "short"), (900, "long")]


def test_the_class_column_survives_the_windows_and_the_length_cap(tmp_path):
    from prefillbench.bench.traces import TraceReading

    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps({"prompt_len": p, "gen_len": 2, "class": c})
                              for p, c in [(10, "a"), (5000, "b"), (12, "a"), (20, "c")]) + "\n")
    w = load_workload(path, TraceReading(first=3, max_len=100))
    assert w.prompt_lens == (10, 12) and w.classes == ("a", "a") and w.dropped == 1


def test_a_trace_without_classes_has_none_and_a_partial_column_is_refused(tmp_path):
    plain = tmp_path / "plain.csv"
    plain.write_text("prompt_len,gen_len\n10,2\n")
    assert load_workload(plain).classes is None
    reqs = make_requests(workload_test(load_workload(plain)), 1, 1000, seed=0)
    assert reqs[0].length_class is None
    partial = tmp_path / "partial.csv"
    partial.write_text("prompt_len,gen_len,class\n10,2,short\n20,2,\n")
    with pytest.raises(WorkloadError, match="class is given for 1 of 2 requests"):
        load_workload(partial)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_len": 10, "gen_len": 2, "class": ["x"]}\n')
    with pytest.raises(WorkloadError, match="line 1: class must be a name"):
        load_workload(bad)


def test_a_mix_has_its_shares_exactly_its_ranges_and_its_seed():
    spec = MixSpec.parse("mix:n=200,short=90%:128-1024,long=0.1:16384-32768,gen=128,seed=7")
    w = spec.workload()
    assert len(w) == 200 and w.arrivals is None and set(w.gen_lens) == {128} and w.source == "mix"
    assert Counter(w.classes) == {"short": 180, "long": 20}
    for length, cls in zip(w.prompt_lens, w.classes):
        assert (128 <= length <= 1024) if cls == "short" else (16384 <= length <= 32768)
    assert len(set(w.prompt_lens)) > 150  # drawn, not fixed
    assert w.classes[:20].count("long") < 20  # shuffled, not one class after the other
    assert MixSpec.parse("mix:n=200,short=90%:128-1024,long=0.1:16384-32768,gen=128,seed=7").workload() == w
    other = MixSpec.parse("mix:n=200,short=90%:128-1024,long=0.1:16384-32768,gen=128,seed=8").workload()
    assert other.prompt_lens != w.prompt_lens and Counter(other.classes) == Counter(w.classes)
    # shares rounded to whole requests, the rest to the largest remainders; a single length is fixed
    three = MixSpec.parse("mix:n=10,a=1/3:5-5,b=0.333333334:7,c=0.333333333:9-9".replace("1/3", "0.333333333"))
    assert sum(three.counts()) == 10 and sorted(three.counts()) == [3, 3, 4]
    assert set(three.workload().prompt_lens) == {5, 7, 9}
    assert MixSpec.parse("mix:only=1:64").workload().prompt_lens == (64,) * 100  # n's default


def test_a_mix_makes_requests_that_carry_their_class():
    test = workload_test(MixSpec.parse(MIX).workload())
    reqs = make_requests(test, len(test.workload), 32000, seed=0, arrivals=[0.1 * i for i in range(40)])
    assert Counter(r.length_class for r in reqs) == {"short": 32, "long": 8}
    assert all((len(r.prompt) >= 6000) == (r.length_class == "long") for r in reqs)


def test_ttft_by_class_pools_the_requests_of_each_class_shortest_first():
    def rec(prompt_len, cls, ttft):
        return RequestRecord(prompt_len, 1.0, [1.0 + ttft / 1000, 2.0], [1, 2], length_class=cls)

    reqs = [rec(9000, "long", 800.0), rec(100, "short", 10.0), rec(120, "short", 30.0), rec(9000, "long", 1200.0)]
    figures = ttft_by_class(reqs)
    assert list(figures) == ["short", "long"]
    assert figures["short"] == {"n": 2, "ttft_p50_ms": 20.0, "ttft_p99_ms": pytest.approx(29.8)}
    assert figures["long"]["n"] == 2 and figures["long"]["ttft_p50_ms"] == 1000.0
    assert json.loads(class_columns(reqs)["ttft_by_class"]) == figures
    assert class_columns([RequestRecord(10, 0.0, [0.1], [1])]) == {}  # no class: the field stays ""
    assert class_cell(make_row(ttft_by_class=class_columns(reqs)["ttft_by_class"])) == "short 29.8 / long 1196"
    assert class_cell(make_row()) == "-"


def test_a_sim_run_of_a_mix_reports_each_class(tmp_path, run_cli):
    export = tmp_path / "x.json"
    code, out, err = run_cli("run", "--backend", "sim", "--sim-model", "llama-3.1-8b", "--sim-gpu", "h100",
                             "--workload", MIX, "--arrival", "poisson", "--rate", "4", "-s", "sequential,vllm-v1",
                             "--chunk-size", "2048", "-r", "1", "--no-results-file", "--export", str(export))
    assert code == 0, err
    rows = {r["strategy"]: r for r in json.loads(export.read_text())["results"]}
    for row in rows.values():
        figures = json.loads(row["ttft_by_class"])
        assert list(figures) == ["short", "long"]
        assert figures["short"]["n"] == 32 and figures["long"]["n"] == 8
        for f in figures.values():
            assert 0 < f["ttft_p50_ms"] <= f["ttft_p99_ms"] < 60_000
    seq = json.loads(rows["sequential"]["ttft_by_class"])
    assert seq["long"]["ttft_p50_ms"] > seq["short"]["ttft_p50_ms"]  # a long prompt takes longer to prefill
    header = next(line for line in out.splitlines() if "TTFT p99 ms by class" in line)
    row_line = next(line for line in out.splitlines() if "| sequential" in line)
    column = [c.strip() for c in header.split("|")].index("TTFT p99 ms by class")
    cell = [c.strip() for c in row_line.split("|")][column]
    assert cell.startswith("short ") and " / long " in cell
    assert cell == f"short {seq['short']['ttft_p99_ms']:.0f} / long {seq['long']['ttft_p99_ms']:.0f}"


def test_rows_of_a_workload_without_classes_have_no_class_column(tmp_path, run_cli):
    export = tmp_path / "x.json"
    code, out, err = run_cli("run", "--backend", "sim", "--pg", "256,4", "-c", "2", "-s", "sequential", "-r", "1",
                             "--no-results-file", "--export", str(export))
    assert code == 0, err
    assert json.loads(export.read_text())["results"][0]["ttft_by_class"] == ""
    assert "by class" not in out


@pytest.mark.parametrize("spec, message", [
    ("mix:", "no class"),
    ("mix:n=10", "no class"),
    ("mix:short=0.9:128-1024", "add up to 0.9, not 1"),
    ("mix:short=0.5:128-1024,long=0.6:2000", "add up to 1.1, not 1"),
    ("mix:short=0.9", "needs a share and a prompt length range"),
    ("mix:short=x:1-2,long=0.5:3", "share is not a number"),
    ("mix:short=0:1-2,long=1:3", "above 0"),
    ("mix:short=0.5:2-1,long=0.5:3", "low to high"),
    ("mix:short=0.5:a-b,long=0.5:3", "not LOW-HIGH"),
    ("mix:short=0.5:0-4,long=0.5:3", "1 or more tokens"),
    ("mix:n=2.5,a=1:3", "n must be a whole number"),
    ("mix:n=0,a=1:3", "at least 1"),
    ("mix:gen=0,a=1:3", "at least 1"),
    ("mix:seed=-1,a=1:3", "seed must be 0 or more"),
    ("mix:n=5,short=0.95:1-9,long=0.05:99", "gives class long no request"),
    ("mix:a=0.5:3,a=0.5:4", "class a is given twice"),
    ("mix:9a=1:3", "not a class name"),
    ("mix:short", "neither a class"),
])
def test_bad_mix_specs_are_refused_in_one_line(spec, message, run_cli):
    code, out, err = run_cli("run", "--backend", "sim", "--workload", spec, "-s", "sequential", "--no-results-file")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err and spec in lines[0]


def test_a_mix_refuses_the_trace_reading_flags(run_cli):
    code, out, err = run_cli("run", "--backend", "sim", "--workload", MIX, "--token-scale", "0.5", "-s", "sequential",
                             "--no-results-file")
    assert code == 2 and "the trace-reading flags do not apply" in err.strip().splitlines()[-1]


def test_a_served_request_keeps_its_class():
    from types import SimpleNamespace

    from prefillbench.engine.served import _record
    from prefillbench.sequence import Request

    streamed = SimpleNamespace(request=Request((5, 6, 7), 2, 0.0, length_class="long"), scheduled=1.0,
                               token_times=[1.2, 1.3], tokens=[1, 2], first_scheduled=1.0, error=None,
                               server_token_times=None, cached_tokens=None)
    assert _record(streamed).length_class == "long"


def test_an_admitted_sequence_and_its_record_keep_the_class():
    from prefillbench.engine.records import request_record
    from prefillbench.sequence import Request, Sequence

    seq = Sequence.admit(0, Request((5, 6, 7), 1, 0.0, length_class="short"), 0.0)
    seq.n_prefilled = 3
    seq.append_token(9, 0.5)
    assert seq.length_class == "short" and request_record(seq, []).length_class == "short"

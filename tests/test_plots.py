"""plot: which charts are written, and that they hold the expected series (not pixels)."""
from __future__ import annotations

import json
import math

import pytest

from prefillbench import cli
from prefillbench.report import plots
from prefillbench.report import tables
from prefillbench.report import traces
from prefillbench.bench.metrics import ResultRow
from rows import make_row

STRATEGIES = ("sequential", "padded", "chunked")
SIZES = (64, 128, 256)
CONCURRENCY = (4, 1, 2)  # unsorted on purpose: series must come out sorted


def throughput_of(strategy, test, c, size=None):
    return 100.0 * c + {"sequential": 1, "padded": 2, "chunked": 3}[strategy] + (size or 0) / 1000 + (0.5 if "+" in test else 0)


def tbt_p99_of(strategy, test, c, size=None):
    return math.nan if "+" not in test else 10.0 * c + (size or 0) / 10


def make_rows(tests=("pp512", "pp512+tg32")) -> list[ResultRow]:
    rows = []
    for test in tests:
        n_prompt, n_gen = (512, 32) if "+" in test else (512, 0)
        for strategy in STRATEGIES:
            for c in CONCURRENCY:
                for size in (SIZES if strategy == "chunked" else (None,)):
                    rows.append(make_row(
                        backend="gguf CPU", strategy=strategy, test=test, n_prompt=n_prompt, n_gen=n_gen,
                        concurrency=c, chunk_size=size, requests=c,
                        ts_mean=1.0, ts_std=0.1, ms_per_token=1.0, throughput=throughput_of(strategy, test, c, size),
                        ttft_p50_ms=1.0, ttft_p99_ms=2.0, tbt_p50_ms=1.0, tbt_p99_ms=tbt_p99_of(strategy, test, c, size),
                        throughput_ci95=0.25 * c,
                    ))
    return rows


def trace_line(strategy, chunk_size, test, c, arrival, times, rep=0, req=0):
    return json.dumps({"model": "m", "backend": "gguf CPU", "strategy": strategy, "test": test, "n_prompt": 512,
                       "n_gen": 0 if "+" not in test else 32, "concurrency": c, "chunk_size": chunk_size,
                       "repetition": rep, "request": req, "prompt_len": 512, "arrival": arrival, "token_times": times})


TRACE = [
    # pp512+tg32 at c=2: sequential's requests wait; chunked's decode keeps going
    trace_line("sequential", None, "pp512+tg32", 2, 0.0, [0.1, 0.11, 0.12]),
    trace_line("sequential", None, "pp512+tg32", 2, 0.0, [0.2, 0.25, 0.45], req=1),
    trace_line("chunked", 128, "pp512+tg32", 2, 0.0, [0.15, 0.16], rep=0),
    trace_line("chunked", 128, "pp512+tg32", 2, 0.0, [0.05, 0.08], rep=1),
    trace_line("sequential", None, "pp512", 1, 0.0, [0.3]),
]


def write_inputs(tmp_path, with_trace=True):
    path = tmp_path / "run.json"
    tables.export(path, make_rows(), {"cpu": "x"})
    if with_trace:
        (tmp_path / "run.requests.jsonl").write_text("\n".join(TRACE) + "\n")
    return path


def by_name(charts):
    return {c.name: c for c in charts}


def charts_of(*paths):
    """The charts the files support, built but not drawn (fast)."""
    return by_name(plots.make_charts(*plots.load_inputs([str(p) for p in paths])))


def test_writes_one_png_per_chart_with_telling_names(tmp_path):
    charts = plots.plot_files([str(write_inputs(tmp_path))], tmp_path / "out")
    names = set(by_name(charts))
    assert names == {
        "throughput_vs_concurrency_pp512", "throughput_vs_concurrency_pp512+tg32",
        *(f"chunk_sweep_{t}_c{c}" for t in ("pp512", "pp512+tg32") for c in (1, 2, 4)),
        "ttft_cdf_pp512+tg32_c2", "tbt_cdf_pp512+tg32_c2", "ttft_cdf_pp512_c1",  # pp: one token, no TBT
        "ttft_vs_concurrency_pp512",  # a prompt-only test: the latency side of batching prompts
    }
    for chart in charts:
        assert chart.path == tmp_path / "out" / f"{chart.name}.png"
        assert chart.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(f"{n}.png" for n in names)


def test_throughput_vs_concurrency_series(tmp_path):
    chart = charts_of(write_inputs(tmp_path))["throughput_vs_concurrency_pp512+tg32"]
    (panel,) = chart.panels
    assert panel.labels == ["sequential", "padded", "chunked (64)", "chunked (128)", "chunked (256)"]
    assert panel.xlabel == "concurrency (requests in flight)" and panel.ylabel == "throughput (tokens/s)"
    seq = panel.get("sequential")
    assert seq.x == [1, 2, 4]
    assert seq.y == [throughput_of("sequential", "pp512+tg32", c) for c in (1, 2, 4)]
    assert seq.err == [0.25, 0.5, 1.0]
    assert panel.get("chunked (128)").y == [throughput_of("chunked", "pp512+tg32", c, 128) for c in (1, 2, 4)]
    assert "pp512+tg32" in chart.title and "\nm, gguf CPU" in chart.title


def test_chunk_sweep_series(tmp_path):
    charts = charts_of(write_inputs(tmp_path))
    tput, tbt = charts["chunk_sweep_pp512+tg32_c2"].panels
    assert tput.xlabel == "chunk size (tokens)" and tput.ylabel == "throughput (tokens/s)"
    assert tbt.ylabel == "TBT p99 (ms)"
    chunked = tput.get("chunked")
    assert chunked.x == list(SIZES)
    assert chunked.y == [throughput_of("chunked", "pp512+tg32", 2, s) for s in SIZES]
    assert tbt.get("chunked").y == [tbt_p99_of("chunked", "pp512+tg32", 2, s) for s in SIZES]
    ref = tput.get("sequential")
    assert ref.style == "reference" and ref.x == [64, 256] and ref.y == [throughput_of("sequential", "pp512+tg32", 2)] * 2
    # pp tests emit one token per request: the sweep has no TBT panel
    assert [p.title for p in charts["chunk_sweep_pp512_c1"].panels] == ["throughput"]


def test_no_sweep_with_a_single_chunk_size(tmp_path):
    rows = [r for r in make_rows() if r.chunk_size in (None, 128)]
    path = tmp_path / "one.csv"
    tables.export(path, rows, {})
    names = set(charts_of(path))
    assert not any(n.startswith("chunk_sweep") for n in names)
    assert not any("cdf" in n for n in names)  # a CSV has no trace beside it


def test_cdf_series_from_the_trace(tmp_path):
    charts = charts_of(write_inputs(tmp_path))
    (ttft,) = charts["ttft_cdf_pp512+tg32_c2"].panels
    assert ttft.xlabel == "time to first token (ms)" and ttft.ylabel == "fraction of requests"
    assert ttft.labels == ["sequential", "chunked (128)"]
    seq = ttft.get("sequential")
    assert seq.x == pytest.approx([100.0, 200.0]) and seq.y == [0.5, 1.0]
    assert ttft.get("chunked (128)").x == pytest.approx([50.0, 150.0])
    (tbt,) = charts["tbt_cdf_pp512+tg32_c2"].panels
    assert tbt.xlabel == "time between tokens (ms)" and tbt.ylabel == "fraction of tokens"
    assert tbt.get("sequential").x == pytest.approx([10.0, 10.0, 50.0, 200.0])
    assert tbt.get("sequential").y == [0.25, 0.5, 0.75, 1.0]
    assert tbt.get("chunked (128)").x == pytest.approx([10.0, 30.0])


def test_drawn_lines_carry_the_series(tmp_path):
    charts = charts_of(write_inputs(tmp_path))
    chart = charts["chunk_sweep_pp512+tg32_c2"]
    fig = plots.draw(chart)
    for ax, panel in zip(fig.axes, chart.panels):
        lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
        assert set(lines) == set(panel.labels)
        for s in panel.series:
            assert list(lines[s.label].get_xdata()) == s.x
            assert list(lines[s.label].get_ydata()) == pytest.approx(s.y, nan_ok=True)
        assert ax.get_xlabel() == panel.xlabel and ax.get_ylabel() == panel.ylabel
    ax = plots.draw(charts["ttft_cdf_pp512+tg32_c2"]).axes[0]
    assert {line.get_label() for line in ax.get_lines()} == {"sequential", "chunked (128)"}


def test_two_result_files_are_told_apart(tmp_path):
    a, b = tmp_path / "before.csv", tmp_path / "after.csv"
    tables.export(a, make_rows(("pp512",)), {})
    tables.export(b, make_rows(("pp512",)), {})
    charts = charts_of(a, b)
    labels = charts["throughput_vs_concurrency_pp512"].panels[0].labels
    assert "before: sequential" in labels and "after: sequential" in labels and len(labels) == 10


def test_trace_given_explicitly(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(TRACE) + "\n")
    names = set(charts_of(trace))
    assert names == {"ttft_cdf_pp512+tg32_c2", "tbt_cdf_pp512+tg32_c2", "ttft_cdf_pp512_c1"}


def test_cli_plot_prints_paths(tmp_path, capsys):
    path = write_inputs(tmp_path, with_trace=False)
    assert cli.main(["plot", str(path), "--out", str(tmp_path / "o")]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 2 + 6 + 1 and all(line.endswith(".png") for line in out.splitlines())
    assert "--export-requests" in err


@pytest.mark.parametrize("name,text", [
    ("empty.json", ""),
    ("truncated.json", '{"metadata": {}, "results": [{"model": "m", "backe'),
    ("foreign.csv", "a,b\n1,2\n"),
    ("foreign.json", '{"x": 1}'),
    ("truncated.requests.jsonl", TRACE[0] + "\n" + TRACE[1][:30]),
    ("foreign.requests.jsonl", '{"token_times": [1], "model": "m"}\n'),
])
def test_unusable_input_exit_2(tmp_path, capsys, name, text):
    (tmp_path / name).write_text(text)
    assert cli.main(["plot", str(tmp_path / name), "--out", str(tmp_path / "o")]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("prefillbench: error: ") and err.count("\n") == 1 and name in err
    assert not (tmp_path / "o").exists()


def test_missing_file_exit_2(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path / "nope.csv")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_trace_records_from_real_runs(tmp_path):
    """End to end on a tiny random model: bench -> export + trace -> plot."""
    import torch
    import transformers

    from prefillbench.backends.torch.backend import TorchBackend
    from prefillbench.bench.cases import BenchConfig, run_case
    from prefillbench.bench.workloads import TestSpec

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    config._attn_implementation = "sdpa"
    backend = TorchBackend(transformers.AutoModelForCausalLM.from_config(config).eval(), "tiny")
    bench = BenchConfig(tests=[TestSpec(32, 4)], strategies=["sequential", "chunked"], concurrency=[2],
                        chunk_sizes=[8, 16], repetitions=2)
    results = [run_case(backend, case, bench) for case in bench.cases()]
    assert [r.row.repetitions for r in results] == [2, 2, 2]
    assert all(len(r.runs) == 2 for r in results)  # the warm-up run is not among them
    export = tmp_path / "real.jsonl"
    tables.export(export, [r.row for r in results], {})
    traces.export_traces(traces.trace_path_for(export), results)
    records = [json.loads(l) for l in (tmp_path / "real.requests.jsonl").read_text().splitlines()]
    assert len(records) == 3 * 2 * 2  # cases x repetitions x requests
    assert all(len(r["token_times"]) == 4 and r["token_times"][0] > r["arrival"] >= 0 for r in records)
    charts = by_name(plots.plot_files([str(export)], tmp_path / "o"))
    assert set(charts) == {"throughput_vs_concurrency_pp32+tg4", "chunk_sweep_pp32+tg4_c2", "ttft_cdf_pp32+tg4_c2", "tbt_cdf_pp32+tg4_c2",
                           "tbt_stalls_pp32+tg4_c2"}
    ttft = charts["ttft_cdf_pp32+tg4_c2"].panels[0]
    assert ttft.labels == ["sequential", "chunked (8)", "chunked (16)"]
    assert all(len(s.x) == 2 * 2 for s in ttft.series)
    # the plotted percentile agrees with the row's: same data, two paths
    seq_row = results[0].row
    tbt = charts["tbt_cdf_pp32+tg4_c2"].panels[0].get("sequential")
    assert max(tbt.x) == pytest.approx(max(v for run in results[0].runs for r in run.requests
                                            for v in [1000 * (b - a) for a, b in zip(r.token_times, r.token_times[1:])]), abs=1e-3)
    # the trace keeps times to 0.1 us (7 decimals of a second), so two rounded times differ by up to 2e-4 ms
    assert seq_row.tbt_p99_ms <= max(tbt.x) + 1e-3


def test_trace_beside_a_csv_export_is_found(tmp_path):
    path = tmp_path / "ci.csv"
    tables.export(path, make_rows(("pp512+tg32",)), {})
    assert not any("cdf" in n for n in charts_of(path))
    (tmp_path / "ci.requests.jsonl").write_text("\n".join(TRACE) + "\n")
    names = set(charts_of(path))
    assert {"ttft_cdf_pp512+tg32_c2", "tbt_cdf_pp512+tg32_c2"} <= names
    # given twice (by name and found beside), it is read once
    ttft = charts_of(path, tmp_path / "ci.requests.jsonl")["ttft_cdf_pp512+tg32_c2"].panels[0]
    assert len(ttft.get("sequential").x) == 2


def test_latency_distributions_have_one_scale_whatever_they_span(tmp_path):
    # Finding 7: a linear axis for gguf (a narrow span) and a log one for the sim made the same chart incomparable.
    trace = tmp_path / "t.jsonl"
    lines = [trace_line("sequential", None, "pp512+tg32", 1, 0.0, [0.001 * (i + 1), 0.001 * (i + 1) + g])
             for i, g in enumerate((0.001, 0.5))]
    trace.write_text("\n".join(lines) + "\n")
    charts = charts_of(trace)
    assert charts["tbt_cdf_pp512+tg32_c1"].panels[0].xlog  # 1 ms .. 500 ms
    assert charts["ttft_cdf_pp512+tg32_c1"].panels[0].xlog  # 1 ms .. 2 ms: the same scale
    assert plots.draw(charts["tbt_cdf_pp512+tg32_c1"]).axes[0].get_xscale() == "log"
    assert plots.draw(charts["ttft_cdf_pp512+tg32_c1"]).axes[0].get_xscale() == "log"


# ---------------------------------------------------------------- how charts are drawn (issue 28, finding 7)


def test_throughput_axes_start_at_zero(tmp_path):
    # 157-173 t/s drawn from 157 looks like a collapse.
    charts = charts_of(write_inputs(tmp_path))
    for name in ("throughput_vs_concurrency_pp512", "chunk_sweep_pp512+tg32_c2"):
        ax = plots.draw(charts[name]).axes[0]
        top = max(y for s in charts[name].panels[0].series for y in s.y)
        assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= top > 100


def test_error_bars_say_their_n(tmp_path):
    charts = charts_of(write_inputs(tmp_path))
    panel = charts["throughput_vs_concurrency_pp512"].panels[0]
    assert panel.get("sequential").n == [3, 3, 3]
    ax = plots.draw(charts["throughput_vs_concurrency_pp512"]).axes[0]
    assert any("95% CI, n=3 repetitions" in t.get_text() for t in ax.texts)


def test_a_strategy_is_one_hue_and_its_chunk_sizes_shades_of_it(tmp_path):
    from matplotlib.colors import rgb_to_hsv

    chart = charts_of(write_inputs(tmp_path))["throughput_vs_concurrency_pp512"]
    ax = plots.draw(chart).axes[0]
    colours = {line.get_label(): rgb_to_hsv(line.get_color()[:3]) for line in ax.get_lines() if not line.get_label().startswith("_")}

    def apart(a: float, b: float) -> float:  # hue is an angle: red sits at both 0 and 1
        return min(abs(a - b), 1 - abs(a - b))

    chunked = [colours[f"chunked ({n})"] for n in SIZES]
    assert all(apart(c[0], chunked[0][0]) < 0.05 for c in chunked)  # one family
    assert len({round(c[2], 2) for c in chunked}) == 3  # three shades of it
    assert all(apart(colours[s][0], chunked[0][0]) > 0.05 for s in ("sequential", "padded"))  # other families


def test_pngs_are_readable_by_others(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        charts = plots.plot_files([str(write_inputs(tmp_path, with_trace=False))], tmp_path / "out")
    finally:
        os.umask(old)
    assert charts and all(c.path.stat().st_mode & 0o777 == 0o644 for c in charts)


def test_a_prompt_only_run_gets_its_ttft_vs_concurrency_chart(tmp_path):
    chart = charts_of(write_inputs(tmp_path))["ttft_vs_concurrency_pp512"]
    p50, p99 = chart.panels
    assert p50.ylabel == "TTFT p50 (ms)" and p99.ylabel == "TTFT p99 (ms)"
    assert p50.get("sequential").x == [1, 2, 4] and p99.get("chunked (64)").y == [2.0, 2.0, 2.0]
    assert "ttft_vs_concurrency_pp512+tg32" not in charts_of(write_inputs(tmp_path))

"""`prefillbench plot FILE... [--out DIR]`: PNG charts from exported results and per-request traces.

Charts, one per file, named for what they show:

- throughput_vs_concurrency_<test>.png: throughput against requests in flight, one line per strategy;
- chunk_sweep_<test>_c<N>.png: throughput and TBT p99 against chunk size (when a run swept
  --chunk-size), with the other strategies as flat reference lines;
- ttft_cdf_<test>_c<N>.png and tbt_cdf_<test>_c<N>.png: the distribution of time to first
  token and of time between tokens, one line per strategy, from the per-request trace;
- latency_vs_load_<test>.png: P99 TBT and P99 TTFT against the offered request rate (a
  `run --arrival poisson --rate ...` sweep), one line per strategy, with the SLO as a dashed line;
- capacity_<test>.png: the capacity each strategy reached (`prefillbench capacity`), as bars;
- ttft_vs_concurrency_<test>.png: TTFT p50 and p99 against requests in flight for a prompt-only
  test: the latency side of batching prompts (the mistral.rs discussion's chart).

How they are drawn, the same on every backend: throughput and capacity axes
start at zero (a 157-173 t/s range must not look like a collapse); error bars
are 95% intervals with their n (repetitions) written beside them; a strategy is
one hue family (plot_style.py) and its chunk sizes are shades of it; latency
distributions are on a log axis, always, so the same chart compares across
backends; files get the mode any new file would (0644 under the usual umask).

The functions build `Chart`s (the series, as data) first and draw them second,
so tests check the series, and that the drawn lines carry them, not pixels.
"""
from __future__ import annotations

import io
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from prefillbench.report.exports import Results, load_results, read_text
from prefillbench.bench.metrics import SLO, strategy_label
from prefillbench.report.plot_style import palette
from prefillbench.writers import write_atomic
from prefillbench.report.traces import Trace, is_trace_record, load_traces, parse_traces

DEFAULT_OUT = "results/plots"


@dataclass
class Series:
    label: str
    x: list[float]
    y: list[float]
    err: list[float] | None = None  # half-width of the 95% CI, where known
    style: str = "line"  # line | reference (flat) | step (CDF) | bar | scatter (one point a gap)
    n: list[int] | None = None  # repetitions behind each point's interval
    hue: tuple[str, int | None] | None = None  # (strategy, chunk size): its colour family and shade


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    xlog2: bool = False
    xlog: bool = False  # latencies: a log axis
    ylog: bool = False
    ymin0: bool = False  # amounts (throughput, capacity): the axis starts at zero

    def get(self, label: str) -> Series:
        for s in self.series:
            if s.label == label:
                return s
        raise KeyError(label)

    @property
    def labels(self) -> list[str]:
        return [s.label for s in self.series]


@dataclass
class Chart:
    name: str  # file name, without .png
    title: str
    panels: list[Panel]
    path: Path | None = None  # set once written


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9+._-]+", "_", text).strip("_")


def _test_order(test: str) -> tuple:
    nums = [int(n) for n in re.findall(r"\d+", test)]
    kind = 0 if test.startswith("pp") and "+" not in test else 1 if test.startswith("tg") else 2
    return (kind, nums, test)


def _frame(results: list[Results]) -> pd.DataFrame:
    """Every file's rows in one frame, with `source`: the prefix their series carry (the file's name
    when several files are plotted, model and backend when a file has several) and `label`: the
    strategy and its chunk size."""
    parts = []
    for n, res in enumerate(results):
        frame = res.frame
        name = Path(res.path).stem if len(results) > 1 else ""
        combo = frame["model"] + " " + frame["backend"]
        source = ((f"{name}: " if name else "") + combo) if combo.nunique() > 1 else name
        chunk = frame["chunk_size"].astype("Int64").astype(str)
        label = frame["strategy"].where(~(frame["chunk_size"] > 0), frame["strategy"] + " (" + chunk + ")")
        parts.append(frame.assign(file=n, source=source, label=label))
    return pd.concat(parts, ignore_index=True).sort_values(["file", "source"], kind="stable")


def _label(prefix: str, text: str) -> str:
    return f"{prefix}: {text}" if prefix else text


def _subject(combos: set[tuple[str, str]]) -> str:
    """The model and backend for a title, when there is one of each."""
    if len(combos) != 1:
        return ""
    ((model, backend),) = combos
    return f"\n{model}, {backend}"


def _finite(v: float) -> bool:
    return v is not None and not math.isnan(v)


def _closed_loop(frame: pd.DataFrame) -> pd.DataFrame:
    """Only the closed-loop rows: concurrency and chunk size are their axes; open-loop rows have a rate."""
    return frame[frame["rate"].isna() & frame["capacity_rps"].isna()]


def _combos(frame: pd.DataFrame) -> set[tuple[str, str]]:
    return set(zip(frame["model"], frame["backend"]))


def _cis(rows: pd.DataFrame) -> list[float]:
    return rows["throughput_ci95"].fillna(0.0).tolist()


def _hue(rows: pd.DataFrame) -> tuple[str, int | None]:
    first = rows.iloc[0]
    return first["strategy"], None if pd.isna(first["chunk_size"]) else int(first["chunk_size"])


def _line(label: str, rows: pd.DataFrame, x: str, y: str, err: bool = False) -> Series:
    """A series of a strategy's rows: its hue, and its intervals and their n where asked."""
    return Series(label, rows[x].tolist(), rows[y].tolist(), _cis(rows) if err else None,
                  n=rows["repetitions"].astype(int).tolist() if err else None, hue=_hue(rows))


def throughput_charts(results: list[Results]) -> list[Chart]:
    """Per test: throughput against concurrency, a line per strategy (and chunk size)."""
    frame = _closed_loop(_frame(results))
    charts = []
    for test in sorted(frame["test"].unique(), key=_test_order):
        rows = frame[frame["test"] == test]
        panel = Panel(f"{test}", "concurrency (requests in flight)", "throughput (tokens/s)", ymin0=True)
        for (source, label), line in rows.groupby(["source", "label"], sort=False):
            line = line.sort_values("concurrency", kind="stable")
            panel.series.append(_line(_label(source, label), line, "concurrency", "throughput", err=True))
        charts.append(Chart(f"throughput_vs_concurrency_{_slug(test)}", f"Throughput vs concurrency, {test}{_subject(_combos(rows))}", [panel]))
    return charts


def chunk_sweep_charts(results: list[Results]) -> list[Chart]:
    """Per test and concurrency swept over two or more chunk sizes: throughput and TBT p99 against chunk size."""
    frame = _closed_loop(_frame(results))
    cases = sorted(frame.groupby(["test", "concurrency"], sort=False), key=lambda kv: (_test_order(kv[0][0]), kv[0][1]))
    charts = []
    for (test, conc), case in cases:
        sizes = sorted(case["chunk_size"][case["chunk_size"] > 0].unique())
        if len(sizes) < 2:
            continue
        ends = [int(sizes[0]), int(sizes[-1])]
        tput = Panel("throughput", "chunk size (tokens)", "throughput (tokens/s)", xlog2=True, ymin0=True)
        tbt = Panel("TBT p99", "chunk size (tokens)", "TBT p99 (ms)", xlog2=True)
        for source, rows in case.groupby("source", sort=False):
            swept = rows["chunk_size"] > 0
            for strategy, line in rows[swept].groupby("strategy", sort=False):
                line = line.sort_values("chunk_size", kind="stable")
                xs = line["chunk_size"].astype(int).tolist()
                tput.series.append(Series(_label(source, strategy), xs, line["throughput"].tolist(), _cis(line),
                                          n=line["repetitions"].astype(int).tolist(), hue=(strategy, None)))
                tbt.series.append(Series(_label(source, strategy), xs, line["tbt_p99_ms"].tolist(), hue=(strategy, None)))
            for r in rows[~swept].itertuples():
                hue = (r.strategy, None)
                tput.series.append(Series(_label(source, r.strategy), ends, [r.throughput] * 2, style="reference", hue=hue))
                tbt.series.append(Series(_label(source, r.strategy), ends, [r.tbt_p99_ms] * 2, style="reference", hue=hue))
        panels = [tput]
        if any(_finite(v) for s in tbt.series for v in s.y):  # pp tests emit one token: no TBT
            panels.append(tbt)
        charts.append(Chart(f"chunk_sweep_{_slug(test)}_c{conc}", f"Chunk-size sweep, {test}, concurrency {conc}{_subject(_combos(case))}", panels))
    return charts


def _slo_ms(slos: pd.Series, key: str) -> float | None:
    """The rows' SLO for `key` (ttft, tbt), if they share one."""
    values = {getattr(SLO.parse(slo), f"{key}_ms") for slo in slos if slo}
    return values.pop() if len(values) == 1 else None


def load_charts(results: list[Results]) -> list[Chart]:
    """Per test of an open-loop rate sweep: P99 TBT and P99 TTFT against the offered rate, with the SLO line."""
    frame = _frame(results)
    swept = frame[frame["rate"].notna()]
    swept = swept.assign(label=swept["label"] + swept["concurrency"].map(lambda c: f" c<={c}" if c else ""))
    charts = []
    for test in sorted(swept["test"].unique(), key=_test_order):
        rows = swept[swept["test"] == test]
        rates = sorted(rows["rate"].unique().tolist())
        if len(rates) < 2:
            continue
        panels = []
        for metric, key, title in (("tbt_p99_ms", "tbt", "P99 TBT"), ("ttft_p99_ms", "ttft", "P99 TTFT")):
            panel = Panel(title, "offered load (requests/s)", f"{title} (ms)")
            for (source, label), line in rows.groupby(["source", "label"], sort=False):
                line = line.sort_values("rate", kind="stable")
                panel.series.append(_line(_label(source, label), line, "rate", metric))
            slo = _slo_ms(rows["slo"], key)
            if slo is not None:
                panel.series.append(Series(f"SLO {slo:g} ms", [rates[0], rates[-1]], [slo, slo], style="reference"))
            panel.xlog = rates[-1] / rates[0] > 20
            panels.append(panel)
        charts.append(Chart(f"latency_vs_load_{_slug(test)}", f"Latency vs offered load, {test}{_subject(_combos(rows))}", panels))
    return charts


def capacity_charts(results: list[Results]) -> list[Chart]:
    """Per test of a `capacity` export: each strategy's capacity as a bar."""
    frame = _frame(results)
    found = frame[frame["capacity_rps"].notna()]
    charts = []
    for test in sorted(found["test"].unique(), key=_test_order):
        rows = found[found["test"] == test]
        panel = Panel("capacity", "", "capacity (requests/s)", ymin0=True)
        for r in rows.itertuples():
            hue = (r.strategy, None if pd.isna(r.chunk_size) else int(r.chunk_size))
            panel.series.append(Series(_label(r.source, r.label), [0], [r.capacity_rps], style="bar", hue=hue))
        slo = _slo_ms(rows["slo"], "tbt")
        title = f"Capacity, {test}" + (f", P99 TBT <= {slo:g} ms" if slo is not None else "")
        charts.append(Chart(f"capacity_{_slug(test)}", title + _subject(_combos(rows)), [panel]))
    return charts


def ttft_charts(results: list[Results]) -> list[Chart]:
    """Per prompt-only test at two or more concurrencies: TTFT p50 and p99 against concurrency, a line per strategy.

    Throughput alone says whether batching prompts pays; this says what each request waits for it."""
    frame = _closed_loop(_frame(results))
    prompt_only = frame[(frame["n_gen"] == 0) & (frame["n_prompt"] > 0)]
    charts = []
    for test in sorted(prompt_only["test"].unique(), key=_test_order):
        rows = prompt_only[prompt_only["test"] == test]
        if rows["concurrency"].nunique() < 2:
            continue
        panels = []
        for metric, title in (("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99")):
            panel = Panel(title, "concurrency (requests in flight)", f"{title} (ms)", ymin0=True)
            for (source, label), line in rows.groupby(["source", "label"], sort=False):
                panel.series.append(_line(_label(source, label), line.sort_values("concurrency", kind="stable"), "concurrency", metric))
            panels.append(panel)
        charts.append(Chart(f"ttft_vs_concurrency_{_slug(test)}", f"Time to first token vs concurrency, {test}{_subject(_combos(rows))}", panels))
    return charts


def cdf(values: list[float]) -> tuple[list[float], list[float]]:
    """Sorted values and the fraction of values at or below each."""
    xs = sorted(values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def cdf_charts(trace_sets: list[tuple[str, list[Trace]]]) -> list[Chart]:
    """Per test, concurrency and arrival rate: TTFT and TBT CDFs, a line per strategy."""
    prefixed = [(Path(path).stem.removesuffix(".requests") if len(trace_sets) > 1 else "", t) for path, traces in trace_sets for t in traces]
    cases = sorted({(t.test, t.concurrency, t.rate) for _, t in prefixed},
                   key=lambda k: (_test_order(k[0]), k[1], k[2] or 0.0))
    combos = {(t.model, t.backend) for _, t in prefixed}
    charts = []
    for test, conc, rate in cases:
        groups: dict[str, list[Trace]] = defaultdict(list)
        hues: dict[str, tuple[str, int | None]] = {}
        for prefix, t in prefixed:
            if t.test == test and t.concurrency == conc and t.rate == rate:
                label = strategy_label(t.strategy, t.chunk_size)
                if len(combos) > 1:
                    label = f"{t.model} {t.backend} {label}"
                groups[_label(prefix, label)].append(t)
                hues[_label(prefix, label)] = (t.strategy, t.chunk_size)
        members = [t for ts in groups.values() for t in ts]
        ttft = Panel("TTFT", "time to first token (ms)", "fraction of requests")
        tbt = Panel("TBT", "time between tokens (ms)", "fraction of tokens")
        for label, ts in groups.items():
            ttft.series.append(Series(label, *cdf([t.ttft_ms for t in ts]), style="step", hue=hues[label]))
            gaps = [g for t in ts for g in t.tbts_ms]
            if gaps:
                tbt.series.append(Series(label, *cdf(gaps), style="step", hue=hues[label]))
        for panel in (ttft, tbt):
            # One scale for a latency distribution whatever the backend: log (gguf's spans 2x, the sim's 100x).
            panel.xlog = all(x > 0 for s in panel.series for x in s.x)
        subject = _subject({(t.model, t.backend) for t in members})
        name, where = f"{_slug(test)}_c{conc}", f"{test}, concurrency {conc}"
        if rate is not None:  # an open loop: one chart per rate
            name, where = f"{name}_r{rate:g}", f"{where if conc else test}, {rate:g} req/s"
        charts.append(Chart(f"ttft_cdf_{name}", f"TTFT distribution, {where}{subject}", [ttft]))
        if tbt.series:
            charts.append(Chart(f"tbt_cdf_{name}", f"TBT distribution, {where}{subject}", [tbt]))
    return charts


def stall_charts(trace_sets: list[tuple[str, list[Trace]]]) -> list[Chart]:
    """Per test, concurrency and rate, where the steps were known: every gap between two tokens against the
    prompt tokens computed while it lasted (bench/stalls.py), a colour per strategy. Decode-only gaps sit at 0;
    a chunked budget caps the x of every point, sequential's reach whole prompts."""
    traces = [t for _, ts in trace_sets for t in ts if t.gap_prompt_tokens is not None]
    charts = []
    for test, conc, rate in sorted({(t.test, t.concurrency, t.rate) for t in traces},
                                   key=lambda k: (_test_order(k[0]), k[1], k[2] or 0.0)):
        panel = Panel("stalls", "prompt tokens computed during the gap", "time between tokens (ms)")
        members = [t for t in traces if (t.test, t.concurrency, t.rate) == (test, conc, rate)]
        for hue in dict.fromkeys((t.strategy, t.chunk_size) for t in members):
            ts = [t for t in members if (t.strategy, t.chunk_size) == hue]
            x = [n for t in ts for n in t.gap_prompt_tokens]
            if x:
                panel.series.append(Series(strategy_label(*hue), x, [g for t in ts for g in t.tbts_ms],
                                           style="scatter", hue=hue))
        if not panel.series:
            continue
        panel.ylog = all(y > 0 for s in panel.series for y in s.y)
        name, where = f"{_slug(test)}_c{conc}", f"{test}, concurrency {conc}"
        if rate is not None:
            name, where = f"{name}_r{rate:g}", f"{where if conc else test}, {rate:g} req/s"
        charts.append(Chart(f"tbt_stalls_{name}", f"Which prefill each decode waited behind, {where}"
                            f"{_subject({(t.model, t.backend) for t in members})}", [panel]))
    return charts


def draw(chart: Chart):
    """A matplotlib Figure for the chart (no pyplot, no display needed)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4 * len(chart.panels), 4.8), layout="constrained")
    axes = fig.subplots(1, len(chart.panels), squeeze=False)[0]
    hues = [s.hue for p in chart.panels for s in p.series if s.hue is not None]
    colours = palette(hues)

    def colour(s: Series, i: int) -> Any:
        return colours[s.hue] if s.hue in colours else f"C{i}"

    for ax, panel in zip(axes, chart.panels):
        bars = [s for s in panel.series if s.style == "bar"]
        if bars:
            positions = range(len(bars))
            ax.bar(positions, [s.y[0] for s in bars], color=[colour(s, i) for i, s in zip(positions, bars)])
            ax.set_xticks(list(positions), [s.label for s in bars], rotation=20, ha="right")
            for i, s in enumerate(bars):
                ax.annotate(f"{s.y[0]:.3g}", (i, s.y[0]), ha="center", va="bottom", fontsize="small")
            ax.set_ylabel(panel.ylabel)
            ax.set_ylim(bottom=0)
            ax.grid(True, axis="y", alpha=0.3)
            continue
        ns: set[int] = set()
        for i, s in enumerate(panel.series):
            c = colour(s, i)
            if s.style == "step":
                ax.step(s.x, s.y, where="post", label=s.label, color=c)
            elif s.style == "scatter":
                ax.scatter(s.x, s.y, s=6, alpha=0.4, label=s.label, color=c, linewidths=0)
            elif s.style == "reference":
                ax.plot(s.x, s.y, linestyle="--", linewidth=1, label=s.label, color=c)
            else:
                ax.plot(s.x, s.y, marker="o", label=s.label, color=c)
                if s.err and any(e > 0 for e in s.err):
                    ax.errorbar(s.x, s.y, yerr=s.err, fmt="none", ecolor=c, capsize=3)
                    ns.update(s.n or [])
        if ns:
            n = f"{min(ns)}" if len(ns) == 1 else f"{min(ns)}-{max(ns)}"
            ax.annotate(f"error bars: 95% CI, n={n} repetitions", (0.99, 0.01), xycoords="axes fraction",
                        ha="right", va="bottom", fontsize="small", color="0.35")
        if panel.xlog2:
            ax.set_xscale("log", base=2)
            ticks = sorted({x for s in panel.series if s.style != "reference" for x in s.x})
            ax.set_xticks(ticks, [str(int(t)) for t in ticks])
            ax.minorticks_off()
        elif panel.xlog:
            ax.set_xscale("log")
        elif (all(float(x).is_integer() for s in panel.series for x in s.x) and panel.series
              and panel.series[0].style not in ("step", "scatter")):
            ticks = sorted({x for s in panel.series for x in s.x})
            ax.set_xticks(ticks, [str(int(t)) for t in ticks])
        if panel.series and panel.series[0].style == "step":
            ax.set_ylim(0, 1.02)
        if panel.ylog:
            ax.set_yscale("log")
        if panel.ymin0:
            ax.set_ylim(bottom=0)
        ax.set_title(panel.title if len(chart.panels) > 1 else "")
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        if panel.series:
            ax.legend(fontsize="small")
    fig.suptitle(chart.title, fontsize="medium")
    return fig


def save(chart: Chart, out_dir: str | Path) -> Path:
    path = Path(out_dir) / f"{chart.name}.png"
    png = io.BytesIO()
    draw(chart).savefig(png, format="png", dpi=110)
    write_atomic(path, png.getvalue())  # the mode any new file gets, not mkstemp's 0600
    chart.path = path
    return path


def _is_trace_file(path: str, text: str) -> bool:
    import json

    if Path(path).suffix.lower() not in (".jsonl", ".ndjson"):
        return False
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        return is_trace_record(json.loads(first))
    except json.JSONDecodeError:
        return path.endswith(".requests.jsonl")


def trace_beside(path: str | Path) -> Path:
    """Where `run` puts the per-request trace of an export: X.requests.jsonl beside X.csv/.json/.jsonl."""
    p = Path(path)
    return p.with_name(f"{p.stem}.requests.jsonl")


def load_inputs(paths: list[str]) -> tuple[list[Results], list[tuple[str, list[Trace]]]]:
    """Result exports and per-request traces among the files; a trace beside an export is found by name."""
    results: list[Results] = []
    traces: list[tuple[str, list[Trace]]] = []
    seen: set[Path] = set()
    for path in paths:
        text = read_text(path)
        seen.add(Path(path).resolve())
        if _is_trace_file(path, text):
            traces.append((path, parse_traces(path, text)))
        else:
            results.append(load_results(path))
    for res in list(results):
        beside = trace_beside(res.path)
        if beside.is_file() and beside.resolve() not in seen:
            seen.add(beside.resolve())
            traces.append((str(beside), load_traces(str(beside))))
    return results, traces


def make_charts(results: list[Results], traces: list[tuple[str, list[Trace]]]) -> list[Chart]:
    charts: list[Chart] = []
    if results:
        charts += throughput_charts(results)
        charts += chunk_sweep_charts(results)
        charts += load_charts(results)
        charts += capacity_charts(results)
        charts += ttft_charts(results)
    if traces:
        charts += cdf_charts(traces)
        charts += stall_charts(traces)
    return charts


def plot_files(paths: list[str], out_dir: str | Path = DEFAULT_OUT) -> list[Chart]:
    """Read the files, build every chart that they support, and write each as PNG."""
    results, traces = load_inputs(paths)
    charts = make_charts(results, traces)
    for chart in charts:
        save(chart, out_dir)
    return charts

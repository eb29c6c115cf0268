"""The verdict under a table that compares strategies: each strategy against a reference, in sentences.

Per test and load, a strategy's row is divided by the reference strategy's row
(the matching of `--relative-to`): throughput, TTFT p50 and p99, TBT p99 (and
goodput under an SLO). A ratio is a tie when its 95% interval includes 1, or
when it lies within MIN_EFFECT of 1: a few percent is no finding on a shared
machine. Only what is not a tie becomes a claim.

The interval of a ratio a/b comes from the rows' spread across repetitions:
its relative half-width is sqrt(ha² + hb²), each h a row's 95% CI half-width
over its mean. Throughput and t/s carry their own CI; a latency percentile is
pooled over every request of every repetition and carries none, so it borrows
its row's throughput spread, the run-to-run variation of the same repetitions.
With one repetition there is no spread: the sentence says the ratios are
unreplicated and only MIN_EFFECT separates a finding from a tie.

Each strategy gets one sentence in the manner of the discussion that started
this project ("padded parallel prefill only pays below ~128 tokens"): e.g.
"padded: throughput a tie everywhere (0.95-1.08x); TTFT p50 worse, up to 1.52x
(pp64 c=4)".
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass

from prefillbench.bench.engine_columns import memory_note
from prefillbench.bench.metrics import AS_SERVED, ResultRow, higher_is_better, results_frame, strategy_label
from prefillbench.report.relative import ratio, reference_values
from prefillbench.report.tables import TABLE_FORMATS

# metric -> its name in a sentence
VERDICT_METRICS = {
    "throughput": "throughput",
    "ttft_p50_ms": "TTFT p50",
    "ttft_p99_ms": "TTFT p99",
    "tbt_p99_ms": "TBT p99",
    "goodput_rps": "goodput",
}
MIN_EFFECT = 0.05  # a ratio within 5% of 1 is a tie whatever its interval
DEFAULT_REFERENCE = "sequential"
# Places named where a claim holds, at most; the rest are counted.
MAX_PLACES = 3


@dataclass(frozen=True)
class Ratio:
    """One metric of one row over its reference row's, and the 95% interval of that ratio."""

    metric: str
    value: float
    low: float
    high: float
    replicated: bool  # both rows had two or more repetitions

    @property
    def tie(self) -> bool:
        return abs(self.value - 1.0) < MIN_EFFECT or self.low <= 1.0 <= self.high

    @property
    def better(self) -> bool:
        return not self.tie and (self.value > 1.0) == higher_is_better(self.metric)

    @property
    def worse(self) -> bool:
        return not self.tie and not self.better


@dataclass(frozen=True)
class CaseRatios:
    """A strategy's ratios on one test and load."""

    strategy: str  # its label: 'chunked (256)'
    test: str
    load: str  # 'c=4', 'poisson 2/s', 'poisson 2/s c<=4'
    ratios: dict[str, Ratio]
    #: Where the row's TBT p99 went (bench/stalls.py): '96% of it in steps computing 512 prompt tokens'; '' unknown.
    stall: str = ""

    @property
    def where(self) -> str:
        return f"{self.test} {self.load}"


def load_label(row: ResultRow) -> str:
    if row.arrival in ("closed", ""):
        return f"c={row.concurrency}"
    load = row.arrival + (f" {row.rate:g}/s" if row.rate is not None else "")
    return load + (f" c<={row.concurrency}" if row.concurrency else "")


def default_reference(strategies: list[str]) -> str:
    """sequential where it ran, else the first strategy."""
    return DEFAULT_REFERENCE if DEFAULT_REFERENCE in strategies else strategies[0]


def case_ratios(rows: list[ResultRow], reference: str) -> list[CaseRatios]:
    """Every non-reference row that has a reference row, with its ratios."""
    if not rows:
        return []
    frame = results_frame(rows)
    metrics = [m for m in VERDICT_METRICS if m != "goodput_rps" or frame[m].notna().any()]
    ref = reference_values(frame, reference, [*metrics, "throughput_ci95", "repetitions"])
    own_h = ratio(frame["throughput_ci95"], frame["throughput"])
    ref_h = ratio(ref["throughput_ci95"], ref["throughput"])
    half = (own_h**2 + ref_h**2) ** 0.5
    replicated = (frame["repetitions"] > 1) & (ref["repetitions"] > 1) & half.notna()
    out = []
    for i, row in enumerate(rows):
        idx = frame.index[i]
        if row.strategy == reference or not ref["has_ref"][idx]:
            continue
        ratios = {}
        for m in metrics:
            value = float(ratio(frame[m][idx], ref[m][idx]))
            if math.isnan(value):
                continue  # the figure does not apply (TBT of a prompt-only test) or the reference is 0
            h = float(half[idx]) if replicated[idx] else 0.0
            ratios[m] = Ratio(m, value, value * math.exp(-h), value * math.exp(h), bool(replicated[idx]))
        if ratios:
            out.append(CaseRatios(strategy_label(row.strategy, row.chunk_size), row.test, load_label(row), ratios,
                                  stall_phrase(row)))
    return out


def stall_phrase(row: ResultRow) -> str:
    """Where a row's TBT p99 went: the share of it in steps that computed prompt tokens, and how many."""
    p99, behind = row.tbt_p99_ms, row.tbt_p99_behind_prefill_ms
    if math.isnan(behind) or not p99 > 0:
        return ""
    if behind < 0.005 * p99:
        return "none of it behind a prefill"
    return f"{100 * behind / p99:.0f}% of it in steps computing {row.tbt_p99_prefill_tokens:.0f} prompt tokens"


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return _x(lo) if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"


def _loads(loads: list[str]) -> str:
    """'c=2', 'c=4' -> 'c=2,4'; 'poisson 2/s', 'poisson 4/s' -> 'poisson 2,4/s'; else as they are."""
    parts = [re.fullmatch(r"(c=|\w+ )([^ /]+)(/s)?", load) for load in loads]
    if all(parts) and len({(p.group(1), p.group(3)) for p in parts}) == 1:
        return parts[0].group(1) + ",".join(p.group(2) for p in parts) + (parts[0].group(3) or "")
    return ", ".join(loads)


def _places(cases: list[CaseRatios]) -> str:
    """Where a claim holds, by test: 'pp64 c=2,4; pp128 c=4' (at most MAX_PLACES tests, the rest counted)."""
    by_test: dict[str, list[str]] = {}
    for c in cases:
        by_test.setdefault(c.test, []).append(c.load)
    names = [f"{test} {_loads(loads)}" for test, loads in list(by_test.items())[:MAX_PLACES]]
    more = len(by_test) - len(names)
    return "; ".join(names) + (f"; {more} more test(s)" if more else "")


def metric_clause(metric: str, cases: list[CaseRatios], everywhere: str, places: bool = True) -> str | None:
    """What one metric says across a strategy's cases: None where it is a tie in every one of them.

    Without `places` (one test and load in the whole run, named in the heading) no place is named."""
    have = [c for c in cases if metric in c.ratios]
    if not have:
        return None
    name = VERDICT_METRICS[metric]
    values = [c.ratios[metric].value for c in have]
    better = [c for c in have if c.ratios[metric].better]
    worse = [c for c in have if c.ratios[metric].worse]
    if not better and not worse:
        return f"{name} a tie{everywhere if places else ''} ({_span(values)})" if metric == "throughput" else None
    higher = higher_is_better(metric)
    words = ("higher", "lower") if higher else ("better", "worse")
    parts = []
    for group, word in ((better, words[0]), (worse, words[1])):
        if not group:
            continue
        # The extreme on the group's side: the highest of throughput gains and of latency losses.
        pick = max if (group is better) == higher else min
        top = pick(group, key=lambda c: c.ratios[metric].value)
        extreme = top.ratios[metric].value
        # a TBT p99 says what it waited behind (stall_phrase): the figure a user argues interference with
        why = f", {top.stall}" if metric == "tbt_p99_ms" and top.stall else ""
        if not places:
            parts.append(f"{name} {word} ({_x(extreme)}{why})")
        elif len(group) == 1:
            parts.append(f"{name} {word} at {top.where} ({_x(extreme)}{why})")
        else:
            direction = "up to" if extreme > 1 else "down to"
            parts.append(f"{name} {word} at {_places(group)} ({direction} {_x(extreme)} at {top.where}{why})")
    rest = [c.ratios[metric].value for c in have if c.ratios[metric].tie]
    if rest and metric == "throughput":
        parts.append(f"a tie elsewhere ({_span(rest)})")
    return "; ".join(parts)


def strategy_sentence(strategy: str, cases: list[CaseRatios], places: bool = True) -> str:
    everywhere = " at every test and load here" if len(cases) > 1 else f" at {cases[0].where}"
    metrics = list(dict.fromkeys(m for c in cases for m in c.ratios))
    clauses = [text for m in metrics if (text := metric_clause(m, cases, everywhere, places))]
    latency = [m for m in metrics if not higher_is_better(m)]
    if latency and not any(metric_clause(m, cases, everywhere) for m in latency):
        clauses.append("latency a tie")
    return f"{strategy}: {'; '.join(clauses)}"


def verdict_lines(rows: list[ResultRow], reference: str) -> list[str]:
    """One sentence per strategy other than the reference, in the order they ran."""
    cases = case_ratios(rows, reference)
    places = len({c.where for c in cases}) > 1
    by_strategy: dict[str, list[CaseRatios]] = {}
    for case in cases:
        by_strategy.setdefault(case.strategy, []).append(case)
    return [strategy_sentence(s, group, places) for s, group in by_strategy.items()]


def _clock_gaps(row: ResultRow) -> list[tuple[str, float, float, float]]:
    """(figure, client, engine, allowance) where the engine's clock and the client's differ by more than the network
    explains. The allowance is two of the round trips measured beside the run (engine_net_ms, the slowest of five)
    for each request in flight: a TTFT holds one request in and one event out, each way at most a round trip; a gap
    between two events keeps at most the variation of their shared delay, the same bound; and either may wait
    behind the other requests' events in the client's one event loop. A p50 from a
    histogram is known only to its bucket: the client's p50 must lie within the bucket's bounds, widened by the
    allowance. That p50 is the client's by the histogram's own rank rule (the sample at rank count/2, which the
    bucket holds), not the interpolated one: with four requests those two differ by a quarter of their spread."""
    # Each way (the request in, an event out) takes at most the slowest round trip measured, so a figure is allowed
    # two; and the client's one event loop (and the server's) serves every request in flight, so a request's event
    # may wait behind each of the others': two round trips for each request in flight.
    net = 2 * (0.0 if math.isnan(row.engine_net_ms) else row.engine_net_ms) * max(row.concurrency, 1)
    # vLLM times its gaps in the engine core and its TTFT in the API server: the API server's own time on a
    # request's first token (at most TTFT less queue and prefill) shortens the client's first gap, spread over the
    # request's gaps in a mean.
    other = row.engine_ttft_other_mean_ms
    first = max(other, 0.0) / max(row.n_gen - 1, 1) if not math.isnan(other) else 0.0
    out = []
    checks = [("TTFT mean", row.ttft_mean_ms, row.engine_ttft_mean_ms, row.engine_ttft_mean_ms, net),
              ("ITL mean", row.tbt_mean_ms, row.engine_itl_mean_ms, row.engine_itl_mean_ms, net + first),
              ("TTFT p50", row.ttft_p50_rank_ms, row.engine_ttft_p50_low_ms, row.engine_ttft_p50_high_ms, net),
              ("ITL p50", row.tbt_p50_rank_ms, row.engine_itl_p50_low_ms, row.engine_itl_p50_high_ms, net)]
    for name, client, low, high, allowance in checks:
        if any(math.isnan(v) for v in (client, low, high)):
            continue
        if client < low - allowance or client > high + allowance:
            engine = getattr(row, f"engine_{name.split()[0].lower()}_{name.split()[1]}_ms")
            out.append((name, client, engine, allowance))
    return out


def clock_line(rows: list[ResultRow]) -> str:
    """One line where a server's own clock and the client's disagree by more than the network explains; empty
    where they agree or no row has the engine's clock."""
    found = [(r, gap) for r in rows if r.engine_clock for gap in _clock_gaps(r)]
    # vLLM counts every request it served between the scrapes: more than were sent is other clients' traffic (a
    # --url shared with others), in its figures and not in the client's
    crowded = [r for r in rows if r.engine_clock.startswith("vllm") and r.engine_requests > r.requests * r.repetitions]
    if crowded and not found:
        r = crowded[0]
        return (f"- engine clock: the server counted {r.engine_requests:.0f} requests at {r.test} {load_label(r)}, "
                f"{r.requests * r.repetitions} sent from here: other clients' requests are in its figures\n")
    if not found:
        return ""
    row, (name, client, engine, allowance) = max(found, key=lambda f: abs(f[1][1] - f[1][2]))
    where = len({id(r) for r, _ in found})
    more = f"; {where - 1} more row(s) too" if where > 1 else ""
    bucket = ", beyond its histogram bucket" if "p50" in name and "per-token" not in row.engine_clock else ""
    return (f"- engine clock: the server's own clock and the client's disagree by more than the network explains "
            f"(a busy client machine, or an engine clock that is not the client's) "
            f"at {row.test} {load_label(row)} ({name}: engine {engine:.1f} ms, client {client:.1f} ms, allowed "
            f"{allowance:.1f} ms: two round trips a request in flight{bucket}){more}\n")


def render_verdict(rows: list[ResultRow], reference: str | None = None) -> str:
    """The verdict as text: a heading and a sentence per strategy, and the engine clock's line where it disagrees
    with the client's; empty when nothing compares and the clocks agree."""
    clocks = client_line(rows) + clock_line(rows) + memory_line(rows)
    compared = _strategy_verdict(rows, reference)
    if clocks and not compared:
        return "\nVerdict:\n" + clocks
    return compared + clocks


def client_line(rows: list[ResultRow]) -> str:
    """One line where the client sent late (bench/client_columns.py): those rows measured the client, not the engine."""
    late = [r for r in rows if r.client_late]
    if not late:
        return ""
    r = max(late, key=lambda r: r.arrival_lag_p99_ms)
    more = f"; {len(late) - 1} more row(s) too" if len(late) > 1 else ""
    return (f"- the client measured itself: {strategy_label(r.strategy, r.chunk_size)} at {r.test} {load_label(r)}: its "
            f"{r.client_late}, with {r.client_workers} worker(s) at {r.client_cpu_pct:.0f}% of a core{more} (those "
            "figures are the client's delay, not the engine's: more --client-workers, or a client machine of its own; "
            "docs/servers.md)\n")


def memory_line(rows: list[ResultRow]) -> str:
    """One line where the KV memory decided rows: which, and how (preempted, or full at its peak)."""
    bound = [(r, note) for r in rows if (note := memory_note(r))]
    if not bound:
        return ""
    r, note = max(bound, key=lambda b: (b[0].preemptions, b[0].kv_peak_pct))
    more = f"; {len(bound) - 1} more row(s) too" if len(bound) > 1 else ""
    return (f"- memory decided: {strategy_label(r.strategy, r.chunk_size)} at {r.test} {load_label(r)}: {note}{more}"
            " (the KV cache bounds what runs at once there: a bigger cache, fewer tokens per request, or another "
            "GPU count changes the answer)\n")


def _strategy_verdict(rows: list[ResultRow], reference: str | None) -> str:
    # Rows of a server measured as it runs (--url) are one configuration, unchanged between them: never compared.
    rows = [r for r in rows if r.strategy != AS_SERVED]
    strategies = list(dict.fromkeys(r.strategy for r in rows))
    if len(strategies) < 2:
        return ""
    reference = reference or default_reference(strategies)
    cases = case_ratios(rows, reference)
    if not cases:
        return ""
    wheres = list(dict.fromkeys(c.where for c in cases))
    at = f" at {wheres[0]}" if len(wheres) == 1 else ""
    head = (f"Verdict against {reference}{at} (each ratio strategy/{reference} on the same test and load; a tie where "
            f"its 95% interval includes 1 or it is within {100 * MIN_EFFECT:g}% of 1)")
    if not all(r.replicated for c in cases for r in c.ratios.values()):
        head += f"; one repetition, so the ratios are unreplicated and only a change beyond {100 * MIN_EFFECT:g}% counts (-r 3 gives intervals)"
    return "\n" + head + ":\n" + "".join(f"- {line}\n" for line in verdict_lines(rows, reference))


def write_verdict(rows: list[ResultRow], reference: str | None, fmt: str) -> None:
    """After a table on stdout, the verdict below it; after csv or json, on stderr, so the data stays clean."""
    text = render_verdict(rows, reference)
    if text:
        out = sys.stdout if fmt in TABLE_FORMATS else sys.stderr
        out.write(text)
        out.flush()

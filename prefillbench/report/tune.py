"""tune's output: the ranked table, the verdict line, capacity against the SLO, and the exports."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from prefillbench.bench.capacity import Criteria
from prefillbench.bench.metrics import host_label, strategy_label
from prefillbench.bench.pricing import STEP_KINDS
from prefillbench.bench.sim_first import (EDGE_SLOWDOWN, Comparison, at_the_edge, capacity_change, compare_stages,
                                          margin_picks, margin_ranked, order_differs, probe_speeds)
from prefillbench.bench.tune import Config, ConfigResult, by_criteria, ranked
from prefillbench.report.adaptive import win_text
from prefillbench.report.capacity import capacity_text
from prefillbench.report.tables import fmt_number, md_table
from prefillbench.writers import RECORD_FORMATS, format_for_path, write_export
from strategies.compose import parse as parse_parts


def _interval(r: ConfigResult) -> str:
    high = "inf" if math.isinf(r.high) else f"{r.high:.3g}"
    return f"[{r.low:.3g}, {high})"


def _ratio(r: ConfigResult, baseline: ConfigResult | None) -> str:
    return f"{r.capacity / baseline.capacity:.2f}x" if baseline is not None and baseline.capacity else "-"


def baseline_of(results: list[ConfigResult], baseline: Config = Config("sequential", None)) -> ConfigResult | None:
    refs = [r for r in results if r.config == baseline]
    return refs[0] if refs else None


def _slowdown(r: ConfigResult) -> str:
    return "-" if math.isnan(r.step_speed) else f"{r.step_speed:.2f}x"


#: Probe speeds further apart than this get a line: the measurement moved with the machine, not only the load.
DRIFT_NOTE = 1.10


def _prediction_columns(by_key: dict, capacity_name: str, error_name: str) -> list:
    """A prediction's capacity and its error against the row's measured interval ('-' where it has none)."""
    def cell(i, text) -> str:
        p = by_key.get((i[1].config, i[1].criteria))
        return text(p, i[1]) if p is not None else "-"

    return [(capacity_name, lambda i: cell(i, lambda p, m: fmt_number(p.capacity, 3)), True),
            (error_name, lambda i: cell(i, lambda p, m: Comparison(p, m).error_text), True)]


def render_ranked(results: list[ConfigResult], tokens_per_request: float,
                  predicted: list[ConfigResult] | None = None, repredicted: list[ConfigResult] | None = None,
                  slower: list[ConfigResult] | None = None, verbose: bool = False,
                  baseline: Config = Config("sequential", None), baseline_name: str = "sequential") -> str:
    """One row per configuration, best first: what a deployer reads (rank with a tie mark, capacity, the sim's
    prediction beside a measurement, ratio to sequential, what limits it, the latencies at capacity). `verbose`
    adds the capacity's interval, tokens/s, the probes, the sim's error; with
    `repredicted`, how long the measured steps took against the sim's price and the sim's capacity at that speed;
    with `slower`, how the sim's capacity changes when every step runs EDGE_SLOWDOWN times as long (and, for the
    sim's own results, the rows in the order of what they keep there: the sim's picks first)."""
    order = _order(results, predicted, slower)
    base = baseline_of(results, baseline)
    pred = {(r.config, r.criteria): r for r in predicted or []}
    repred = {(r.config, r.criteria): r for r in repredicted or []}
    slow = {(r.config, r.criteria): r for r in slower or []}

    def change(r: ConfigResult) -> str:
        key = (r.config, r.criteria)
        p = pred.get(key) or (r if r.stage == "sim" else None)
        moved = capacity_change(p, slow[key]) if key in slow and p is not None else math.nan
        return "-" if math.isnan(moved) else f"{moved:+.0%}"

    best = order[0] if order else None

    def at(r: ConfigResult, field: str, digits: int) -> str:
        p = r.at_capacity
        return fmt_number(getattr(p.row, field), digits) if p is not None else "-"

    columns = [
        ("rank", lambda i: str(i[0] + 1) + ("=" if i[1] is not best and best is not None and i[1].ties(best) else ""), True),
        *(PART_COLUMNS if any(composed(r.config) for r in results) else
          [("configuration", lambda i: strategy_label(i[1].config.strategy, i[1].config.budget), False)]),
        ("capacity req/s", lambda i: capacity_text(i[1].capacity, i[1].hit_bound, interrupted=i[1].interrupted), True),
        ("interval", lambda i: _interval(i[1]), True),
        ("tokens/s", lambda i: fmt_number(i[1].capacity * tokens_per_request, 0), True),
        (f"vs {baseline.label}", lambda i: _ratio(i[1], base), True),
        ("limited by", lambda i: i[1].limited_by or ("search bound" if i[1].hit_bound else "-"), False),
        ("P99 TBT ms", lambda i: at(i[1], "tbt_p99_ms", 1), True),
        ("P99 TTFT ms", lambda i: at(i[1], "ttft_p99_ms", 0), True),
        ("probes", lambda i: str(len(i[1].probes)), True),
    ]
    if any(r.config.kv_host_gib is not None for r in results):  # a grid of host-tier sizes: each row's own
        where = next(i for i, c in enumerate(columns) if c[0] == "capacity req/s")
        columns[where:where] = [("host tier GiB", lambda i: fmt_number(i[1].config.kv_host_gib, 0) if i[1].config.kv_host_gib
                           else "-", True)]
    after = next(i for i, c in enumerate(columns) if c[0] == "capacity req/s") + 1  # the measured capacity's column
    if pred:
        columns[after:after] = _prediction_columns(pred, "sim req/s", "sim error")
    where = after + 2 if pred else after
    if repred:
        columns[where:where] = [("steps vs sim", lambda i: _slowdown(i[1]), True),
                                *_prediction_columns(repred, "sim at that speed", "its error")]
    if slow:
        columns[where:where] = [(f"sim {EDGE_SLOWDOWN - 1:.0%} slower", lambda i: change(i[1]), True)]
    if not verbose:
        columns = [c for c in columns if c[0] in DEPLOYER_COLUMNS or c[0].startswith("vs ")]
    return md_table(columns, list(enumerate(order)))


#: The default table's columns: what a deployer needs; the rest are under --verbose and in the export.
DEPLOYER_COLUMNS = ("rank", "configuration", "rules", "budget", "cadence", "host tier GiB", "capacity req/s", "sim req/s",
                    "vs <the baseline>", "limited by", "P99 TBT ms", "P99 TTFT ms")


def composed(config: Config) -> bool:
    """Whether a configuration names a budget or cadence part (strategies/compose.py): the table then names each."""
    c = parse_parts(config.strategy)
    return c.budget != "fixed" or c.cadence != "every"


def parts_of(config: Config) -> tuple[str, str, str]:
    """Its rules, its budget (a fixed one's size, else its kind) and its cadence, as the table and exports name them."""
    c = parse_parts(config.strategy)
    budget = (str(config.budget) if config.budget else "-") if c.budget == "fixed" else c.budget
    return c.rules, budget, c.cadence


#: The three parts of a scheduler, each in a column of its own, where any row is composed.
PART_COLUMNS = [("rules", lambda i: parts_of(i[1].config)[0], False),
                ("budget", lambda i: parts_of(i[1].config)[1], False),
                ("cadence", lambda i: parts_of(i[1].config)[2], False)]


def part_decided(best: ConfigResult, order: list[ConfigResult]) -> str:
    """Which part decided the best configuration: for each part, the best configuration that differs from it in that
    part alone (same criteria), and the capacity the best has over it; the part with the largest lead decided.
    '' where no configuration differs in one part only."""
    def parts(config: Config) -> tuple:  # the scheduler's three parts and the memory's host tier
        return (*parts_of(config), config.kv_host_gib)

    mine = parts(best.config)
    leads = []
    for k, part in enumerate(("rules", "budget", "cadence", "host tier")):
        rivals = [r for r in order if r is not best and r.criteria == best.criteria
                  and [a == b for a, b in zip(parts(r.config), mine)] == [j != k for j in range(4)]]
        if rivals and rivals[0].capacity:
            leads.append((best.capacity / rivals[0].capacity - 1, part, mine[k], rivals[0]))
    if not leads:
        return ""
    leads = [(x, p, (f"{v:g} GiB" if v else "none") if p == "host tier" else v, r) for x, p, v, r in leads]
    lead, part, value, rival = max(leads, key=lambda x: x[0])
    text = (f"; the {part} decided: {part} {value} has {lead:+.0%} capacity over the best with another {part}, "
            f"{rival.config.label} ({rival.capacity:.3g} req/s)")
    others = [f"the {p} {v} {x:+.0%}" for x, p, v, _ in leads if p != part]
    return text + (f" ({', '.join(others)})" if others else "")


def _order(results: list[ConfigResult], predicted: list[ConfigResult] | None,
           slower: list[ConfigResult] | None) -> list[ConfigResult]:
    """Measurements by capacity; the sim's predictions (no `predicted` beside them) by margin_ranked when slowed."""
    return margin_ranked(results, slower) if slower and not predicted else ranked(results)


def verdict(results: list[ConfigResult], criteria: Criteria, predicted: list[ConfigResult] | None = None,
            repredicted: list[ConfigResult] | None = None, slower: list[ConfigResult] | None = None,
            baseline: Config = Config("sequential", None), baseline_name: str = "sequential") -> str:
    """'best within TBT p99 <= 100 ms: sarathi-serve, budget 512: 5.0 req/s, 2.96x sequential; measured ...'.
    The sim's own results with `slower` name its pick (sim_first.margin_ranked) and what the pick keeps there."""
    order = _order(results, predicted, slower)
    if not order or not order[0].capacity:
        return f"no configuration met {criteria.describe()} at any rate tried"
    best = order[0]
    c = best.config
    name = c.label if composed(c) else c.strategy + (f", budget {c.budget}" if c.budget else "") + host_label(c.kv_host_gib)
    base = baseline_of(results, baseline)
    text = f"best within {criteria.describe()}: {name}: {capacity_text(best.capacity, best.hit_bound, 3)} req/s"
    if base is not None and base is not best and base.capacity:
        text += f", {best.capacity / base.capacity:.2f}x {baseline_name}"
    text += win_text(best, order)  # an adaptive budget's lead over the nearest fixed one
    kept = {(r.config, r.criteria): r for r in slower or []}.get((c, best.criteria)) if not predicted else None
    if kept is not None:
        text += f" ({kept.capacity:.3g} req/s with every step {EDGE_SLOWDOWN - 1:.0%} longer)"
    pred = {(r.config, r.criteria): r for r in predicted or []}
    if (c, best.criteria) in pred and best.stage == "measured":
        p = pred[(c, best.criteria)]
        text += f"; sim predicted {p.capacity:.3g} req/s ({Comparison(p, best).error_text} against the measured interval)"
        again = {(r.config, r.criteria): r for r in repredicted or []}.get((c, best.criteria))
        if again is not None:
            text += (f", {again.capacity:.3g} req/s ({Comparison(again, best).error_text}) at the speed its steps ran "
                     f"({_slowdown(best)} the calibration's step times)")
    ties = [r.config.label for r in order[1:] if r.ties(best)]
    if ties:
        text += f"; a tie (capacity intervals overlap) with {', '.join(ties)}"
    if any(composed(r.config) or r.config.kv_host_gib is not None for r in order):
        # a grid of parts (or of host-tier sizes): which of rules, budget, cadence and host tier decided
        text += part_decided(best, order)
    return text


def stage_notes(predicted: list[ConfigResult], measured: list[ConfigResult],
                repredicted: list[ConfigResult] | None = None) -> list[str]:
    """Predicted against measured: the error per configuration, again at the speed the measured steps ran, and
    whether the measured order differs."""
    comparisons = compare_stages(predicted, measured)
    if not comparisons:
        return []
    lines = ["sim against measurement: " + "; ".join(
        f"{c.measured.config.label} {c.predicted.capacity:.3g} vs {c.measured.capacity:.3g} req/s"
        + (f" ({c.error_text})" if not math.isnan(c.error) else "") for c in comparisons)]
    again = compare_stages(repredicted or [], measured)
    if again:
        lines.append("at the speed the measured steps ran (their time over the calibrated sim's price): " + "; ".join(
            f"{c.measured.config.label} {_slowdown(c.measured)}: {c.predicted.capacity:.3g} vs {c.measured.capacity:.3g} "
            f"req/s" + (f" ({c.error_text})" if not math.isnan(c.error) else "") for c in again))
    kinds = [(c.measured, c.measured.kind_speeds()) for c in comparisons]
    if any(len(k) > 1 for _, k in kinds):
        lines.append("their steps by kind against the calibration's price: " + "; ".join(
            f"{m.config.label} "
            + ", ".join(f"{label} {k[kind]:.2f}x" for kind, label in STEP_KINDS.items() if kind in k)
            for m, k in kinds if k)
            + " (P99 TBT is set by the steps that carry decodes)")
    speeds = probe_speeds(measured)
    if len(speeds) > 1 and max(speeds) > DRIFT_NOTE * min(speeds):
        lines.append(f"the machine's speed moved during the measurement: probe by probe, its steps took {min(speeds):.2f}x "
                     f"to {max(speeds):.2f}x the calibration's price, so a measured capacity moves with the minute it was "
                     f"measured in; measure on a quiet machine, or repeat (--repeats)")
    if order_differs(comparisons):
        pred_order = ", ".join(c.measured.config.label for c in sorted(comparisons, key=lambda c: -c.predicted.capacity))
        meas_order = ", ".join(c.measured.config.label for c in comparisons)
        lines.append(f"the measured order differs from the predicted one: predicted {pred_order}; measured {meas_order}")
    return lines


def edge_notes(predicted: list[ConfigResult], slower: list[ConfigResult]) -> list[str]:
    """A line for the configurations at the edge of the SLO: their capacity falls off a cliff when steps run a
    little slower, so neither the sim's prediction nor one measurement pins it down; and a line where the sim's
    pick is not its highest capacity as calibrated (sim_first.margin_picks)."""
    edge = at_the_edge(predicted, slower)
    slow = f"{EDGE_SLOWDOWN - 1:.0%}"
    lines = []
    if edge:
        lines.append(
            f"at the edge of the SLO: with every step {slow} longer the sim's capacity falls "
            + "; ".join(f"{p.config.label} {capacity_change(p, r):+.0%} ({p.capacity:.3g} -> {r.capacity:.3g} req/s)"
                        for p, r in edge)
            + f". A step with its decodes takes nearly the SLO there at any load: a calibration {slow} off, or a "
            f"{slow} slower minute of the machine, moves such a capacity that much, so its prediction and a single "
            "measurement are that uncertain; a configuration that falls by about the slowdown is the safer choice")
    lines += [f"the sim's pick within {its.criteria.describe()}: {safe.config.label}, {safe.capacity:.3g} req/s with "
              f"every step {slow} longer, where {its.config.label}, the highest as calibrated, holds {its.capacity:.3g} "
              f"(the picks are ranked by what they keep)"
              for its, safe in margin_picks(predicted, slower)]
    return lines


def render_vs_slo(results: list[ConfigResult], criteria: list[Criteria]) -> str:
    """Capacity (req/s) of every configuration under each SLO: the shape of Sarathi-Serve's figures."""
    configs = list(dict.fromkeys(r.config for r in ranked(by_criteria(results, criteria[0]))))
    cell = {(r.config, r.criteria): r for r in results}
    columns = [("configuration", lambda c: c.label, False)]
    for k in criteria:
        columns.append((k.describe(), lambda c, k=k: capacity_text(cell[(c, k)].capacity, cell[(c, k)].hit_bound)
                        if (c, k) in cell else "-", True))
    return md_table(columns, configs)


# ---- exports ----------------------------------------------------------------------------------------------
def config_records(results: list[ConfigResult], tokens_per_request: float) -> list[dict[str, Any]]:
    out = []
    for r in results:
        p = r.at_capacity
        out.append({
            "stage": r.stage, "strategy": r.config.strategy, "budget": r.config.budget,
            "kv_host_gib": math.nan if r.config.kv_host_gib is None else r.config.kv_host_gib,
            "slo": r.criteria.describe(),
            **dict(zip(("rules", "budget_kind", "cadence"), _part_kinds(r.config))),
            "capacity_rps": r.capacity, "capacity_low_rps": r.low, "capacity_high_rps": r.high,
            "capacity_tokens_per_s": r.capacity * tokens_per_request, "hit_bound": r.hit_bound,
            "interrupted": r.interrupted, "limited_by": r.limited_by, "seeds": len(r.searches), "probes": len(r.probes),
            "tbt_p99_ms": p.row.tbt_p99_ms if p else math.nan, "ttft_p99_ms": p.row.ttft_p99_ms if p else math.nan,
            "sched_delay_p50_ms": p.row.sched_delay_p50_ms if p else math.nan,
            "step_time_vs_sim": r.step_speed,
        })
    return out


def _part_kinds(config: Config) -> tuple[str, str, str]:
    c = parse_parts(config.strategy)
    return c.rules, c.budget, c.cadence


def probe_records(results: list[ConfigResult]) -> list[dict[str, Any]]:
    out = []
    for r in results:
        for p in r.probes:
            out.append({"stage": r.stage, "strategy": r.config.strategy, "budget": r.config.budget,
                        "slo": r.criteria.describe(), "seed": p.seed, "rate": p.rate, "passed": p.passed, "stopped_early": p.stopped_early,
                        "busy_s": p.busy_s, "priced_s": p.priced_s,
                        **{f"{which}_{kind}_s": p.by_kind.get(kind, (0.0, 0.0))[i] for kind in STEP_KINDS
                           for i, which in enumerate(("busy", "priced"))},
                        "limited_by": ",".join(p.limited_by), **{f"criterion_{k}": v for k, v in p.values.items()},
                        **{k: v for k, v in p.row.as_dict().items() if k not in ("strategy", "chunk_size", "rate")}})
    return out


def export(path: str | Path, results: list[ConfigResult], tokens_per_request: float, meta: dict[str, Any]) -> list[Path]:
    """Every configuration and probe (report.writers: JSON one document; CSV the configurations here and the probes
    beside it as <name>.probes.csv; JSON lines a record each, named by its table). Returns the files written."""
    return write_export(path, meta, {"configurations": config_records(results, tokens_per_request),
                                     "probes": probe_records(results)}, format_for_path(path, RECORD_FORMATS))

"""The GPU check's table: what each section measured, held against its limit and issue 27's target."""
from __future__ import annotations

from dataclasses import dataclass

from benchmarks.gpu.sections import Compiles, DecodeTimes, Limits, Parity, Sizes, Workload
from benchmarks.lib.models import StepCosts
from benchmarks.lib.profiling import AttentionProfile
from benchmarks.lib.timing import Timing, piggyback


@dataclass
class Row:
    check: str
    measured: str
    math: str = ""  # whether any attention was unfused (kernel rows only)
    against: str = ""  # the limit or reference the ratio is taken against
    ratio: str = ""
    target: str = ""
    passed: bool | None = None  # None: no target, the row informs

    @property
    def verdict(self) -> str:
        return "" if self.passed is None else ("pass" if self.passed else "FAIL")


def _bytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def rows_for(results: dict[str, object], s: Sizes, costs: StepCosts | None, device: str) -> list[Row]:
    """Every row of the table, in the order issue 27 lists them; a section without a value (out of time, an
    error, no model) gives its rows that reason and a fail."""
    before, after = results.get("GEMM peak and copy bandwidth"), results.get("limits again")
    limits = before.best(after if isinstance(after, Limits) else None) if isinstance(before, Limits) else None
    rows: list[Row] = []

    def value(section: str, kind: type, checks: list[tuple[str, str]]):
        """The section's result, or None with its checks' rows failed for the reason it has none."""
        got = results.get(section, "not run")
        if isinstance(got, kind):
            return got
        why = got if isinstance(got, str) else f"no result ({type(got).__name__})"
        rows.extend(Row(check, why, target=target, passed=False) for check, target in checks)
        return None

    if limits is not None:
        peak = f"{limits.peak / 1e12:.1f} TFLOP/s" if limits.peak >= 1e12 else f"{limits.peak / 1e9:.1f} GFLOP/s"
        rows.append(Row("device limits", f"GEMM {peak}, copy {limits.bandwidth / 1e9:.0f} GB/s",
                        against="the higher of a measurement before and after the steps"))

    target = "no math SDPA or bmm attention"
    profiles = value("attention kernels (profiler)", dict, [("attention kernels", target)])
    for kind, p in (profiles or {}).items():
        p: AttentionProfile
        if p.blind:
            rows.append(Row(f"attention: {kind}", "the profiler recorded no device kernel", "unknown", target=target, passed=False))
            continue
        math = f"yes: {'; '.join(p.unfused[:2])}" if p.math else "no"
        rows.append(Row(f"attention: {kind}", ", ".join(p.kernels[:2]) or "no kernel named as attention", math,
                        target=target, passed=not p.math))

    pp = value("prompt step", Timing, [(f"pp{s.pp}", "≥ 0.50 of the GEMM peak")])
    if pp is not None:
        t = pp.median
        if limits is None:
            rows.append(Row(f"pp{s.pp}", f"{s.pp / t:,.0f} t/s", against="no GEMM peak measured", target="≥ 0.50", passed=False))
        else:
            roofline = (costs.product_flops(s.pp) + costs.attention_flops(s.pp)) / limits.peak
            rows.append(Row(f"pp{s.pp}", f"{s.pp / t:,.0f} t/s ({t * 1e3:.1f} ms)", against=f"GEMM roofline {roofline * 1e3:.1f} ms",
                            ratio=f"{roofline / t:.2f}", target="≥ 0.50 of the GEMM peak", passed=roofline / t >= 0.5))

    decode_checks = [(f"decode x{n} at {s.context}", "≥ 0.70 of the read limit" if n == 1 else "") for n in s.decodes]
    times = value("decode steps and piggyback", DecodeTimes, decode_checks + [(f"piggyback: chunk {s.chunk} + {s.k} decodes", "≤ 0.30")])
    if times is not None:
        for n in s.decodes:
            t = times.by_batch[n].median
            read = costs.weight_bytes + costs.kv_bytes(n, s.context)
            first = n == 1
            limit = read / limits.bandwidth if limits else None
            rows.append(Row(f"decode x{n} at {s.context}", f"{n / t:,.0f} t/s ({t * 1e3:.2f} ms)",
                            against=f"{_bytes(read)} read: {limit * 1e3:.2f} ms" if limit else "no bandwidth measured",
                            ratio=f"{limit / t:.2f}" if limit else "",
                            target="≥ 0.70 of the read limit" if first else "",
                            passed=(bool(limit) and limit / t >= 0.7) if first else None))
        medians, paired = piggyback(times.chunk, times.mixed, times.alone)
        extra = times.mixed.median - times.chunk.median
        rows.append(Row(f"piggyback: chunk {s.chunk} + {s.k} decodes",
                        f"+{extra * 1e3:.2f} ms on the chunk's {times.chunk.median * 1e3:.2f}; alone {times.alone.median * 1e3:.2f} ms",
                        against=f"from medians {medians:.2f} ({len(times.chunk.seconds)} paired reps)", ratio=f"{paired:.2f}",
                        target="≤ 0.30", passed=paired <= 0.3))

    check = f"decode x{s.long_batch}: context {s.short_context} / {s.long_context} (cache {s.cache_len})"
    pair = value("context scaling", tuple, [(check, "≤ 0.50")])
    if pair is not None:
        short, long = (t.median for t in pair)
        ideal = ((costs.weight_bytes + costs.kv_bytes(s.long_batch, s.short_context))
                 / (costs.weight_bytes + costs.kv_bytes(s.long_batch, s.long_context)))
        rows.append(Row(check, f"{short * 1e3:.2f} / {long * 1e3:.2f} ms", against=f"bytes read {ideal:.2f}",
                        ratio=f"{short / long:.2f}", target="≤ 0.50", passed=short / long <= 0.5))

    run = value("workload: sequential and chunked", Workload, [("chunked / sequential throughput", "≥ 1.00"),
                                                               ("TBT p99: sequential / chunked", "≥ 3.0")])
    if run is not None:
        seq, chunked = run.runs["sequential"], run.runs["chunked"]
        speed = chunked.throughput / seq.throughput
        rows.append(Row(f"chunked / sequential throughput, {run.label}", f"{chunked.throughput:,.0f} / {seq.throughput:,.0f} tok/s",
                        ratio=f"{speed:.2f}", target="≥ 1.00", passed=speed >= 1.0))
        lower = seq.tbt_p99_ms / chunked.tbt_p99_ms
        rows.append(Row("TBT p99: sequential / chunked", f"{seq.tbt_p99_ms:.1f} / {chunked.tbt_p99_ms:.1f} ms",
                        ratio=f"{lower:.2f}", target="≥ 3.0", passed=lower >= 3.0))

    parity = results.get("parity tests (beside the build)")
    if isinstance(parity, Parity):
        rows.append(Row(f"parity tests on {device}", f"{parity.summary} ({parity.seconds:.0f} s)", target="all pass", passed=parity.ok))
    else:
        rows.append(Row(f"parity tests on {device}", parity if isinstance(parity, str) else "not run: still running",
                        target="all pass", passed=False))

    target = "0 inside steps"
    compiles = value("cache and warm-up", Compiles, [("compiles", target)])
    if compiles is not None:
        measured = f"{compiles.before_timing} graphs before the first timed step ({compiles.seconds:.0f} s with the cache)"
        if compiles.during_timing is None:
            measured += "; the timed sections did not finish"
        else:
            measured += f", {compiles.during_timing} during the timed sections, {compiles.inside_steps} inside steps"
        if compiles.recompiles_logged:
            measured += f"; {compiles.recompiles_logged} recompiles logged"
        rows.append(Row("compiles", measured, against=f"the backend: {compiles.note}", target=target,
                        passed=compiles.inside_steps == 0))
    return rows

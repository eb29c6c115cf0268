"""Colocated against disaggregated on the same GPUs: the best of each design's grid by goodput per GPU under one
SLO that names TTFT and TPOT (or TBT) together, and where one design overtakes the other as the SLO tightens.

Goodput is DistServe's: the highest request rate at which at least `attainment` of the requests meet every
limit of the SLO (metrics.SLO.met: TTFT, TPOT, the worst TBT, E2E, as given), found by capacity.search; per GPU,
divided by the GPUs the design uses. A probe holds a finite number of requests, so it must also keep up with them
(the wait may not grow with arrival time: metrics.queue_growth within capacity's bound), or a burst past capacity
that ends before its queue builds would pass. The grids, on N GPUs:
- colocated: N/tp replicas of one engine at each tensor parallelism that divides N, each a strategy and budget
  (strategies.configurations). Requests go to replicas at random, so each replica's arrivals are a Poisson stream
  at rate/replicas (a thinned Poisson process is one): one replica is simulated, at that rate;
- disaggregated: every P prefill and D decode instances, each pool at a TP of its own, with P·tp_p + D·tp_d = N
  (deploy.Disaggregation), the prefill instances running each prefill strategy given (whole prompts by default,
  as DistServe's do). Its probes hold `requests` per instance of the larger pool.
A design whose model does not fit at its TP is left out, and said so.

Every probe is one run, and the SLO only reads it: the probes at one rate serve every tightness (`scales`, each
multiplying every limit), so the crossover costs a search per tightness over runs mostly made already.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from strategies import configurations, make_strategy, strategy_label

from prefillbench import engine
from prefillbench.backends.base import Backend, BackendError
from prefillbench.bench.capacity import DEFAULT_MAX_QUEUE_GROWTH, Probe, search
from prefillbench.bench.metrics import SLO, Load, ResultRow, queue_growth, summarize
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, make_requests
from prefillbench.deploy import Disaggregation, run_requests
from prefillbench.engine import RunRecord

COLOCATED, DISAGGREGATED = "colocated", "disaggregated"
DEFAULT_SCALES = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
DEFAULT_ATTAINMENT = 0.9  # DistServe's
DEFAULT_DESIGN_REQUESTS = 200


@dataclass(frozen=True)
class Design:
    """One way to serve on the GPUs: `replicas` colocated engines at `tp`, or a split (prefill strategy `strategy`)."""

    strategy: str
    budget: int | None
    tp: int = 1
    replicas: int = 1
    split: Disaggregation | None = None

    @property
    def kind(self) -> str:
        return COLOCATED if self.split is None else DISAGGREGATED

    @property
    def gpus(self) -> int:
        return self.replicas * self.tp if self.split is None else self.split.gpus

    @property
    def label(self) -> str:
        """'4xTP2 chunked (512)', 'P:D 2xTP2:4xTP1 sequential'."""
        where = f"{self.replicas}xTP{self.tp}" if self.split is None else self.split.label
        return f"{where} {strategy_label(self.strategy, self.budget)}"


def design_grid(gpus: int, strategies: list[str], budgets: list[int], tps: list[int],
                prefill_strategies: list[str], prefill_budgets: list[int], link: str = "nvlink",
                transfer: str = "whole") -> list[Design]:
    """Both designs' grids on `gpus` GPUs (the module's docstring)."""
    out = [Design(s, b, tp, gpus // tp) for tp in tps if gpus % tp == 0
           for s, b in configurations(strategies, budgets)]
    for tp_p in tps:
        for tp_d in tps:
            for p in range(1, gpus // tp_p + 1):
                rest = gpus - p * tp_p
                if rest < tp_d or rest % tp_d:
                    continue
                split = Disaggregation(p, rest // tp_d, tp_p, tp_d, link, transfer)
                out += [Design(s, b, split=split) for s, b in configurations(prefill_strategies, prefill_budgets)]
    return out


@dataclass
class DesignResult:
    design: Design
    goodput: dict[float, float] = field(default_factory=dict)  # SLO scale -> requests/s with the attainment met
    probes: int = 0
    error: str = ""  # why the design did not run (its model does not fit at its TP)
    test: str = ""  # the workload's name (pp768+tg192, a trace's)

    def per_gpu(self, scale: float) -> float:
        return self.goodput.get(scale, math.nan) / self.design.gpus


@dataclass
class DesignSearch:
    """Goodput of designs of `lead`'s model and GPU on one test, under `slo` scaled by each of `scales`."""

    lead: Backend
    test: TestSpec
    slo: SLO
    attainment: float = DEFAULT_ATTAINMENT
    scales: tuple[float, ...] = DEFAULT_SCALES
    requests: int = DEFAULT_DESIGN_REQUESTS
    seed: int = 42
    precision: float = 0.05
    on_probe: Callable[[Design, float], None] | None = None
    _instances: dict[int, Backend] = field(default_factory=dict, repr=False)

    def instance(self, tp: int) -> Backend:
        if tp not in self._instances:
            self._instances[tp] = self.lead.instance(tp)
        return self._instances[tp]

    def run(self, design: Design, rate: float) -> RunRecord:
        """One probe of the design at `rate` requests/s over the whole design (module docstring)."""
        if design.split is None:
            n, at = self.requests, rate / design.replicas
        else:
            n, at = self.requests * max(design.split.prefill, design.split.decode), rate
        if self.test.workload is not None:  # a trace: its rows, at the probe's rate
            n = len(self.test.workload)
        reqs = make_requests(self.test, n, self.lead.vocab_size, self.seed,
                             ArrivalSpec("poisson", at).times(n, self.seed, self.test))
        if design.split is None:
            return engine.run(self.instance(design.tp), make_strategy(design.strategy, design.budget), reqs, 0)
        return run_requests(self.lead, design.strategy, design.budget, reqs, 0, design.split)

    def search(self, design: Design) -> DesignResult:
        result = DesignResult(design, test=self.test.name)
        try:
            self.instance(design.tp if design.split is None else design.split.prefill_tp)
            if design.split is not None:
                self.instance(design.split.decode_tp)
        except (BackendError, ValueError) as e:
            result.error = str(e)
            return result
        # A probe's run, its queue's growth and its row, once per rate: the SLO only reads them, so every tightness
        # shares them (the row is at the SLO as given).
        probed: dict[float, tuple[RunRecord, float, ResultRow]] = {}

        def measured(rate: float) -> tuple[RunRecord, float, ResultRow]:
            key = round(rate, 9)
            if key not in probed:
                if self.on_probe is not None:
                    self.on_probe(design, rate)
                run = self.run(design, rate)
                row = summarize(self.test, [run], model=self.lead.model_name, backend=self.lead.label,
                                strategy=design.strategy, concurrency=0, chunk_size=design.budget,
                                load=Load("poisson", rate), slo=self.slo,
                                deployment=design.split.label if design.split else "")
                probed[key] = run, queue_growth(run), row
            return probed[key]

        for scale in self.scales:
            slo = scaled(self.slo, scale)

            def probe(rate: float) -> Probe:
                run, growth, row = measured(rate)
                met = sum(slo.met(r) for r in run.requests) / len(run.requests)
                # a probe's requests end: past capacity a short burst can still meet the SLO before its queue
                # builds, so the first tokens must keep up with the arrivals as well (capacity's growth bound)
                growing = growth > DEFAULT_MAX_QUEUE_GROWTH
                passed = met >= self.attainment and not growing
                return Probe(rate, passed, row, [] if passed else ["growth"] if growing else ["slo"])

            result.goodput[scale] = search(probe, start_rate=design.gpus * 0.5, precision=self.precision).capacity
        result.probes = len(probed)
        return result


def scaled(slo: SLO, scale: float) -> SLO:
    """Every limit of the SLO times `scale` (below 1: tighter)."""
    return replace(slo, **{f"{k}_ms": getattr(slo, f"{k}_ms") * scale for k in SLO.KEYS
                           if getattr(slo, f"{k}_ms") is not None})


def best(results: list[DesignResult], kind: str, scale: float) -> DesignResult | None:
    """The design of `kind` with the most goodput per GPU at `scale`; None if none ran."""
    ran = [r for r in results if r.design.kind == kind and not r.error]
    return max(ran, key=lambda r: r.per_gpu(scale)) if ran else None

"""slo-budget: each step's prompt tokens chosen by the step's price against a target from the SLO.

Its rule on hand-built steps (a price whose budget is known by arithmetic), its runs on the sim checked step by step
against the sim's own charge, the margin, the starvation floor, and the commands that refuse it where it cannot run.
"""
from __future__ import annotations

import dataclasses
import json
import math
import pickle
from statistics import NormalDist

import pytest

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench import slo_pricing
from prefillbench.bench.capacity import Criteria, Probe, SearchResult
from prefillbench.bench.metrics import percentile, tbts_ms
from prefillbench.bench.pricing import pricer
from prefillbench.bench.tune import Config, ConfigResult
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, make_requests, request_lengths
from prefillbench.report import adaptive
from prefillbench.sequence import Sequence
from strategies import make_strategy
from strategies.slo_budget import DEFAULT_CAP, chunk_shapes


def seq(i: int, prompt_len: int, prefilled: int = 0, generated=()) -> Sequence:
    s = Sequence(i, tuple(range(prompt_len)), 4, 0.0, n_prefilled=prefilled)
    s.generated = list(generated)
    return s


def linear_price(per_prompt_token: float, per_decode: float, per_context: float, base: float):
    """A price whose budget is arithmetic: base + per token + per decode + per position the decodes attend."""
    return lambda chunks, contexts: (base + per_prompt_token * sum(n for _, n, _ in chunks) + per_decode * len(contexts)
                                     + per_context * sum(contexts))


#: 50 ms, and a hair more: the arithmetic budgets below land exactly on it, where a float sum may round either way.
TARGET = 50e-3 + 1e-12


def strategy(price, target_s: float, cap: int | None = None):
    s = make_strategy("slo-budget" + (f":cap={cap}" if cap else ""))
    s.price_with(price, target_s)
    return s


# ---- the rule, by arithmetic --------------------------------------------------------------------------------
def test_the_budget_is_the_most_prompt_tokens_within_the_target():
    # 10 ms + 0.1 ms a prompt token + 1 ms a decode + 1 us a context position, within 50 ms:
    # 3 decodes at 100, 200 and 300 positions (the decode at 300 is position 299 + itself) leave 50 - 10 - 3 - 0.6
    # = 36.4 ms, 364 prompt tokens
    price = linear_price(1e-4, 1e-3, 1e-6, 10e-3)
    running = [seq(7, 50, 50, [1] * 50), seq(8, 150, 150, [1] * 50), seq(9, 250, 250, [1] * 50)]
    s = strategy(price, TARGET)
    step = s.next_step([seq(0, 1000), seq(1, 400, prefilled=100)], running)
    assert dict(step.policy_values)["budget"] == 364
    # the prompt in progress first (its 300 tokens left), then 64 of the new one; every decode, first
    assert [(c.seq_id, c.start, len(c.tokens)) for c in step.prefills] == [(1, 100, 300), (0, 0, 64)]
    assert [d.seq_id for d in step.decodes] == [7, 8, 9]
    assert price(chunk_shapes([seq(1, 400, 100), seq(0, 1000)], 364), [100, 200, 300]) <= TARGET
    assert price(chunk_shapes([seq(1, 400, 100), seq(0, 1000)], 365), [100, 200, 300]) > TARGET


def test_fewer_decodes_leave_a_larger_budget():
    price = linear_price(1e-4, 1e-3, 0.0, 0.0)
    budgets = []
    for n in (1, 10, 40):
        step = strategy(price, TARGET).next_step([seq(0, 4000)], [seq(10 + i, 5, 5, [1]) for i in range(n)])
        budgets.append(dict(step.policy_values)["budget"])
    assert budgets == [490, 400, 100]


def test_the_budget_counts_past_what_waits_and_the_step_takes_what_waits():
    step = strategy(linear_price(1e-4, 0.0, 0.0, 0.0), TARGET).next_step([seq(0, 30)], [])
    assert dict(step.policy_values)["budget"] == 500
    assert [len(c.tokens) for c in step.prefills] == [30] and step.prefills[0].is_last


def test_the_cap_bounds_the_budget_and_the_step_tokens():
    s = strategy(lambda chunks, contexts: 0.0, 1.0, cap=64)
    step = s.next_step([seq(0, 1000)], [seq(1, 5, 5, [1])])
    assert dict(step.policy_values)["budget"] == 64 and step.n_prefill_tokens == 64
    assert s.max_step_tokens(1000, 4) == 64 + 4
    assert make_strategy("slo-budget").cap == DEFAULT_CAP


def test_decodes_that_alone_take_the_target_still_carry_one_prompt_token():
    # the starvation floor: the decodes' 60 ms pass the 50 ms target, and the prompt still moves a token a step
    s = strategy(linear_price(1e-4, 1e-3, 0.0, 0.0), TARGET)
    step = s.next_step([seq(0, 100)], [seq(10 + i, 5, 5, [1]) for i in range(60)])
    assert step.n_prefill_tokens == 1 and dict(step.policy_values)["budget"] == 1 and len(step.decodes) == 60


def test_nothing_waiting_is_the_decodes_alone_with_no_budget():
    step = strategy(linear_price(1e-4, 1e-3, 0.0, 0.0), TARGET).next_step([], [seq(1, 5, 5, [1])])
    assert not step.prefills and len(step.decodes) == 1 and step.policy_values == ()


def test_unpriced_it_refuses_to_choose():
    with pytest.raises(RuntimeError, match="price_with"):
        make_strategy("slo-budget").next_step([seq(0, 10)], [])
    with pytest.raises(ValueError, match="cap"):
        make_strategy("slo-budget:cap=0")


# ---- on the sim, step by step against the sim's own charge ---------------------------------------------------
MISTRAL = dict(model="mistral-7b", gpu="a100", sim_pricing="spec")


def sim_run(target_s: float | None = None, rate: float = 6.0, n: int = 120, slo_ms: float = 100.0, **load):
    backend = SimBackend.load(**(load or MISTRAL))
    pricing = slo_pricing.run_pricing(backend, load.get("calibration"))
    s = slo_pricing.priced(make_strategy("slo-budget"), pricing, slo_ms, None)
    if target_s is not None:
        s.price_with(pricing.step_price(), target_s)
    test = TestSpec(1730, 415, spread=0.9)
    reqs = make_requests(test, n, backend.vocab_size, 3, ArrivalSpec("poisson", rate).times(n, 3, test))
    return backend, s, engine.run(backend, s, reqs, 0)


def run_lengths(n: int) -> list[tuple[int, int]]:
    """(prompt, output) lengths of sim_run's requests."""
    return request_lengths(TestSpec(1730, 415, spread=0.9), n, 3)


def test_no_step_is_priced_above_the_target_while_a_smaller_one_was_possible():
    """Every step with more than one prompt token is within the target by the sim's own full pricing (step_cost, not
    the fast path the strategy calls) and by the sim's clock; one more prompt token would have passed it where more
    waited; and the target binds (the test is not vacuous)."""
    target = 0.060
    backend, s, run = sim_run(target)
    price = pricer(backend.cost)
    mixed = [r for r in run.steps if r.prefill_chunks]
    assert len(mixed) > 100
    binding = 0
    for rec in mixed:
        tokens = sum(n for _, n in rec.prefill_chunks)
        budget = dict(rec.policy_values)["budget"]
        assert tokens <= budget
        if price(rec) > target + 1e-12 or rec.seconds > target + 1e-12:
            assert tokens == 1, (rec, price(rec))  # only the floor may pass the target
        if tokens == budget and budget < DEFAULT_CAP:  # the target bound it: one token more is over
            binding += 1
            start, length = rec.prefill_chunks[-1]
            bigger = dataclasses.replace(rec, prefill_chunks=rec.prefill_chunks[:-1] + [(start, length + 1)])
            assert price(bigger) > target
    assert binding > 20
    budgets = {dict(r.policy_values)["budget"] for r in mixed}
    assert len(budgets) > 10  # it moves with the decodes beside it


def test_its_p99_tbt_holds_the_slo_on_the_sim():
    backend, s, run = sim_run(rate=6.0, slo_ms=100.0)
    assert s.target_s == pytest.approx(0.100)  # the sim's own prices: no margin
    assert percentile(tbts_ms(run), 99) <= 100.0


def test_a_prompt_behind_decodes_that_take_the_target_is_not_starved():
    backend, s, run = sim_run(1e-6, rate=2.0, n=8)
    assert sorted(len(r.tokens) for r in run.requests) == sorted(n for _, n in run_lengths(8))
    assert all(sum(n for _, n in rec.prefill_chunks) == 1 for rec in run.steps if rec.prefill_chunks)


@pytest.mark.parametrize("pp", [1, 4])
def test_every_position_is_fed_once_on_the_sim(pp):
    requests = make_requests(TestSpec(300, 8), 10, 32000, seed=0)
    ref = engine.run(SimBackend.load("llama-13b", "a100"), make_strategy("sequential"), requests, 4)
    backend = SimBackend.load("llama-13b", "a100", pp=pp)
    s = slo_pricing.priced(make_strategy("slo-budget"), slo_pricing.run_pricing(backend, None), 30.0, None)
    record = engine.run(backend, s, requests, 4)
    assert [r.tokens for r in record.requests] == [r.tokens for r in ref.requests]


def test_decode_runs_record_what_single_steps_record():
    """With nothing waiting its step is the decodes alone, so the engine may run them in a row (steady_decodes):
    what that records is what asking for every step records."""
    test = TestSpec(400, 120, spread=0.9)
    reqs = make_requests(test, 80, 32000, 3, ArrivalSpec("poisson", 2.0).times(80, 3, test))
    records, runs = [], []
    for step_by_step in (False, True):
        backend = SimBackend.load(**MISTRAL)
        if step_by_step:
            backend.run_decodes = lambda step, most, until: None
        s = slo_pricing.priced(make_strategy("slo-budget"), slo_pricing.run_pricing(backend, None), 40.0, None)
        records.append(engine.run(backend, s, reqs, 0))
        runs.append(backend.n_steps)
    assert dataclasses.asdict(records[0]) == dataclasses.asdict(records[1])
    assert runs[0] == runs[1]


# ---- the margin ---------------------------------------------------------------------------------------------
def test_the_margin_is_the_fit_error_and_the_jitter_tail_at_the_percentile():
    backend = SimBackend.load(**MISTRAL)
    p = slo_pricing.StepPricing(backend.cost, "test", fit_error=0.10, jitter=0.05)
    z = NormalDist().inv_cdf(0.99)
    assert p.margin(99) == pytest.approx(1.10 * math.exp(z * 0.05) - 1)
    assert p.target_s(100.0, 99) == pytest.approx(0.100 / (1.10 * math.exp(z * 0.05)))
    assert p.margin(50) == pytest.approx(0.10)  # the median needs no tail
    assert p.margin(100) == p.margin(slo_pricing.MOST_PERCENTILE)  # bounded
    assert slo_pricing.StepPricing(backend.cost, "sim").margin(99) == 0.0
    # a noisy calibration's margin is applied whatever it is, and the line a run prints says it is wide
    assert "quiet machine" not in p.describe(100.0, None, 99)
    assert "quiet machine" in slo_pricing.StepPricing(backend.cost, "busy", 2.1, 0.57).describe(100.0, None, 99)


def calibration_file(tmp_path, p90: float, jitter: float):
    """A calibration of Mistral-7B on an A100 (its spec sheet's numbers as the fit) with the given errors."""
    backend = SimBackend.load(**MISTRAL)
    cal = {"version": 1, "model": dataclasses.asdict(backend.model), "gpu": dataclasses.asdict(backend.gpu),
           "nominal_gpu": backend.gpu.name,
           "fitted": {"compute_fraction": backend.gpu.compute_fraction, "memory_fraction": backend.gpu.memory_fraction,
                      "step_overhead_s": backend.gpu.step_overhead_s, "step_jitter": jitter},
           "median_abs_error": p90 / 2, "p90_abs_error": p90, "steps": []}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal))
    return str(path)


def test_a_calibrated_run_takes_its_margin_from_the_calibration(tmp_path):
    path = calibration_file(tmp_path, 0.08, 0.04)
    sim = SimBackend.load(model="mistral-7b", gpu="a100", calibration=path)
    on_sim = slo_pricing.run_pricing(sim, path)
    on_gguf = slo_pricing.of_calibration(path)  # a real backend's: the same file, the same prices
    for p in (on_sim, on_gguf):
        assert (p.fit_error, p.jitter) == (0.08, 0.04)
    chunks, contexts = [(0, 512, False)], (900, 1200)
    assert on_sim.step_price()(chunks, contexts) == pytest.approx(on_gguf.step_price()(chunks, contexts), rel=1e-12)
    s = slo_pricing.priced(make_strategy("slo-budget"), on_gguf, 100.0, None)
    assert s.target_s == pytest.approx(0.100 / (1.08 * math.exp(NormalDist().inv_cdf(0.99) * 0.04)))
    assert "p90 |error| 8.0%" in on_gguf.describe(100.0, None, 99)


def test_the_margin_holds_the_slo_where_the_steps_jitter(tmp_path):
    """On a sim whose steps spread around their price (a calibration's jitter, 0.08), aiming at the SLO itself puts
    about half the steps the target bound past it, and P99 TBT with them; the margin's jitter term (z at P99) keeps
    all but about 1% of them within it."""
    path = calibration_file(tmp_path, 0.0, 0.08)
    load = dict(model="mistral-7b", gpu="a100", calibration=path)
    _, _, bare = sim_run(0.100, n=500, **load)  # the target at the SLO: no margin
    _, s, kept = sim_run(None, n=500, **load)  # the margin from the calibration
    assert s.target_s == pytest.approx(0.100 / math.exp(NormalDist().inv_cdf(0.99) * 0.08))

    def over_slo(run) -> float:
        steps = [r for r in run.steps if sum(n for _, n in r.prefill_chunks) > 1]
        assert len(steps) > 500
        return sum(r.seconds > 0.100 for r in steps) / len(steps)

    assert over_slo(bare) > 0.2 and percentile(tbts_ms(bare), 99) > 100.0
    assert over_slo(kept) <= 0.02


def test_on_gguf_it_feeds_every_position_as_sequential_does(tiny_gguf_path, tmp_path, run_cli):
    """On a real backend, priced by a calibration file: its chunks, cut by the price, change no token; the command
    takes --calibration as slo-budget's (not named as ignored) and says what prices the steps."""
    from prefillbench.backends.gguf import GGUFBackend
    from prefillbench.sequence import Request

    path = calibration_file(tmp_path, 0.1, 0.02)
    requests = [Request(tuple(range(3 + i, 40 + 7 * i)), 5) for i in range(5)]
    backend = GGUFBackend.load(tiny_gguf_path, kv_type="f32", flash_attn=False, threads=1)
    try:
        ref = engine.run(backend, make_strategy("sequential"), requests, 3)
        # a target a 20-token chunk beside its decodes passes on an A100: chunks of a few tokens
        s = make_strategy("slo-budget")
        price = slo_pricing.of_calibration(path).step_price()
        s.price_with(price, price([(0, 20, False)], (50, 50)))
        got = engine.run(backend, s, requests, 3)
    finally:
        backend.close()
    assert [r.tokens for r in got.requests] == [r.tokens for r in ref.requests]
    assert max(sum(n for _, n in rec.prefill_chunks) for rec in got.steps) < 40  # the price cut the prompts
    code, out, err = run_cli("run", "--backend", "gguf", "-m", tiny_gguf_path, "-t", "1", "-s", "slo-budget", "--pg",
                             "48,4", "-c", "2", "-r", "1", "--slo", "tbt=500", "--calibration", path, "--no-results-file",
                             "--no-progress", "--no-warmup")
    assert code == 0, err
    assert f"priced by calibration {path}" in err and "ignored" not in err and "| slo-budget" in out


# ---- what a run needs --------------------------------------------------------------------------------------
def test_priced_refuses_a_run_without_an_slo_or_a_price():
    backend = SimBackend.load(**MISTRAL)
    with pytest.raises(ValueError, match="TBT or TPOT"):
        slo_pricing.priced(make_strategy("slo-budget"), slo_pricing.run_pricing(backend, None), None, None)
    with pytest.raises(ValueError, match="--calibration"):
        slo_pricing.priced(make_strategy("slo-budget"), None, 100.0, None)
    fixed = make_strategy("sarathi-serve", 512)
    assert slo_pricing.priced(fixed, None, None, None) is fixed  # a fixed budget needs neither
    # the TPOT SLO where no TBT is given; the lower where both are
    assert slo_pricing.priced(make_strategy("slo-budget"), slo_pricing.run_pricing(backend, None), None, 80.0).target_s == 0.080
    assert slo_pricing.priced(make_strategy("slo-budget"), slo_pricing.run_pricing(backend, None), 60.0, 80.0).target_s == 0.060


def test_the_pricing_crosses_to_tune_s_worker_processes():
    p = slo_pricing.run_pricing(SimBackend.load(**MISTRAL), None)
    again = pickle.loads(pickle.dumps(p))
    assert again.step_price()([(0, 256, True)], (100,)) == p.step_price()([(0, 256, True)], (100,))


SIM = ["--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "a100", "--no-results-file", "--no-progress"]


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_run_without_a_step_slo_says_it_needs_one(run_cli):
    code, _, err = run_cli("run", *SIM, "-s", "slo-budget", "--pg", "512,8", "-c", "2", "-r", "1")
    assert code != 0 and "--slo tbt=MS" in one_line(err)
    code, _, err = run_cli("run", *SIM, "-s", "slo-budget", "--pg", "512,8", "-c", "2", "-r", "1", "--slo", "ttft=500")
    assert code != 0 and "TBT (or TPOT) SLO" in one_line(err)


def test_a_server_cannot_run_it(run_cli):
    code, _, err = run_cli("run", "--backend", "server", "--engine", "vllm", "-m", "x", "-s", "slo-budget",
                           "--pg", "512,8", "--slo", "tbt=100", "-c", "1")
    assert code != 0 and "no serving engine takes a per-step budget" in one_line(err)


def test_a_real_backend_needs_its_calibration(run_cli, tmp_path):
    code, _, err = run_cli("run", "--backend", "gguf", "-s", "slo-budget", "--pg", "64,4", "-c", "1", "--slo", "tbt=500")
    assert code != 0 and "--calibration FILE" in one_line(err)


def test_a_default_run_without_an_slo_leaves_it_out(run_cli):
    code, out, _ = run_cli("run", *SIM, "-s", "sarathi-serve", "--pg", "512,8", "-c", "2", "-r", "1")
    assert code == 0
    code, out, _ = run_cli("run", *SIM, "--pg", "512,8", "-c", "2", "-r", "1", "--no-verdict")
    assert code == 0 and "slo-budget" not in out and "sarathi-serve" in out


def test_the_per_request_export_carries_each_token_s_budget(run_cli, tmp_path):
    trace = tmp_path / "requests.jsonl"
    code, out, err = run_cli("run", *SIM, "-s", "slo-budget", "--pg", "1730,64", "--arrival", "poisson", "--rate", "8",
                             "--requests", "40", "--slo", "tbt=100", "--export-requests", str(trace))
    assert code == 0, err
    assert "| slo-budget" in out
    assert "slo-budget: each step's prompt tokens priced by the sim's cost model" in err
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    budgets = [b for r in records for b in r["step_budget"] if b is not None]
    assert budgets and len(set(budgets)) > 3 and all(1 <= b <= DEFAULT_CAP for b in budgets)


# ---- tune ---------------------------------------------------------------------------------------------------
def result(name: str, budget: int | None, low: float, capacity: float, high: float) -> ConfigResult:
    """Three seeds' searches: capacities low, capacity, capacity, each failing at `high` (the interval's top)."""
    fail = Probe(high, False, None)
    searches = [SearchResult(low, [fail]), SearchResult(capacity, [fail]), SearchResult(capacity, [fail])]
    return ConfigResult(Config(name, budget), Criteria(100.0), searches)


def test_tune_says_whether_it_beats_ties_or_loses_to_the_best_fixed_budget():
    fixed = [result("sarathi-serve", 512, 4.0, 4.2, 4.4), result("sarathi-serve", 1024, 3.0, 3.1, 3.3),
             result("sequential", None, 1.0, 1.0, 1.1)]
    wins = [result("slo-budget", None, 4.6, 4.8, 5.0), *fixed]
    assert adaptive.best_fixed(wins).config == Config("sarathi-serve", 512)
    line, = adaptive.against_fixed(wins)
    assert "beats the best fixed budget, sarathi-serve (512)" in line and "(+14%)" in line
    assert adaptive.win_text(wins[0], wins) == ", 1.14x the nearest fixed budget, sarathi-serve (512) (4.2 req/s)"
    ties = [result("slo-budget", None, 4.3, 4.35, 4.5), *fixed]
    assert "ties the best fixed budget" in adaptive.against_fixed(ties)[0] and adaptive.win_text(ties[0], ties) == ""
    loses = [result("slo-budget", None, 3.4, 3.5, 3.6), *fixed]
    assert "loses to the best fixed budget" in adaptive.against_fixed(loses)[0]
    assert adaptive.against_fixed(fixed) == []


def test_tune_on_the_sim_puts_it_beside_the_fixed_budgets(run_cli):
    code, out, err = run_cli("tune", "--backend", "sim", "--sim-model", "llama-13b", "--sim-gpu", "a100",
                             "--pg", "1024,64", "--slo", "tbt=100", "-s", "sarathi-serve,slo-budget",
                             "--chunk-size", "256,1024", "--requests", "60", "--repeats", "1", "--precision", "20",
                             "--no-progress", "--jobs", "1")
    assert code == 0, err
    assert "| slo-budget" in out
    verdict = [line for line in out.splitlines() if line.startswith("slo-budget within")]
    assert len(verdict) == 1 and "the best fixed budget, sarathi-serve (" in verdict[0]
    assert "slo-budget: each step's prompt tokens priced by" in err


def test_a_real_backend_measures_it_beside_the_sim_s_best_fixed_budget():
    from prefillbench.bench.sim_first import picks
    from prefillbench.bench.tune import TuneSettings

    k = Criteria(100.0)
    predicted = [result("chunked", 64, 5.0, 5.1, 5.3), result("packed", None, 5.0, 5.2, 5.4),
                 result("sarathi-serve", 32, 4.0, 4.1, 4.2), result("slo-budget", None, 2.0, 2.1, 2.2),
                 result("sequential", None, 1.0, 1.0, 1.1)]
    for r in predicted:
        r.criteria = k
    chosen = picks(predicted, TuneSettings(TestSpec(64, 4), [k], 10), top_k=1)
    # the sim's top one, the baseline, and, since the grid holds slo-budget, it and the best fixed budget
    assert chosen == [Config("packed", None), Config("sequential", None), Config("slo-budget", None),
                      Config("chunked", 64)]
    without = picks([r for r in predicted if r.config.strategy != "slo-budget"], TuneSettings(TestSpec(64, 4), [k], 10), 1)
    assert without == [Config("packed", None), Config("sequential", None)]

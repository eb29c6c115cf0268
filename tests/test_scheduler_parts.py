"""A scheduler is an engine's rules, a budget and a cadence (strategies/compose.py): the spelling, the labels, the
launch lines, the SLO budget under vLLM's and SGLang's memory, and each cadence's rule on hand-built sequences."""
from __future__ import annotations

import pytest

from prefillbench import engine
from prefillbench.backends.fake import FakeBackend
from prefillbench.backends.server.engines import SGLANG, VLLM, served_cadence_note
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench import slo_pricing
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, make_requests
from prefillbench.commands.options.common import strategy_names
from prefillbench.errors import UsageError
from prefillbench.sequence import Request, Sequence
from strategies import configurations, make_strategy, strategy_label
from strategies.cadence import SglangDecodeRounds, VllmInterval
from strategies.compose import compose, parse, shipped


def seq(i: int, prompt_len: int, prefilled: int = 0, generated=()) -> Sequence:
    s = Sequence(i, tuple(range(prompt_len)), 4, 0.0, n_prefilled=prefilled)
    s.generated = list(generated)
    return s


# ---- the spelling -------------------------------------------------------------------------------------------------

def test_the_parts_compose_into_one_spec_and_label():
    spec = compose("vllm-v1:threshold=64", "slo", "interval:4")
    assert spec == "vllm-v1:threshold=64 · budget slo · cadence interval:4"
    assert parse(spec).rules == "vllm-v1:threshold=64" and parse(spec).budget == "slo"
    s = make_strategy(spec)
    assert s.spec == spec and s.long_prefill_token_threshold == 64 and s.needs_price and not s.uses_chunk_size
    assert strategy_label(spec, None) == spec
    fixed = compose("sglang-mixed", "fixed", "decode-rounds:4")
    assert strategy_label(fixed, 512) == "sglang-mixed · budget 512 · cadence decode-rounds:4"
    assert strategy_label("vllm-v1", 512) == "vllm-v1 (512)"  # the rules alone keep their label
    # the defaults are no parts: interval:1 and decode-rounds:0 are every step
    assert compose("vllm-v1", "fixed", "interval:1") == compose("sglang", "fixed", "decode-rounds:0").replace(
        "sglang", "vllm-v1") == "vllm-v1"
    assert configurations([spec, fixed], [256, 512]) == [(spec, None), (fixed, 256), (fixed, 512)]


def test_the_old_name_is_the_sarathi_rules_with_the_slo_budget():
    old, new = make_strategy("slo-budget:cap=64"), make_strategy("sarathi-serve · budget slo:cap=64")
    assert old.cap == new.budget_part.cap == 64 and old.needs_price and new.needs_price
    price = lambda chunks, contexts: 1e-3 * sum(n for _, n, _ in chunks) + 2e-3 * len(contexts)  # noqa: E731
    for s in (old, new):
        s.price_with(price, 0.030 + 1e-12)  # a hair over: the sum lands on it exactly
    waiting, running = [seq(0, 100, 10), seq(1, 50)], [seq(2, 8, 8, [1]), seq(3, 8, 8, [1])]
    assert old.next_step(waiting, running) == new.next_step(waiting, running)
    assert sum(len(c.tokens) for c in new.next_step(waiting, running).prefills) == 26  # (30 - 2*2) ms / 1 ms


@pytest.mark.parametrize("bad, said", [
    (dict(budget=["tokens"]), "unknown budget 'tokens'"),
    (dict(cadences=["interval:x"]), "unknown cadence 'interval:x'"),
    (dict(cadences=["decode-rounds:2:batch=3"]), "min-bs=M"),
    (dict(given=["sequential"], budget=["slo"]), "takes no token budget"),
])
def test_bad_parts_are_refused_in_one_line(bad, said):
    with pytest.raises(UsageError, match=said) as e:
        strategy_names(bad.get("given", ["vllm-v1"]), None, bad.get("budget"), bad.get("cadences"))
    assert "\n" not in str(e.value)


def test_the_flags_make_the_product_grid():
    names = strategy_names(["vllm-v1", "sglang-mixed"], None, ["fixed", "slo"], ["every", "interval:4"])
    assert names == ["vllm-v1", "vllm-v1 · cadence interval:4", "vllm-v1 · budget slo",
                     "vllm-v1 · budget slo · cadence interval:4", "sglang-mixed", "sglang-mixed · cadence interval:4",
                     "sglang-mixed · budget slo", "sglang-mixed · budget slo · cadence interval:4"]
    assert shipped(names[1]) == "shipped by its engine"
    assert shipped(names[5]) == "prefillbench's own: the interval cadence under sglang-mixed's rules"
    assert shipped(names[2]).startswith("prefillbench's own: the slo budget")


def test_each_engine_launches_its_own_cadence_and_refuses_the_others():
    values = {"model": "m", "port": 1, "slots": 4, "budget": 512}
    argv = VLLM.argv("vllm-v1 · cadence interval:4", values)
    assert argv[argv.index("--prefill-schedule-interval") + 1] == "4"
    assert "one data-parallel rank ignores" in served_cadence_note("vllm", "vllm-v1 · cadence interval:4")
    argv = SGLANG.argv("sglang-mixed · cadence decode-rounds:4:min-bs=8", values)
    assert argv[-4:] == ["--prefill-decode-interval", "4", "--prefill-decode-interval-min-bs", "8"]
    assert not VLLM.expresses("vllm-v1 · cadence decode-rounds:4")
    assert not SGLANG.expresses("sglang · cadence interval:4")
    assert "ships decode-rounds" in str(SGLANG.refuse("sglang · cadence interval:4"))


# ---- the cadences' rules ------------------------------------------------------------------------------------------

def test_vllms_interval_throttles_prompts_to_every_nth_step_while_decodes_run():
    s = make_strategy("vllm-v1 · cadence interval:4", 64)
    s.reset()
    s.attach(None)
    running = [seq(0, 4, 4, [1])]
    kinds = []
    for _ in range(8):  # a new prompt waits at every step; the first step of the wave (counter 0) takes it
        step = s.next_step([seq(9, 8)], running)
        kinds.append(bool(step.prefills))
    assert kinds == [True, False, False, False, True, False, False, False]
    assert all(d.seq_id == 0 for d in step.decodes)
    # a prompt in progress is deferred as a new one is (its RUNNING entry skipped), and nothing running defers nothing
    assert not s.next_step([], running).prefills  # step 8 of the wave: unthrottled, nothing waits
    assert not s.next_step([seq(5, 40, 8)], running).prefills
    assert s.next_step([seq(5, 40, 8)], []).prefills


def test_vllms_guard_lifts_the_throttle_where_the_queue_could_not_drain():
    cadence = VllmInterval(4)
    s = make_strategy("vllm-v1 · cadence interval:4", 16)
    s.reset()
    s.attach(None)
    running = [seq(0, 4, 4, [1])]
    waiting = [seq(1, 100), seq(2, 100)]  # more than a 16-token budget takes: requests stay waiting
    first = s.next_step(waiting, running)
    assert [c.seq_id for c in first.prefills] == [1] and s.cadence.capacity_bound
    assert s.next_step(waiting, running).prefills  # capacity-bound: the throttled steps admit too
    assert isinstance(s.cadence, VllmInterval) and cadence.interval == 4


def test_sglangs_decode_rounds_follow_a_prefill_batch():
    s = make_strategy("sglang · cadence decode-rounds:2", 64)
    s.reset()
    s.attach(None)
    running = [seq(0, 4, 4, [1])]
    kinds = []
    for i in range(7):
        step = s.next_step([seq(10 + i, 8)], running)
        kinds.append("extend" if step.prefills else "decode")
    assert kinds == ["extend", "decode", "decode", "extend", "decode", "decode", "extend"]
    # min-bs: a running batch below it ends the interval, so a prompt is admitted at once
    c = SglangDecodeRounds(3, min_bs=2)
    c.after(type("S", (), {"prefills": (1,)})(), [])
    assert c.remaining == 3 and c.admits([seq(0, 4, 4, [1])]) and c.remaining == 0


def test_a_cadence_on_other_rules_offers_no_prompt_on_a_deferred_step():
    steps = []
    backend = FakeBackend()
    requests = [Request(tuple(range(10, 16)), 6), Request(tuple(range(20, 23)), 4), Request(tuple(range(30, 34)), 3)]
    engine.run(backend, make_strategy("sarathi-serve · cadence decode-rounds:2", 256), requests, 3)
    steps = [(bool(s.prefills), len(s.decodes)) for s in backend.steps]
    # after each step with prompts, two steps of decodes alone while any decode runs
    for i, (prompts, _) in enumerate(steps):
        if prompts:
            assert not any(p for p, d in steps[i + 1:i + 3] if d)
    assert sum(p for p, _ in steps) >= 1


# ---- the SLO budget under an engine's memory ----------------------------------------------------------------------

@pytest.mark.parametrize("rules", ["vllm-v1", "sglang-mixed"])
def test_the_slo_budget_under_paged_memory_keeps_steps_within_the_target_and_preempts(rules):
    backend = SimBackend.load(model="mistral-7b", gpu="a100", sim_pricing="spec")
    backend.kv_cache_tokens = 40_000  # --kv-cache-tokens: a cache that fills, so the paged rules preempt
    pricing = slo_pricing.run_pricing(backend, None)
    s = slo_pricing.priced(make_strategy(compose(rules, "slo")), pricing, 60.0, None)
    test = TestSpec(1730, 415, spread=0.9)
    n = 80
    reqs = make_requests(test, n, backend.vocab_size, 3, ArrivalSpec("poisson", 8.0).times(n, 3, test))
    run = engine.run(backend, s, reqs, 0)
    assert run.kv_policy == "paged" and len(run.requests) == n
    # vLLM admits by free blocks and preempts when a running request cannot grow; SGLang charges every running
    # request its expected output before admitting, so this load fits without a retraction there
    assert (sum(r.preemptions for r in run.requests) > 0) == (rules == "vllm-v1")
    price = pricing.step_price()
    mixed = [r for r in run.steps if r.prefill_chunks]
    assert len(mixed) > 50
    over = [r for r in mixed if r.seconds > 0.060 + 1e-9 and sum(t for _, t in r.prefill_chunks) > 1]
    assert not over, over[:2]
    assert max(sum(t for _, t in r.prefill_chunks) for r in mixed) > 256  # it takes more where few decodes run
    assert price  # priced by the run's cost model


# ---- tune's table and verdict name the parts ----------------------------------------------------------------------

def test_tunes_table_names_each_part_and_its_verdict_the_part_that_decided():
    from prefillbench.bench.capacity import Criteria, SearchResult
    from prefillbench.bench.tune import Config, ConfigResult
    from prefillbench.report import tune as report

    k = Criteria(100)
    capacities = {Config("vllm-v1 · budget slo", None): 6.9, Config("vllm-v1", 1024): 6.2, Config("vllm-v1", 512): 5.4,
                  Config("vllm-v1 · cadence interval:4", 1024): 6.0, Config("sglang-mixed · budget slo", None): 6.5}
    results = [ConfigResult(c, k, [SearchResult(v, [])]) for c, v in capacities.items()]
    table = report.render_ranked(results, 100.0)
    header = table.splitlines()[0]
    assert "| rules " in header and "| budget " in header and "| cadence " in header and "configuration" not in header
    cells = [[c.strip() for c in line.split("|")[2:5]] for line in table.splitlines()[2:]]
    assert cells[0] == ["vllm-v1", "slo", "every"] and ["vllm-v1", "1024", "interval:4"] in cells
    text = report.verdict(results, k)
    # the slo budget leads the best fixed one by 6.9/6.2 - 1 = 11%; the rules lead sglang-mixed's by 6%
    assert "the budget decided: budget slo has +11% capacity over the best with another budget, vllm-v1 (1024)" in text
    assert "the rules vllm-v1 +6%" in text
    records = report.config_records(results, 100.0)
    assert {(r["rules"], r["budget_kind"], r["cadence"]) for r in records} >= {("vllm-v1", "fixed", "interval:4")}


def test_successive_halving_drops_what_short_probes_show_dominated_and_keeps_what_is_within_reach():
    from prefillbench.bench.capacity import Criteria, SearchResult
    from prefillbench.bench.halving import KEEP_WITHIN, keep
    from prefillbench.bench.tune import Config, ConfigResult, GridResult

    k = Criteria(100)
    configs = [Config(f"vllm-v1 · cadence interval:{n}", 512) for n in (2, 3, 4, 5, 6, 7, 8, 9)] + [Config("sequential", None)]
    capacities = [6.0, 5.9, 5.0, 4.0, 3.0, 2.0, 1.0, 0.5, 0.2]  # the 8th and 9th far below the best
    short = GridResult([ConfigResult(c, k, [SearchResult(v, [])]) for c, v in zip(configs, capacities)])
    halved = keep(configs, short, Config("sequential", None))
    within = [c for c, v in zip(configs, capacities) if v >= KEEP_WITHIN * 6.0]
    assert within == configs[:3]
    # those within the share and the baseline kept (no quota: 4 of 9 here), the rest dropped
    assert halved.kept == configs[:3] + [configs[-1]] and halved.dropped == configs[3:8]
    assert halved.hints[configs[0]] == 6.0  # the full round starts at the short round's capacity
    assert "5 of 9 configurations dropped on short probes (250 requests each" in halved.describe(250)

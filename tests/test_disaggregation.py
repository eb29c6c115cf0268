"""Prefill apart from decode (deploy/): the KV's links, the sim deployment's record, its rows and its flags."""
from __future__ import annotations

import math

import pytest

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench.metrics import Load, summarize
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, make_requests
from prefillbench.deploy import Disaggregation, run_requests
from prefillbench.deploy.disaggregated import SimDeployment
from prefillbench.deploy.links import Link, link, transfer_seconds
from strategies import make_strategy


def flat(bw=10e9, latency=1e-5):
    return Link("test", latency, bw, "test")


def test_a_whole_transfer_is_latency_and_bytes_over_the_links_in_parallel():
    assert transfer_seconds(4e9, flat(), 2, 40, "whole", 0.1) == pytest.approx(1e-5 + 2e9 / 10e9)


def test_layer_by_layer_leaves_one_layer_after_the_step_when_the_link_keeps_up():
    # 40 layers of a 1 s step; each layer's 25 MB takes 2.5 ms + 10 us on a 10 GB/s link: only the last is left
    exposed = transfer_seconds(1e9, flat(), 1, 40, "layerwise", 1.0)
    assert exposed == pytest.approx(1e-5 + 1e9 / 40 / 10e9)


def test_layer_by_layer_on_a_slow_link_leaves_what_the_link_could_not_send():
    # 1 GB over 1 GB/s: 1 s of sending against a 0.1 s step, from its first layer's end, back to back
    exposed = transfer_seconds(1e9, flat(bw=1e9), 1, 40, "layerwise", 0.1)
    assert exposed == pytest.approx(0.1 / 40 + 40 * (0.025 + 1e-5) - 0.1, rel=1e-9)
    # the earlier chunks went during their steps, but no faster than the link: 1 s from the first step's start
    assert transfer_seconds(1e9, flat(bw=1e9), 1, 40, "layerwise", 0.1, 0.25, 0.5) == pytest.approx(0.5 + 1e-5, rel=1e-3)


def test_the_measured_links_are_named_with_their_source_and_order_by_speed():
    gb = 1e9
    times = {name: link(name, "A100-SXM").seconds(gb) for name in ("nvlink", "infiniband", "pcie", "ethernet")}
    assert times["nvlink"] < times["pcie"] < times["ethernet"] and times["nvlink"] < times["infiniband"]
    assert "vidur" in link("nvlink", "H100-SXM").source.lower()
    assert "no profile" in link("infiniband", "H200").source


def sim() -> SimBackend:
    return SimBackend.load("llama-13b", "a100")


def poisson(test: TestSpec, n: int, rate: float, vocab: int):
    return make_requests(test, n, vocab, 0, ArrivalSpec("poisson", rate).times(n, 0, test))


def test_every_request_is_prefilled_on_one_instance_and_decoded_on_another_after_its_kv_arrives():
    backend = sim()
    spec = Disaggregation(2, 3)
    test = TestSpec(1024, 32)
    reqs = poisson(test, 60, 4.0, backend.vocab_size)
    run = run_requests(backend, "sequential", None, reqs, 0, spec)
    dep = SimDeployment(backend, spec)
    assert [r.prompt_len for r in run.requests] == [len(q.prompt) for q in reqs]
    for r in run.requests:
        assert len(r.tokens) == 32 and r.instance in (2, 3, 4)
        # the first token on the prefill instance, the KV's transfer, then the decodes on the decode instance
        assert r.token_times[0] < r.kv_arrival <= r.token_times[1]
        assert r.kv_arrival - r.token_times[0] == pytest.approx(dep.link.seconds(backend.model.kv_bytes_per_token * 1024))
    decode_steps = [s for s in run.steps if s.instance >= 2]
    assert decode_steps and not any(s.prefill_chunks for s in decode_steps)
    assert all(s.prefill_chunks for s in run.steps if s.instance < 2)
    row = summarize(test, [run], model="m", backend="sim", strategy="sequential", concurrency=0, chunk_size=None,
                    load=Load("poisson", 4.0), deployment=spec.label)
    # a decode instance runs no prompt: no gap waits behind one (the first gap is the transfer, in no step)
    assert row.tbt_p99_behind_prefill_ms == 0.0
    assert row.kv_transfer_p50_ms > 0 and 0 < row.prefill_busy < 1 and 0 < row.decode_busy <= 1
    assert row.deployment == "P:D 2:3"


def test_a_prefill_instance_runs_what_one_engine_would_run_of_the_prompts_alone():
    # P:D 1:1: the prefill instance's first tokens are those of the same strategy running the prompts alone
    backend = sim()
    test = TestSpec(512, 16)
    reqs = poisson(test, 40, 8.0, backend.vocab_size)
    run = run_requests(backend, "chunked", 256, reqs, 0, Disaggregation(1, 1))
    from dataclasses import replace

    alone = engine.run(backend.instance(1), make_strategy("chunked", 256), [replace(r, n_gen=1) for r in reqs], 0)
    ttft = [r.token_times[0] - r.arrival for r in run.requests]
    assert ttft == pytest.approx([r.token_times[0] - r.arrival for r in alone.requests])


def test_colocated_decodes_wait_behind_prompts_that_disaggregated_ones_never_meet():
    backend = sim()
    test = TestSpec(1536, 64)
    reqs = poisson(test, 80, 3.0, backend.vocab_size)
    rows = {}
    for spec in (None, Disaggregation(1, 1)):
        run = run_requests(backend, "sequential", None, reqs, 0, spec)
        rows[spec] = summarize(test, [run], model="m", backend="sim", strategy="sequential", concurrency=0,
                               chunk_size=None, load=Load("poisson", 3.0))
    colocated, apart = rows[None], rows[Disaggregation(1, 1)]
    assert colocated.tbt_p99_prefill_tokens >= 1536 and colocated.tbt_p99_behind_prefill_ms > 0
    assert apart.tbt_p99_ms < colocated.tbt_p99_ms / 3


@pytest.mark.parametrize("argv, message", [
    (["--pg", "512,32", "-c", "2"], "open loop"),
    (["--pg", "512,32", "--arrival", "poisson", "--rate", "1", "--kv-link", "pcie", "--disaggregate", "1"], "P:D"),
    (["--pg", "512,32", "--arrival", "poisson", "--rate", "1", "--disaggregate", "0:1"], "at least one instance"),
])
def test_bad_deployments_get_one_line(run_cli, argv, message):
    extra = [] if "--disaggregate" in argv else ["--disaggregate", "1:1"]
    result = run_cli("run", "--backend", "sim", *argv, *extra)
    assert result.code == 2 and message in result.err and len(result.err.strip().splitlines()) == 1


def test_deployment_flags_without_a_deployment_are_refused(run_cli):
    result = run_cli("run", "--backend", "sim", "--pg", "512,32", "--kv-link", "pcie")
    assert result.code == 2 and "--disaggregate" in result.err


def test_the_table_names_the_deployment_and_the_transfer(run_cli):
    result = run_cli("run", "--backend", "sim", "--sim-gpu", "a100", "--pg", "1024,32", "--arrival", "poisson",
                     "--rate", "2", "--requests", "40", "-s", "chunked", "--disaggregate", "1:2", "--kv-link",
                     "infiniband", "--no-results-file")
    assert result.code == 0, result.err
    header, _, row = result.out.splitlines()[:3]
    cells = dict(zip([h.strip() for h in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["deployment"] == "P:D 1:2"
    assert float(cells["KV transfer p50 ms"]) > 0
    assert math.isfinite(float(cells["busy P/D"].split("/")[0].rstrip("%")))


# ---- tune --gpus: both designs on the same GPUs ------------------------------------------------------------------
from prefillbench.bench.designs import Design, DesignSearch, design_grid, scaled  # noqa: E402
from prefillbench.bench.metrics import SLO  # noqa: E402


def test_the_grids_use_every_gpu_and_each_pool_at_least_once():
    grid = design_grid(4, ["sequential", "chunked"], [512], [1, 2], ["sequential"], [512])
    assert all(d.gpus == 4 for d in grid)
    colocated = [d for d in grid if d.split is None]
    assert {(d.replicas, d.tp) for d in colocated} == {(4, 1), (2, 2)}
    splits = {(d.split.prefill, d.split.prefill_tp, d.split.decode, d.split.decode_tp) for d in grid if d.split}
    assert splits == {(1, 1, 3, 1), (2, 1, 2, 1), (3, 1, 1, 1), (2, 1, 1, 2), (1, 2, 2, 1), (1, 2, 1, 2)}


def test_scaling_an_slo_scales_every_limit_it_names():
    assert scaled(SLO(ttft_ms=200, tpot_ms=50), 0.5) == SLO(ttft_ms=100, tpot_ms=25)


def test_goodput_is_the_highest_rate_whose_attainment_holds_and_a_looser_slo_never_lowers_it():
    search = DesignSearch(sim(), TestSpec(512, 32), SLO(ttft_ms=200, tpot_ms=60), 0.9, (0.5, 1.0, 2.0), 60)
    for design in (Design("sequential", None, 1, 2), Design("sequential", None, split=Disaggregation(1, 1))):
        result = search.search(design)
        goodput = [result.goodput[s] for s in (0.5, 1.0, 2.0)]
        assert goodput == sorted(goodput) and goodput[-1] > 0
        # at the goodput the attainment holds, at twice the precision above it it does not
        slo = SLO(ttft_ms=200, tpot_ms=60)
        rate = result.goodput[1.0]
        met = lambda run: sum(slo.met(r) for r in run.requests) / len(run.requests)  # noqa: E731
        assert met(search.run(design, rate)) >= 0.9
        assert met(search.run(design, rate * (1 + 2 * search.precision))) < 0.9


def test_tune_gpus_prints_both_designs_and_the_crossover(run_cli, tmp_path):
    result = run_cli("tune", "--backend", "sim", "--sim-gpu", "a100", "--pg", "512,64", "--slo", "ttft=300,tpot=60",
                     "--gpus", "2", "-s", "sequential,chunked", "--chunk-size", "512", "--requests", "40",
                     "--slo-scales", "0.5,1", "--jobs", "1", "--no-progress", "--export", str(tmp_path / "d.csv"),
                     "--plot", str(tmp_path / "p"))
    assert result.code == 0, result.err
    assert "| colocated " in result.out and "| disaggregated " in result.out and "P:D 1:1 sequential" in result.out
    assert "Crossover: " in result.out
    import pandas as pd

    frame = pd.read_csv(tmp_path / "d.csv")
    assert set(frame["design"]) == {"colocated", "disaggregated"} and set(frame["slo_scale"]) == {0.5, 1.0}
    assert (tmp_path / "p" / "designs_crossover.png").is_file()


@pytest.mark.parametrize("argv, message", [
    (["--slo", "ttft=300", "--attainment", "80"], "--gpus"),
    (["--slo", "tbt=50,100", "--gpus", "4"], "one SLO"),
    (["--slo", "ttft=300", "--gpus", "1"], "at least 2 GPUs"),
    (["--slo", "ttft=300", "--gpus", "4", "--disaggregate", "1:1"], "drop --disaggregate"),
])
def test_bad_design_searches_get_one_line(run_cli, argv, message):
    result = run_cli("tune", "--backend", "sim", *argv)
    assert result.code == 2 and message in result.err and len(result.err.strip().splitlines()) == 1


def test_the_crossover_names_who_leads_where_and_a_design_alone_in_meeting_the_slo():
    from prefillbench.report.designs import crossover_line

    rows = [{"scale": 0.5, "ratio": math.inf}, {"scale": 1.0, "ratio": 1.3}, {"scale": 2.0, "ratio": 0.8},
            {"scale": 3.0, "ratio": 1.005}]
    line = crossover_line(rows)
    assert line == ("Crossover: disaggregated leads at SLO x0.5-1 (alone meeting it at x0.5; up to 1.30x per GPU); "
                    "colocated leads at SLO x2 (up to 1.25x per GPU); disaggregated leads at SLO x3 (a tie within 1%)\n")
    from prefillbench.report.designs import crossover_table

    rows = [{"scale": 0.5, "slo": "ttft=125", "colocated": "-", "colocated_per_gpu": 0.0, "disaggregated": "P:D 1:1 x",
             "disaggregated_per_gpu": 1.25, "ratio": math.inf}]
    assert "split only" in crossover_table(rows)


def test_capacity_searches_a_deployment_and_tune_without_gpus_refuses_one(run_cli):
    result = run_cli("capacity", "--backend", "sim", "--sim-gpu", "a100", "--pg", "512,64", "--slo", "tbt=50",
                     "-s", "sequential", "--requests", "60", "--disaggregate", "1:1")
    assert result.code == 0, result.err
    header, _, row = result.out.splitlines()[:3]
    cells = dict(zip([h.strip() for h in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["deployment"] == "P:D 1:1" and float(cells["capacity req/s"]) > 0
    refused = run_cli("tune", "--backend", "sim", "--slo", "tbt=50", "--disaggregate", "1:1")
    assert refused.code == 2 and "--gpus" in refused.err


def test_several_shapes_give_a_crossover_each_and_a_line_per_workload(run_cli, tmp_path):
    result = run_cli("tune", "--backend", "sim", "--sim-gpu", "a100", "--pg", "1024,32", "--pg", "256,256",
                     "--slo", "ttft=400,tpot=60", "--gpus", "2", "-s", "sequential", "--requests", "40",
                     "--slo-scales", "1", "--jobs", "1", "--no-progress", "--plot", str(tmp_path))
    assert result.code == 0, result.err
    assert "Designs on 2 GPUs on pp1024+tg32" in result.out and "Designs on 2 GPUs on pp256+tg256" in result.out
    by = result.out.split("By workload:\n")[1].splitlines()
    assert [line.split(":")[0] for line in by] == ["- pp1024+tg32", "- pp256+tg256"]
    assert {p.name for p in tmp_path.iterdir()} == {"designs_crossover_pp1024+tg32.png",
                                                    "designs_crossover_pp256+tg256.png"}


def test_a_burst_past_capacity_does_not_pass_for_goodput():
    # 60 requests at a rate far past what one A100 serves: they all arrive in a blink and a loose SLO could still be
    # met by most; the queue's growth fails the probe
    search = DesignSearch(sim(), TestSpec(512, 32), SLO(ttft_ms=60_000, tpot_ms=60_000), 0.9, (1.0,), 60)
    design = Design("sequential", None, 1, 1)
    result = search.search(design)
    run = search.run(design, result.goodput[1.0] * 4)
    from prefillbench.bench.metrics import queue_growth

    assert queue_growth(run) > 0.05
    assert result.goodput[1.0] < 1000

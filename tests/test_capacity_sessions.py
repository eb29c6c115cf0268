"""capacity on multi-turn sessions: the searched rate is the rate sessions start at (their later turns follow their
own answers), reported as sessions/s and as the requests/s it offers (a session's turns each count)."""
from __future__ import annotations

import json

import numpy as np

from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench import capacity
from prefillbench.bench.cases import Case
from prefillbench.bench.metrics import SLO
from prefillbench.bench.sessions import SessionSpec
from prefillbench.bench.workloads import sessions_test

SIM = ["--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "a100", "--no-progress"]
SESSIONS = "sessions:n=30,turns=3,system=1024,message=256,answer=32,think=1"


def test_a_sessions_probe_starts_its_sessions_at_the_rate_and_runs_every_turn():
    spec = SessionSpec.parse(SESSIONS)
    test = sessions_test(spec)
    backend = SimBackend.load(sim_model="mistral-7b", sim_gpu="a100", prefix_cache="on")
    config = capacity.CapacityConfig(test, ["vllm-v1"], [512], capacity.Criteria(tbt_p99_ms=1000.0),
                                     requests=spec.n * spec.turns, slo=SLO(tbt_ms=1000.0))
    config.validate()
    probe = capacity.probe_case(backend, Case(test, "vllm-v1", 0, 512), config, rate=0.5)
    assert probe.row.requests == 90  # every turn of every session ran
    # the same sessions, started twice as fast, offer more requests a second
    probes = [capacity.probe_case(backend, Case(test, "vllm-v1", 0, 512), config, rate=r) for r in (0.5, 1.0)]
    assert probes[0].row.offered_rps < probes[1].row.offered_rps
    result = capacity.CapacityResult(Case(test, "vllm-v1", 0, 512), capacity.SearchResult(0.5, [probe]))
    assert result.capacity_rps == 1.5 and result.row.capacity_sessions_per_s == 0.5 and result.row.capacity_rps == 1.5
    assert config.unit == "sessions/s"


def test_the_first_turns_arrivals_follow_the_session_rate():
    spec = SessionSpec.parse(SESSIONS)
    test = sessions_test(spec)
    backend = SimBackend.load(sim_model="mistral-7b", sim_gpu="a100", prefix_cache="on")
    config = capacity.CapacityConfig(test, ["vllm-v1"], [512], capacity.Criteria(tbt_p99_ms=1000.0),
                                     requests=spec.n * spec.turns)
    config.validate()
    rate = 0.5
    from prefillbench import engine

    seen = []
    real_run = engine.run

    def spy(backend, strategy, requests, *args, **kwargs):
        seen.extend(requests)
        return real_run(backend, strategy, requests, *args, **kwargs)

    capacity.engine.run = spy
    try:
        capacity.probe_case(backend, Case(test, "vllm-v1", 0, 512), config, rate=rate)
    finally:
        capacity.engine.run = real_run
    # the first turns arrive as a Poisson process at 0.5 sessions/s: 29 gaps of mean 2 s, a seeded draw whose
    # standard error is 2/sqrt(29) = 0.37 s; four of them bound it, where a rate taken as requests/s (3 a session)
    # would put the mean at 6 s
    firsts = sorted(r.arrival_s for r in seen if r.turn == 0)
    assert len(firsts) == spec.n and len(seen) == spec.n * spec.turns
    mean_gap = float(np.mean(np.diff(firsts)))
    assert abs(mean_gap - 1 / rate) < 4 * (1 / rate) / np.sqrt(spec.n - 1)


def test_capacity_on_sessions_reports_sessions_and_requests_a_second(run_cli, tmp_path):
    export = tmp_path / "cap.json"
    code, out, err = run_cli("capacity", *SIM, "--workload", SESSIONS, "-s", "vllm-v1", "--chunk-size", "512",
                             "--prefix-cache", "on", "--kv-cache-tokens", "8000", "--slo", "tbt=200,ttft=3000",
                             "--requests", "7", "--export", str(export))
    assert code == 0, err
    assert "--requests 7 is ignored: each probe runs the workload's 30 sessions of 3 turns" in err
    assert " sessions/s: P99 TBT " in err
    header = out.splitlines()[0]
    assert "capacity sessions/s" in header and "capacity req/s" in header
    row = json.loads(export.read_text())["results"][0]
    assert row["capacity_sessions_per_s"] > 0 and row["capacity_rps"] == 3 * row["capacity_sessions_per_s"]
    assert out.strip().splitlines()[-1].endswith(f"({row['capacity_sessions_per_s']:.3f} sessions/s)")


def test_tune_still_searches_independent_requests_and_says_where_sessions_go(run_cli):
    code, out, err = run_cli("tune", *SIM, "--workload", SESSIONS, "--slo", "tbt=100")
    assert code == 2 and "multi-turn sessions run with `prefillbench capacity`" in err

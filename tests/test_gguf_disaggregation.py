"""Prefill apart from decode on llama.cpp (deploy/gguf_split.py): two processes, the KV moved by sequence state."""
from __future__ import annotations

import llama_cpp  # noqa: F401  a hard dependency: a broken install fails these tests, not skips them
import pytest

from processes import session_processes

from prefillbench import engine
from prefillbench.backends.gguf import GGUFBackend
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, make_requests
from prefillbench.deploy import Disaggregation, close_deployments, deployment_for
from strategies import make_strategy


def prefill_processes() -> list[str]:
    return session_processes(lambda cmd: "multiprocessing.spawn" in cmd)


@pytest.fixture(scope="module")
def lead(tiny_gguf_path):
    backend = GGUFBackend.load(tiny_gguf_path, kv_type="f32", flash_attn=False, threads=1)
    yield backend
    close_deployments()
    backend.close()


def requests(backend, n=6, rate=20.0):
    test = TestSpec(48, 8)
    return make_requests(test, n, backend.vocab_size, 0, ArrivalSpec("poisson", rate).times(n, 0, test))


@pytest.mark.parametrize("strategy, chunk", [("sequential", None), ("chunked", 16)])
def test_the_decode_instance_continues_each_prompt_exactly_as_one_engine_would(lead, strategy, chunk):
    reqs = requests(lead)
    deployment = deployment_for(lead, Disaggregation(1, 1))
    apart = deployment.run(strategy, chunk, reqs, 0)
    together = engine.run(lead, make_strategy("sequential"), reqs, 0)
    # the state copy is exact (float32 KV): the same greedy tokens, request by request, in the requests' order
    assert [r.tokens for r in apart.requests] == [r.tokens for r in together.requests]
    assert [r.prompt_len for r in apart.requests] == [48] * len(reqs)
    for r in apart.requests:
        assert r.instance == 1 and r.token_times[0] <= r.kv_arrival <= r.token_times[1]
        assert r.arrival <= r.first_scheduled < r.token_times[0]
    assert {s.instance for s in apart.steps} == {0, 1}
    assert all(s.prefill_chunks for s in apart.steps if s.instance == 0)
    assert not any(s.prefill_chunks for s in apart.steps if s.instance == 1)
    meta = deployment.metadata()
    assert meta["prefill_handoffs"] >= len(reqs) and meta["decode_handoffs"] >= len(reqs)


def test_refused_layouts_say_why(lead):
    with pytest.raises(ValueError, match="1:1 only"):
        deployment_for(lead, Disaggregation(2, 1))
    with pytest.raises(ValueError, match="the sim's"):
        deployment_for(lead, Disaggregation(1, 1, link="pcie"))


def test_the_cli_runs_it_and_leaves_no_prefill_process(run_cli, tiny_gguf_path):
    result = run_cli("run", "--backend", "gguf", "-m", tiny_gguf_path, "--pg", "48,8", "--arrival", "poisson",
                     "--rate", "10", "--requests", "6", "-s", "sequential", "--disaggregate", "1:1",
                     "--no-results-file", "-o", "csv")
    assert result.code == 0, result.err
    import io

    import pandas as pd

    row = pd.read_csv(io.StringIO(result.out)).iloc[0]
    assert row["deployment"] == "P:D 1:1" and row["kv_transfer_p50_ms"] >= 0
    assert row["tbt_p99_behind_prefill_ms"] == 0  # the decode instance computes no prompt token
    assert not prefill_processes()


def test_verify_holds_the_deployments_teacher_forced_logits_to_one_engines(run_cli, tiny_gguf_path):
    result = run_cli("run", "--backend", "gguf", "-m", tiny_gguf_path, "--pg", "48,8",
                     "--arrival", "poisson", "--rate", "10", "--requests", "5", "-s", "chunked", "--chunk-size", "16",
                     "--disaggregate", "1:1", "--no-results-file", "--verify")
    assert result.code == 0, result.err
    assert "| chunked (16) P:D 1:1 | chunked (16), one engine |" in " ".join(result.err.split("  "))
    # 5 requests x 8 positions, the first from the prefill process, the rest from the decode instance
    assert "|          40 |" in result.err and "verify: all 1 comparisons agree within tolerance" in result.err


def test_a_killed_prefill_process_is_one_error_not_a_hang(tiny_gguf_path):
    from prefillbench.backends.base import BackendError
    from prefillbench.deploy.gguf_split import GGUFDeployment

    backend = GGUFBackend.load(tiny_gguf_path, threads=1)
    deployment = GGUFDeployment(backend, Disaggregation(1, 1))
    try:
        deployment.process.kill()
        deployment.process.join(5)
        with pytest.raises(BackendError, match="the prefill process ended"):
            deployment.run("sequential", None, requests(backend), 0)
    finally:
        deployment.close()
        backend.close()
    assert not deployment.process.is_alive()

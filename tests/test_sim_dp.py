"""--dp N on the sim: N engine ranks in lockstep (engine/lockstep.py), each its own budget and KV cache, requests
balanced by the engine's rule (engine/dp_balance.py), each step as long as the slowest rank's."""

import pytest

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.specs import SimConfigError
from prefillbench.cli import main
from prefillbench.engine.dp_balance import Balancer, RankLoad, least_loaded_score
from prefillbench.sequence import Request
from prefillbench.step import PrefillChunk, Step
from strategies import make_strategy


def _backend(dp: int) -> SimBackend:
    return SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h100-sxm", sim_pricing="spec", dp=dp)


def _request(prompt: int, gen: int, at: float | None = None) -> Request:
    return Request(tuple([7] * prompt), gen, arrival_s=at)


def _alone(n_prompt: int) -> float:
    """A lone prompt's step on one fresh engine (its clock at 0 and idle before, as a run's first step is)."""
    backend = _backend(1)
    backend.prepare(1, 8192, 4096)
    backend.execute(Step(prefills=(PrefillChunk(0, tuple([7] * n_prompt), 0, True),)))
    return backend.now()


def _first_step(run):
    return [s for s in run.steps if s.start == run.steps[0].start]


def test_each_rank_takes_its_own_budget_in_the_same_step():
    # Two 2048-token prompts at --chunk-size 512 on DP 2: the first step carries 512 prompt tokens on each rank
    # (1024 in the step), where one engine (or one budget shared by the ranks) carries 512 in all.
    reqs = [_request(2048, 4), _request(2048, 4)]
    run = engine.run(_backend(2), make_strategy("vllm-v1", 512), reqs, 2)
    first = _first_step(run)
    assert sorted(s.instance for s in first) == [0, 1]
    assert [sum(n for _, n in s.prefill_chunks) for s in first] == [512, 512]
    one = engine.run(_backend(1), make_strategy("vllm-v1", 512), reqs, 2)
    assert sum(n for s in _first_step(one) for _, n in s.prefill_chunks) == 512


def test_a_full_rank_preempts_while_the_other_has_room():
    # Each rank's own KV cache of 1,200 tokens (--kv-cache-tokens, a copy per rank). Least loaded sends requests
    # 0 and 2 (800 tokens each) to rank 0 and the short 1 and 3 to rank 1: rank 0 cannot hold both long ones and
    # preempts; rank 1 never fills. Pooled (2,400 tokens for all four, 1,640 at most) nothing would be preempted.
    backend = _backend(2)
    backend.kv_cache_tokens = 1200
    reqs = [_request(400, 400), _request(16, 4), _request(400, 400), _request(16, 4)]
    run = engine.run(backend, make_strategy("vllm-v1", 512), reqs, 4)
    assert [r.instance for r in run.requests] == [0, 1, 0, 1]
    assert sum(r.preemptions for r in run.requests[0::2]) > 0
    assert sum(r.preemptions for r in run.requests[1::2]) == 0
    assert run.kv_peak_fraction > 0.9  # the fullest rank's
    assert all(s.preempted == 0 for s in run.steps if s.instance == 1)


def test_vllm_sends_a_request_to_the_least_loaded_rank_and_sglang_round_robin():
    # A decodes 300 tokens on rank 0; B (one token) finished on rank 1 long before C arrives at 0.3 s. vLLM's
    # least loaded sends C to the idle rank 1; SGLang's round robin sends the third request to rank 0.
    reqs = [_request(64, 300, 0.0), _request(64, 1, 0.0), _request(64, 4, 0.3)]
    vllm = engine.run(_backend(2), make_strategy("vllm-v1", 512), reqs, 0)
    assert vllm.requests[0].token_times[-1] > 0.3 > vllm.requests[1].token_times[-1]  # A still runs, B is done
    assert [r.instance for r in vllm.requests] == [0, 1, 1]
    sglang = engine.run(_backend(2), make_strategy("sglang", 512), reqs, 0)
    assert [r.instance for r in sglang.requests] == [0, 1, 0]


def test_least_loaded_weighs_waiting_requests_as_the_kv_fills():
    # vLLM's score: unfinished requests, plus waiting x 6 x (KV use - 0.5) past half the cache.
    assert least_loaded_score(RankLoad(2, 1, 0.4)) == 2
    assert least_loaded_score(RankLoad(2, 1, 1.0)) == 2 + 1 * 6 * 0.5
    # rank 0: 2 unfinished, one waiting on a full cache (5); rank 1: 4 running on a light one (4)
    assert Balancer("least-loaded", 2).choose([RankLoad(2, 1, 1.0), RankLoad(4, 0, 0.2)]) == 1
    # ties go to the first rank of a scan that starts one rank later each request (eng_start_index)
    balancer = Balancer("least-loaded", 3)
    assert [balancer.choose([RankLoad(0, 0, 0.0)] * 3) for _ in range(4)] == [0, 1, 2, 0]
    with pytest.raises(ValueError, match="least-loaded, round-robin"):
        Balancer("random", 2)


def test_a_step_lasts_as_long_as_its_slowest_rank():
    # Rank 0 prefills 2048 tokens while rank 1 prefills 16: both ranks' records span rank 0's step alone, and
    # rank 1's first token waits for it.
    run = engine.run(_backend(2), make_strategy("vllm-v1", 4096), [_request(2048, 2), _request(16, 2)], 2)
    first = _first_step(run)
    assert len(first) == 2 and len({s.end for s in first}) == 1
    assert first[0].seconds == _alone(2048) > _alone(16)
    assert run.requests[1].token_times[0] == run.requests[0].token_times[0] == first[0].end
    # a rank without work runs a dummy batch, which sets no time: one request alone is one engine's step
    lone = engine.run(_backend(2), make_strategy("vllm-v1", 4096), [_request(16, 2)], 1)
    assert lone.steps[0].seconds == _alone(16)


def test_stop_sees_every_ranks_finished_records_in_the_order_they_finished():
    # capacity's stop counts the records it has seen (Progress.finished[seen:]): the list only grows, in finish order
    seen = []
    reqs = [_request(32, 100 + 61 * (i % 5)) for i in range(16)]
    run = engine.run(_backend(2), make_strategy("vllm-v1", 512), reqs, 4,
                     stop=lambda progress: seen.append(list(progress.finished)) or False)
    assert len(seen) >= 2 and len(run.requests) == 16
    for before, after in zip(seen, seen[1:]):
        assert [id(r) for r in after[:len(before)]] == [id(r) for r in before]
    last = [r.token_times[-1] for r in seen[-1]]
    assert last == sorted(last) and {r.instance for r in seen[-1]} == {0, 1}


def test_a_rank_idle_for_some_steps_keeps_the_lockstep_cadence_count():
    # vLLM's prefill interval reads a step counter counted on every rank each step, dummy batches included: a rank
    # that idled while the other stepped admits prompts beside its decodes only on the engine's every 4th step.
    # A decodes on rank 0 throughout (one wave); B comes to the idle rank 1 at 0.2 s, C to rank 0 (a tie, the scan
    # starting there), D to rank 1 while B decodes: D's prompt waits for a step whose index is a multiple of 4.
    reqs = [_request(64, 400, 0.0), _request(64, 200, 0.2), _request(64, 100, 0.3), _request(64, 4, 0.35)]
    run = engine.run(_backend(2), make_strategy("vllm-v1 · budget fixed · cadence interval:4", 512), reqs, 0)
    assert [r.instance for r in run.requests] == [0, 1, 0, 1]
    index = {s.start: i for i, s in enumerate(s for s in run.steps if s.instance == 0)}  # rank 0 steps every step
    first_chunk = [index[r.first_scheduled] for r in run.requests]
    assert first_chunk[1] % 4 != 0  # B started off the cadence: rank 1 had no decode to defer it for
    # D's prompt ran on a multiple of 4 (a rank counting only its own steps would be first_chunk[1] off it)
    assert first_chunk[3] % 4 == 0 and run.requests[3].first_scheduled > run.requests[3].arrival


def _capacity(run_cli, dp: int) -> float:
    result = run_cli("capacity", "--backend", "sim", "--sim-model", "qwen3-30b-a3b", "--sim-gpu", "h100", "--dp",
                     str(dp), "--pg", "2048,32", "--slo", "tbt=100", "-s", "vllm-v1", "--chunk-size", "256",
                     "--requests", "120", "--no-progress")
    assert result.code == 0, result.err
    header, _, row = result.out.splitlines()[:3]
    cells = dict(zip([h.strip() for h in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["limited by"] == "queue growth"
    return float(cells["capacity req/s"])


def test_two_ranks_double_a_budget_bound_capacity(run_cli):
    # 2048-token prompts at 256 tokens a step: the budget bounds capacity (queue growth at a P99 TBT far within
    # 100 ms). Each rank's own budget doubles the prompt tokens a step; a budget shared by the ranks would not.
    # Bounds: the search's 5% bracket on each, and the lockstep's wait for the slower rank (a few %) below 2x.
    one, two = _capacity(run_cli, 1), _capacity(run_cli, 2)
    assert 1.8 * one <= two <= 2.1 * one


def test_rows_say_the_ranks_and_their_balancing():
    backend = _backend(2)
    engine.run(backend, make_strategy("sglang", 512), [_request(64, 2)], 1)
    meta = backend.metadata()
    assert meta["sim_dp"] == 2 and meta["sim_dp_balancing"] == "round-robin"
    assert backend.device.startswith("DP2 x ")


def test_ranks_have_their_own_kv_and_max_num_seqs():
    one, four = _backend(1), _backend(4)
    assert four.max_num_seqs == one.max_num_seqs  # each rank's
    assert four.own_kv_capacity_tokens(2048) == 4 * one.own_kv_capacity_tokens(2048)  # the deployment's
    assert four.max_concurrency(8192) == 4 * min(one.cost.max_sequences(8192, 0), one.max_num_seqs)
    ranks = four.rank_backends()
    assert len(ranks) == 4 and all(r.own_kv_capacity_tokens(2048) == one.own_kv_capacity_tokens(2048) for r in ranks)


def test_unmodelled_combinations_are_refused_in_one_line(capsys):
    with pytest.raises(SimConfigError, match="--ep 4 past --tp 1"):
        SimBackend.load(sim_model="mixtral-8x7b", sim_gpu="h200", ep=4, dp=2)
    with pytest.raises(SimConfigError, match="at least 1"):
        _backend(0)
    assert main(["run", "--backend", "sim", "--sim-model", "llama-3.1-8b", "--sim-gpu", "h100-sxm", "-p", "128",
                 "-n", "4", "--dp", "2", "--pp", "2", "--no-results-file"]) != 0
    err = capsys.readouterr().err
    assert "--dp 2 with --pp 2" in err and "Traceback" not in err


def test_a_trace_beside_dp_is_refused(tmp_path):
    with pytest.raises(SimConfigError, match="--trace with --dp 2"):
        SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h100-sxm", dp=2, trace=str(tmp_path / "t.jsonl"))

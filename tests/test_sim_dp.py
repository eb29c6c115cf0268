"""--dp N on the sim: lockstep ranks, round-robin requests, each step priced as its slowest rank's."""

import pytest

from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.specs import SimConfigError
from prefillbench.cli import main
from prefillbench.step import DecodeToken, PrefillChunk, Step


def _backend(dp: int) -> SimBackend:
    return SimBackend.load(sim_model="llama-3.1-8b", sim_gpu="h100-sxm", sim_pricing="spec", dp=dp)


def _seconds(dp: int, step: Step) -> float:
    """The step's simulated time on a fresh backend (its clock at 0, so the float is the step's own)."""
    backend = _backend(dp)
    backend.prepare(64, 8192, 4096)
    backend.execute(step)
    return backend.now()


def _prefill(seq_id: int, n: int) -> PrefillChunk:
    return PrefillChunk(seq_id, tuple([7] * n), 0, True)


def _decodes(seq_ids, position: int = 1000) -> tuple[DecodeToken, ...]:
    return tuple(DecodeToken(s, 7, position) for s in seq_ids)


def test_step_is_the_slowest_ranks_own_step():
    # DP 2: seq 0 (rank 0) prefills 2048 tokens while seqs 1 and 3 (rank 1) decode. The step lasts as long as rank
    # 0's prefill alone: rank 1's decodes run beside it, not after it.
    step = Step(prefills=(_prefill(0, 2048),), decodes=_decodes([1, 3]))
    dp2 = _seconds(2, step)
    prefill_alone = _seconds(1, Step(prefills=(_prefill(0, 2048),)))
    decodes_alone = _seconds(1, Step(decodes=_decodes([1, 3])))
    whole = _seconds(1, step)
    assert dp2 == max(prefill_alone, decodes_alone) == prefill_alone
    assert dp2 < whole  # one rank running both would be slower: the rule is the max, not the sum


def test_a_rank_with_more_work_sets_the_step():
    # 64 decodes on rank 1 against one short prefill on rank 0: the decoding rank is the slowest.
    step = Step(prefills=(_prefill(0, 16),), decodes=_decodes(range(1, 128, 2), position=6000))
    decodes_alone = _seconds(1, Step(decodes=step.decodes))
    assert _seconds(2, step) == decodes_alone > _seconds(1, Step(prefills=step.prefills))


def test_requests_are_assigned_round_robin_by_arrival():
    # DP 2: seqs 0 and 2 share rank 0, so their prompts are priced as one rank's step; seqs 0 and 1 do not.
    same_rank = Step(prefills=(_prefill(0, 1024), _prefill(2, 1024)))
    other_ranks = Step(prefills=(_prefill(0, 1024), _prefill(1, 1024)))
    assert _seconds(2, same_rank) == _seconds(1, same_rank)
    assert _seconds(2, other_ranks) == _seconds(1, Step(prefills=(_prefill(0, 1024),)))
    assert _seconds(2, other_ranks) < _seconds(2, same_rank)


def test_ranks_pool_kv_and_max_num_seqs():
    one, four = _backend(1), _backend(4)
    assert four.max_num_seqs == 4 * one.max_num_seqs
    assert four.own_kv_capacity_tokens(2048) == 4 * one.own_kv_capacity_tokens(2048)
    assert four.max_concurrency(8192) == min(4 * one.cost.max_sequences(8192, 0), four.max_num_seqs)
    assert not four.runs_decodes  # decode runs price one rank: each step goes through the slowest-rank rule


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

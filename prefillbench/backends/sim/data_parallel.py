"""--dp N on the sim: N data-parallel ranks, each a copy of the --tp/--pp layout, stepping in lockstep.

vLLM's data-parallel engine cores step together for MoE models (vllm/v1/engine/core.py `DPEngineCoreProc`: a rank
with no request runs a dummy batch so the ranks' collectives meet, `run_busy_loop` / `execute_dummy_batch`), so a
step lasts as long as its slowest rank's; SGLang's DP attention syncs its ranks' batches before the MoE layers the
same way (srt/managers/scheduler_components/dp_attn.py `SchedulerDPAttnAdapter.prepare_mlp_sync_batch`, an idle
rank running `get_idle_batch`). Here one scheduler chooses the step for all ranks; each request belongs to one
rank, `seq_id % N` (SGLang's `--load-balance-method round_robin`, srt/managers/data_parallel_controller.py
`round_robin_scheduler`, in arrival order), and the step is priced as the maximum over ranks of that rank's own step (its chunks and decodes alone,
CostModel.fast_seconds). A rank with nothing in the step runs a dummy batch, cheaper than any rank's real one, so it
never sets the step.

What it does not model: each rank's own token budget and cadence counter (the step's budget, --chunk-size, is
the whole step's across ranks, and one cadence paces all ranks, as vLLM's lockstep step counter does), each
rank's own KV pool and max_num_seqs (the engine holds N ranks' worth of both, pooled), and expert parallelism
across the ranks (each rank is priced with its own experts, as with --tp alone; --ep past --tp, the sim's DP
attention on equal shares, is refused beside --dp).
"""

from __future__ import annotations

from prefillbench.backends.sim.specs import SimConfigError
from prefillbench.step import Step


def rank_of(seq_id: int, dp: int) -> int:
    """The data-parallel rank a request runs on: round-robin in arrival order (seq_ids count arrivals)."""
    return seq_id % dp


def slowest_rank_seconds(cost, step: Step, dp: int, after_idle: bool) -> float:
    """The step's time: the slowest rank's own step, each rank priced on its own prefill chunks and decodes."""
    chunks: dict[int, list[tuple[int, int]]] = {}
    emits: dict[int, int] = {}
    decodes: dict[int, int] = {}
    contexts: dict[int, int] = {}
    for c in step.prefills:
        r = c.seq_id % dp
        chunks.setdefault(r, []).append((c.start, len(c.tokens) + c.pad))
        if c.is_last:
            emits[r] = emits.get(r, 0) + 1
    for d in step.decodes:
        r = d.seq_id % dp
        decodes[r] = decodes.get(r, 0) + 1
        contexts[r] = contexts.get(r, 0) + d.position + 1
    slowest = 0.0
    for r in set(chunks) | set(decodes):
        n_dec = decodes.get(r, 0)
        seconds = cost.fast_seconds(chunks.get(r, []), n_dec, contexts.get(r, 0), emits.get(r, 0) + n_dec, None,
                                    after_idle)
        slowest = max(slowest, seconds)
    return slowest


def check_dp(dp: int, *, tp: int, pp: int, ep: int, windows: bool) -> None:
    """One line for each combination --dp does not model."""
    if dp < 1:
        raise SimConfigError(f"--dp must be at least 1, got {dp}")
    if dp == 1:
        return
    if ep > tp:
        raise SimConfigError(f"--dp {dp} with --ep {ep} past --tp {tp}: expert parallelism across data-parallel ranks "
                             "is not modelled beside --dp (each rank is priced with its own experts); drop one")
    if pp > 1:
        raise SimConfigError(f"--dp {dp} with --pp {pp}: pipeline stages are not modelled beside --dp")
    if windows:
        raise SimConfigError(f"--dp {dp}: models with sliding-window layers are not modelled beside --dp")


__all__ = ["check_dp", "rank_of", "slowest_rank_seconds"]

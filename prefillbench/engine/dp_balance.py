"""Which data-parallel rank a request goes to as it arrives: the engine's own rule (lockstep.py asks once a request).

- `least-loaded`, vLLM 0.32's (vllm/v1/engine/core_client.py `DPLBAsyncMPClient.get_core_engine_for_request`,
  the API server's client with the DP coordinator, vllm/v1/engine/coordinator.py): each rank scored
  `max(client_count * inflight, waiting + running) + waiting * 6 * max(0, kv_cache_usage - 0.5)` (the waiting
  requests weigh more only as the rank's KV cache fills past half: "a queue on a KV-bound engine drains slowly"),
  the lowest score wins, ties to the first in a scan that starts one rank later for each request
  (`eng_start_index`). With one API server (client_count 1) the in-flight count, exact (the client's own count of
  its unfinished requests on the rank), is never below the coordinator's snapshot of waiting + running, so the
  first term is the rank's unfinished requests. Here every count is read at the request's arrival; vLLM reads
  waiting and KV use from the coordinator's snapshot (published at most every 100 ms, `stats_update_interval_ms`)
  plus its own increments, so under a burst its penalty term may lag by up to that.
- `round-robin`, SGLang 0.5.23's default (`--load-balance-method auto`, resolved to round_robin outside P/D:
  srt/arg_groups/serving_hook.py `handle_load_balance_method`; srt/managers/data_parallel_controller.py
  `round_robin_scheduler`): the k-th request to rank k mod N.

vLLM's "waiting" is its scheduler's WAITING queue: requests never scheduled and preempted ones; a prompt whose
chunks have started is RUNNING there. `RankLoad` says it so.
"""
from __future__ import annotations

from dataclasses import dataclass

#: The rules each engine balances by, as a strategy names its engine's (Strategy.dp_balance).
BALANCING = {
    "least-loaded": "vLLM's DPLBAsyncMPClient: fewest unfinished requests, waiting ones weighed up as the KV fills",
    "round-robin": "SGLang's --load-balance-method round_robin (its default): in arrival order",
}


@dataclass(frozen=True)
class RankLoad:
    """A rank's load as the balancer reads it: its unfinished requests (queued, waiting or running), of those the
    ones in vLLM's WAITING queue (not started, or preempted), and the share of its KV blocks in use."""

    unfinished: int
    waiting: int
    kv_usage: float


def least_loaded_score(load: RankLoad) -> float:
    """vLLM's score of a rank with one API server (core_client.py get_core_engine_for_request; module docstring):
    lower is chosen. Its first term, max(inflight, waiting + running), is the unfinished requests here."""
    score = float(load.unfinished)
    if load.waiting:
        score += load.waiting * 6.0 * max(0.0, load.kv_usage - 0.5)
    return score


class Balancer:
    """One run's balancing: `choose` the rank of each request in arrival order."""

    def __init__(self, rule: str, ranks: int) -> None:
        if rule not in BALANCING:
            raise ValueError(f"unknown data-parallel balancing {rule!r}: one of {', '.join(BALANCING)}")
        self.rule = rule
        self.ranks = ranks
        self.counter = 0  # SGLang's round_robin_counter; vLLM's eng_start_index (client_index 0: from 0)

    def choose(self, loads: list[RankLoad]) -> int:
        n = self.ranks
        start = self.counter
        self.counter = (self.counter + 1) % n
        if self.rule == "round-robin":
            return start
        best, best_score = start, None
        for i in range(n):
            idx = (start + i) % n
            score = least_loaded_score(loads[idx])
            if best_score is None or score < best_score:
                best, best_score = idx, score
        return best


__all__ = ["BALANCING", "Balancer", "RankLoad", "least_loaded_score"]

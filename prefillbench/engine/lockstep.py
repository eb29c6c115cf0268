"""Data-parallel ranks in lockstep (the sim's --dp N): N engines, each its own strategy, KV memory and max_num_seqs
on a backend of its own, stepping together as vLLM and SGLang step their ranks for MoE models.

vLLM's data-parallel engine cores each run their own Scheduler (vllm/v1/engine/core.py `DPEngineCoreProc`): a
rank's step is its own choice, within its own token budget, KV cache and max_num_seqs; the ranks' forward passes
meet in the MoE layers' collectives, so a rank with no request runs `execute_dummy_batch` and every rank's step
lasts as long as the slowest one's; `step_counter`, which the prefill interval reads, is counted on every rank
each step, dummy or not (`_has_global_unfinished_reqs`), so it is the same on every rank, while the capacity
guard (`Scheduler.prefill_capacity_bound`) is each rank's own. SGLang's DP attention runs one scheduler per rank
the same way and syncs their batches before the MoE layers (srt/managers/scheduler_components/dp_attn.py
`SchedulerDPAttnAdapter.prepare_mlp_sync_batch`, an idle rank running `get_idle_batch`).

So each lockstep step here: every rank with work asks its strategy for its step (preemptions, late frees and the
cadence as engine/loop.py carries them out for one engine), each rank's backend prices its own step, and the step
ends when the slowest rank's does; a rank without work runs a dummy batch, which sets no time, and its cadence
counts the step (Strategy.dummy_step). Requests go to a rank as they arrive, by the engine's rule
(dp_balance.py: vLLM's least loaded, SGLang's round robin), and the run's concurrency caps them across ranks. The
record is one run: every step tagged with its rank (StepRecord.instance), every request with the rank it ran on,
the KV peak the fullest rank's, the preemptions each request's own.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from collections import deque
from collections.abc import Callable

from strategies import Strategy

from prefillbench.backends.base import BackendError, StepBackend
from prefillbench.engine.dp_balance import Balancer, RankLoad
from prefillbench.engine.loop import STOP_CHECK_STEPS, Loop
from prefillbench.engine.records import Progress, RunRecord
from prefillbench.engine.setup import admission_for, set_up
from prefillbench.sequence import Request


def run_lockstep(lead: StepBackend, strategy: Strategy, reqs: list[Request], open_loop: bool, concurrency: int,
                 longest_prompt: int, max_seq_len: int, *, keep_logits: bool = False,
                 on_tokens: Callable[[int], None] | None = None, stop: Callable[[Progress], bool] | None = None,
                 feed=None) -> RunRecord:
    """engine.run for a backend of `lead.data_parallel` ranks (module docstring); the requests as engine.run
    checked them (an open loop's by arrival)."""
    n = lead.data_parallel
    if feed is not None:
        raise BackendError(f"--dp {n}: requests fed during the run (a split deployment's) are not modelled")
    if strategy.speculation is not None:
        raise BackendError(f"--spec {strategy.speculation.label} with --dp {n}: not modelled")
    if any(r.session is not None for r in reqs):
        raise ValueError(f"--dp {n}: multi-turn sessions are not modelled beside data-parallel ranks (a session's "
                         "turns would follow one rank)")
    backends = lead.rank_backends()
    # every rank the same rules, budget and cadence, each with its own state: a copy, the budget's price shared
    memo: dict[int, object] = {}
    for shared in (getattr(strategy.budget_part, "price", None), getattr(strategy, "memory", None)):
        if shared is not None:
            memo[id(shared)] = shared
    strategies = [strategy] + [copy.deepcopy(strategy, dict(memo)) for _ in range(n - 1)]
    asked = min(concurrency or len(reqs), len(reqs))  # least loaded may send a rank any of them
    start = lead.now()
    loops: list[Loop] = []
    for r, (backend, rules) in enumerate(zip(backends, strategies)):
        backend.kv_cache_tokens = lead.kv_cache_tokens  # --kv-cache-tokens: each rank's cache, a copy of the layout
        if r:  # the ranks are alike: a clamp is said once
            backend.said_clamps = backends[0].said_clamps
        cap, memory, _, _ = set_up(backend, rules, reqs, asked, longest_prompt, max_seq_len, keep_logits)
        backend.wait_until(start, idle=True)
        admission = admission_for(backend, rules, memory, [], open_loop, cap, start)
        loops.append(Loop(backend, rules, admission, memory, 1, False, keep_logits, on_tokens, None))
    lead.clamped = backends[0].clamped
    rule = strategy.dp_balance
    lead.dp_balancing = lead.dp_balancing | {rule}
    return Lockstep(lead, loops, Balancer(rule, n), reqs, open_loop, concurrency, start, stop).run()


class Lockstep:
    """One data-parallel run from its start to its record: the ranks' loops, the requests not dispatched yet."""

    def __init__(self, lead: StepBackend, loops: list[Loop], balancer: Balancer, reqs: list[Request],
                 open_loop: bool, concurrency: int, start: float, stop: Callable[[Progress], bool] | None) -> None:
        self.lead, self.loops, self.balancer = lead, loops, balancer
        self.pending = deque(enumerate(reqs))  # (index in the run, request), by arrival
        self.open_loop, self.concurrency, self.start, self.stop = open_loop, concurrency, start, stop
        self.dispatched: list[list[int]] = [[] for _ in loops]  # each rank's requests, in its admission order
        self.steps = 0  # lockstep steps
        # every rank's finished records in the order they finished, only ever appended to (what `stop` reads: a
        # caller counts the records it has seen), and how many of each rank's it holds
        self.finished: list = []
        self.taken = [0] * len(loops)

    def load(self, loop: Loop) -> RankLoad:
        """What the balancer reads of a rank: its unfinished requests, those in vLLM's WAITING (queued, or not
        started since admitted or preempted: no chunk computed past what its cache held) and its KV blocks' use."""
        a, memory = loop.admission, loop.memory
        waiting = len(a.pending) + sum([s.n_prefilled <= s.n_cached for s in a.waiting])
        usage = memory.used / memory.total_blocks if memory.total_blocks else 0.0
        return RankLoad(len(a.pending) + len(a.live), waiting, usage)

    def in_flight(self) -> int:
        return sum([len(lp.admission.pending) + len(lp.admission.live) for lp in self.loops])

    def may_dispatch(self) -> bool:
        return self.concurrency == 0 or self.in_flight() < self.concurrency

    def dispatch(self, now: float) -> None:
        """The requests that have arrived by `now` (a closed loop's: all), each to its rank, while the run's
        concurrency allows."""
        pending, loops, start = self.pending, self.loops, self.start
        while pending and (not self.open_loop or start + pending[0][1].arrival_s <= now) and self.may_dispatch():
            index, request = pending.popleft()
            r = self.balancer.choose([self.load(lp) for lp in loops])
            self.dispatched[r].append(index)
            loops[r].admission.hand(request)

    def working(self) -> bool:
        return bool(self.pending) or any(lp.admission.pending or lp.live for lp in self.loops)

    def run(self) -> RunRecord:
        loops = self.loops
        clock = loops[0].backend
        stopped = False
        while self.working():
            now = clock.now()
            self.dispatch(now)
            for lp in loops:
                if now >= lp.admission.next_at:
                    lp.admission.admit(now)
            chosen, asked = [], set()
            for r, lp in enumerate(loops):
                if lp.waiting or lp.running:
                    asked.add(r)
                    step = choose(lp)
                    if step:
                        chosen.append((r, step))
            if chosen:
                self.lockstep(chosen, asked)
                if self.stop is not None and self.steps % STOP_CHECK_STEPS == 0 and self.working() and self.stop(
                        self.progress()):
                    stopped = True
                    break
                continue
            self.wait(now)
        return self.record(stopped)

    def lockstep(self, chosen: list, asked: set[int]) -> None:
        """One step of every rank: each rank's own launched, the step's end the slowest's, each retired there."""
        loops = self.loops
        launched = [(r, step, loops[r].launch(step)) for r, step in chosen]
        end = max([la.end for _, _, la in launched])
        for lp in loops:
            lp.backend.join_step(end)
            lp.admission.idle_from = None  # a rank without work ran a dummy batch: the engine was not idle
        for r, step, la in launched:
            la.end = end
            record = loops[r].steps[-1]
            record.end, record.instance = end, r
            loops[r].retire(step, la)
        for r, lp in enumerate(loops):
            if r not in asked:  # its dummy batch: the step counted, nothing chosen
                lp.strategy.dummy_step()
            if len(lp.done) > self.taken[r]:
                self.finished += lp.done[self.taken[r]:]
                self.taken[r] = len(lp.done)
        self.steps += 1

    def wait(self, now: float) -> None:
        """No rank can step: let the clock pass to the next arrival (every rank's clock alike)."""
        loops = self.loops
        events = []
        if self.pending and self.open_loop and self.may_dispatch():
            events.append(self.start + self.pending[0][1].arrival_s)
        events += [t for lp in loops if (t := lp.admission.next_arrival()) is not None]
        if not events:
            raise RuntimeError(f"strategy {loops[0].strategy.name} produced an empty step with work left")
        if loops[0].admission.idle_from is None:
            for lp in loops:
                lp.admission.idle_from = now
            if not any(lp.live for lp in loops):  # the wave ends: every rank's count restarts (cadence.py)
                for lp in loops:
                    lp.strategy.idle()
        for lp in loops:
            lp.backend.wait_until(min(events), idle=True)

    def progress(self) -> Progress:
        loops = self.loops
        return Progress(self.start, loops[0].backend.now(), self.finished,
                        [seq for lp in loops for seq in lp.live.values()],
                        deque([req for _, req in self.pending] + [req for lp in loops for req in lp.admission.pending]))

    def record(self, stopped: bool) -> RunRecord:
        """One run's record: the requests in the run's order, each with its rank, the steps by start and rank."""
        loops = self.loops
        records = [lp.record(stopped) for lp in loops]
        end = max(rec.end for rec in records)
        self.lead.join_step(end)
        by_index = {}
        for r, (lp, rec) in enumerate(zip(loops, records)):
            for seq_id, request in zip(sorted(lp.done_ids), rec.requests):
                request.instance = r
                by_index[self.dispatched[r][seq_id]] = request
        steps = sorted([s for rec in records for s in rec.steps], key=lambda s: (s.start, s.instance))
        peaks = [rec.kv_peak_fraction for rec in records if not math.isnan(rec.kv_peak_fraction)]
        return RunRecord(self.start, end, [by_index[i] for i in sorted(by_index)], steps, stopped,
                         arrival_lags=[lag for rec in records for lag in rec.arrival_lags],
                         kv_peak_fraction=max(peaks) if peaks else math.nan, kv_policy=records[0].kv_policy,
                         kv_cache=summed_cache_stats([rec.kv_cache for rec in records]))


def choose(loop: Loop):
    """A rank's next step as engine/loop.py's pass takes it: preemptions and a step late's frees carried out, the
    strategy asked again where they were all it chose."""
    while True:
        step = loop.strategy.next_step(loop.waiting, loop.running)
        if step.preempted:
            loop.preempt(step)
            if not step:
                continue
        if loop.late:
            for seq_id in loop.late:
                loop.memory.free(seq_id)
            loop.late.clear()
            if not step:
                continue
        return step


def summed_cache_stats(stats: list):
    """The ranks' block caches' counters summed (engine/block_cache.py CacheStats); None without a cache."""
    kept = [s for s in stats if s is not None]
    if not kept:
        return None
    return dataclasses.replace(kept[0], **{f.name: sum(getattr(s, f.name) for s in kept)
                                           for f in dataclasses.fields(kept[0]) if f.name != "host"})


__all__ = ["Lockstep", "run_lockstep"]

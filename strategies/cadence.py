"""A scheduler's cadence: on which steps prompts may run at all. One of the three parts a scheduler is composed of
(compose.py), beside its engine's rules and its budget. The rules ask `admits(running)` once a step, before they
choose it, and tell `after(step, waiting)` what they chose; on a step the cadence defers, the rules run their
decodes only, by their own memory rules (vllm-v1 and sglang follow their engine's deferral exactly; every other
rules strategy is offered no waiting prompt on such a step: prefillbench's own combinations).

A cadence trades TTFT for TBT by steps, not by tokens: the prompts a budget lets in still stall the decodes beside
them, but on fewer steps.

- every (`None`: no part): prompts may run on every step, every engine's default.
- interval:N (`VllmInterval`), vLLM 0.32's --prefill-schedule-interval (vllm#44558): new prefills only on steps
  whose counter is a multiple of N (`DPEngineCoreProc._should_throttle_prefills`, vllm/v1/engine/core.py: the
  counter counts engine steps and returns to 0 when a wave ends: at the first DP sync, every dp_sync_interval (16)
  steps, that finds no rank with work; between, vLLM runs dummy batches and keeps counting, while here the counter
  restarts as the engine goes idle: the one difference benchmarks/engine/vllm_throttle_steps.py finds, for a
  request arriving within that tail); on a throttled step
  `Scheduler.schedule(throttle_prefills=True)` (vllm/v1/core/sched/scheduler.py) defers the prompts in progress in
  RUNNING and every WAITING request with more than one token to compute, but only while a decode runs (`any(not
  r.is_prefill_chunk for r in self.running)`) and only if the last unthrottled step drained the waiting queue
  (`prefill_capacity_bound`: set on every step that ran the WAITING loop unthrottled, to whether requests were left
  waiting after it). EngineCore sets the flag only in its data-parallel core: a served vLLM with one data-parallel
  rank ignores the flag (compose.launch_flags says so).
- decode-rounds:N[:min-bs=M] (`SglangDecodeRounds`), SGLang 0.5.23's --prefill-decode-interval and
  --prefill-decode-interval-min-bs (sglang#35017): after a batch with prompts (extend or mixed), N scheduler rounds
  defer the next prefill (`Scheduler._arm_prefill_decode_interval`, `_should_defer_prefill`,
  srt/managers/scheduler.py); a round whose running batch holds fewer than M requests ends the interval. A round
  with nothing running SGLang spends idle (no batch); here such rounds are counted down at once, since an idle
  round runs no forward pass (its loop turns round in microseconds), and a step is never empty while work waits.
"""
from __future__ import annotations


class VllmInterval:
    """vLLM's prefill schedule interval and its capacity guard (module docstring)."""

    kind = "interval"

    def __init__(self, interval: int) -> None:
        if interval < 1:
            raise ValueError(f"cadence interval:{interval}: vLLM's --prefill-schedule-interval is at least 1")
        self.interval = interval
        self.reset()

    @property
    def spec(self) -> str:
        return f"interval:{self.interval}"

    def reset(self) -> None:
        self.step_counter = 0  # DPEngineCoreProc.step_counter
        self.capacity_bound = False  # Scheduler.prefill_capacity_bound
        self.deferred = False  # this step's defer_prefills

    def idle(self) -> None:
        self.step_counter = 0  # a new wave: run_busy_loop resets it at its next DP sync (module docstring)

    def dummy_step(self) -> None:
        """Its data-parallel rank ran a dummy batch: vLLM counts it (run_busy_loop's `_has_global_unfinished_reqs`
        on every rank, so the counter is the same on all); its scheduler did not run, so the guard stays."""
        self.step_counter += 1

    def admits(self, running) -> bool:
        throttle = self.interval > 1 and self.step_counter % self.interval != 0
        self.step_counter += 1  # _has_global_unfinished_reqs: once per engine step
        self.deferred = throttle and not self.capacity_bound and bool(running)
        return not self.deferred

    def after(self, step, waiting) -> None:
        """The step chosen: on a step that ran the WAITING loop unthrottled (none preempted), whether the waiting
        queue was left holding requests (`num_waiting > len(self.deferred_waiting)`, none deferred for other
        reasons here)."""
        if self.deferred or step.preempted:
            return
        scheduled = {c.seq_id for c in step.prefills}
        self.capacity_bound = any(s.n_prefilled == 0 and s.seq_id not in scheduled for s in waiting)


class SglangDecodeRounds:
    """SGLang's prefill-decode interval (module docstring)."""

    kind = "decode-rounds"

    def __init__(self, rounds: int, min_bs: int = 0) -> None:
        if rounds < 0 or min_bs < 0:
            raise ValueError("cadence decode-rounds:N:min-bs=M: SGLang refuses a negative interval or min-bs "
                             "(validate_prefill_decode_interval)")
        self.rounds = rounds
        self.min_bs = min_bs
        self.reset()

    @property
    def spec(self) -> str:
        return f"decode-rounds:{self.rounds}" + (f":min-bs={self.min_bs}" if self.min_bs else "")

    def reset(self) -> None:
        self.remaining = 0  # _prefill_decode_interval_remaining

    def idle(self) -> None:
        """SGLang keeps the count through idle rounds; with nothing running it is counted down at once anyway."""

    def dummy_step(self) -> None:
        """Its DP rank ran an idle batch: with nothing running the next round's check ends the interval anyway."""

    def admits(self, running) -> bool:
        if self.remaining == 0:
            return True
        if len(running) < self.min_bs or not running:  # not running: SGLang's idle rounds, at once (docstring)
            self.remaining = 0
            return True
        self.remaining -= 1
        return False

    def after(self, step, waiting) -> None:
        if self.rounds and step.prefills:  # _arm_prefill_decode_interval: the batch run is extend (or mixed)
            self.remaining = self.rounds


#: The cadences --cadence names: what each is, and which engine ships it.
CADENCES = {
    "every": "prompts may run on every step (every engine's default)",
    "interval": "interval:N, new prompts only every Nth step unless the queue could not drain (vLLM 0.32's "
                "--prefill-schedule-interval)",
    "decode-rounds": "decode-rounds:N[:min-bs=M], N decode rounds after a batch with prompts (SGLang 0.5.23's "
                     "--prefill-decode-interval)",
}


def make_cadence(spec: str):
    """The cadence part --cadence names (None: every step); ValueError naming the kinds."""
    kind, *rest = spec.split(":")
    if kind == "every" and not rest:
        return None
    if kind == "interval" and len(rest) == 1 and rest[0].isdigit():
        return None if int(rest[0]) == 1 else VllmInterval(int(rest[0]))
    if kind == "decode-rounds" and rest and rest[0].isdigit():
        min_bs = 0
        for part in rest[1:]:
            key, eq, value = part.partition("=")
            if key != "min-bs" or not eq or not value.isdigit():
                raise ValueError(f"cadence {spec!r}: decode-rounds takes min-bs=M after its N")
            min_bs = int(value)
        return None if int(rest[0]) == 0 else SglangDecodeRounds(int(rest[0]), min_bs)
    raise ValueError(f"unknown cadence {spec!r}; choose from every, interval:N, decode-rounds:N[:min-bs=M]")


__all__ = ["CADENCES", "SglangDecodeRounds", "VllmInterval", "make_cadence"]

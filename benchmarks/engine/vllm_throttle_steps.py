"""vLLM 0.32's prefill cadence (`--prefill-schedule-interval N`) against `vllm-v1 --cadence interval:N`, step for
step: vLLM's own `Scheduler.schedule(throttle_prefills=...)` driven in-process as its data-parallel EngineCore drives
it (benchmarks/engine/vllm_throttle_reference.py, run by `make vllm`'s python), and prefillbench's engine with the
composed strategy on a step clock (every step one virtual second, as sglang_steps does), on the same seeded arrivals.

    python -m benchmarks.engine.vllm_throttle_steps                       # the presets: a seeded trace, the guard
    python -m benchmarks.engine.vllm_throttle_steps --seed 5 --requests 40 --interval 8
    python -m benchmarks.engine.vllm_throttle_steps --random 12          # random cases, each its own settings

Compared each step: the prompt chunks (request, tokens, in schedule order) and the decoding requests. A step where
vLLM's loop ran a dummy batch (its wave still running, no request of its own) is idle on both sides. Printed: steps
equal of steps, the steps where the throttle deferred prompts and where its capacity guard lifted it, and the first
step that differs with both sides.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from tabulate import tabulate

from prefillbench import engine
from prefillbench.errors import BackendError
from prefillbench.sequence import Request
from strategies import compose, make_strategy

from benchmarks.engine.sglang_steps import StepClock
from benchmarks.lib import cli

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "benchmarks.engine.vllm_throttle_reference"
BLOCK = 16
NUM_BLOCKS = 100_000  # memory no trace here fills: the cadence alone decides (preemption is vllm_steps' proof)


@dataclass(frozen=True)
class TraceRequest:
    id: int
    prompt_len: int
    output_len: int
    arrival_step: int


@dataclass(frozen=True)
class Config:
    budget: int  # --max-num-batched-tokens
    max_num_seqs: int
    interval: int  # --prefill-schedule-interval
    num_blocks: int = NUM_BLOCKS
    block_size: int = BLOCK


@dataclass(frozen=True)
class Case:
    name: str
    trace: list[TraceRequest]
    config: Config


def make_trace(seed: int, n: int, max_prompt: int, max_output: int, mean_gap: float) -> list[TraceRequest]:
    """Seeded requests, exponential gaps between arrivals (in steps), uniform prompt and output lengths."""
    rng = random.Random(seed)
    out, step = [], 0
    for i in range(n):
        if i:
            step += int(rng.expovariate(1.0 / mean_gap)) if mean_gap > 0 else 0
        out.append(TraceRequest(i, rng.randint(2, max_prompt), rng.randint(1, max_output), step))
    return out


def presets() -> list[Case]:
    return [
        # decodes and new prompts interleaved: the throttle defers prompts to every 4th step, queue drains
        Case("seeded, interval 4", make_trace(0, 24, 200, 40, 6.0), Config(budget=128, max_num_seqs=8, interval=4)),
        # a burst the budget and max-num-seqs cannot drain: the guard lifts the throttle until the queue empties
        Case("guard: undrained queue", make_trace(1, 30, 300, 24, 0.7), Config(budget=96, max_num_seqs=4,
                                                                               interval=4)),
    ]


def random_cases(seed: int, n: int) -> list[Case]:
    """n seeded cases, each its own interval (2-8), budget, max-num-seqs and arrival rate (a mean gap of 20 steps
    leaves the engine idle between requests: vLLM's dummy-batch tail, docs/scheduler-parts.md)."""
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        config = Config(budget=rng.choice([32, 64, 128, 256]), max_num_seqs=rng.randint(2, 8),
                        interval=rng.randint(2, 8))
        trace = make_trace(rng.randrange(1 << 30), 20, 200, 30, rng.choice([0.5, 3.0, 8.0, 20.0]))
        cases.append(Case(f"random {i}", trace, config))
    return cases


@dataclass(frozen=True)
class StepView:
    prefill: tuple[tuple[int, int], ...] = ()
    decode: tuple[int, ...] = ()
    throttle: bool = False  # vLLM's side: the flag EngineCore passed

    def same(self, other: "StepView") -> bool:
        return self.prefill == other.prefill and self.decode == other.decode

    def __str__(self) -> str:
        if not self.prefill and not self.decode:
            return "idle"
        return f"prefill {list(self.prefill)} decode {list(self.decode)}"


def references(cases: list[Case], python: Path | None = None) -> list[list[StepView]]:
    """vLLM's own steps for each case, all in one run of the reference (one import of vLLM)."""
    if python is None:
        python = vllm_python()
    given = {"jobs": [{"config": asdict(c.config), "requests": [asdict(r) for r in c.trace]} for c in cases]}
    done = subprocess.run([str(python), "-W", "ignore", "-m", REFERENCE], input=json.dumps(given), capture_output=True,
                          text=True, cwd=ROOT, timeout=1800)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-6:])
        raise BackendError(f"vLLM's reference failed (exit {done.returncode}): {tail}")
    out: list[dict[int, StepView]] = [{} for _ in cases]
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            out[d["job"]][d["step"]] = StepView(tuple(map(tuple, d["prefill"])), tuple(d["decode"]), d["throttle"])
    return [[steps.get(i, StepView()) for i in range(max(steps, default=-1) + 1)] for steps in out]


def vllm_python() -> Path:
    from prefillbench.backends.server import vllm_env

    python = vllm_env.env_dir() / "bin" / "python"
    if not python.is_file():
        raise BackendError("no vLLM: `make vllm` installs one for the project")
    return python


def strategy_steps(case: Case) -> list[StepView]:
    """The trace through prefillbench's engine, `vllm-v1 · cadence interval:N` at the budget and max-num-seqs."""
    order = sorted(case.trace, key=lambda r: (r.arrival_step, r.id))  # the engine numbers sequences as it admits them
    requests = [Request(tuple(3 + i % 1000 for i in range(r.prompt_len)), r.output_len,
                        arrival_s=0.0 if r.arrival_step == 0 else r.arrival_step - 0.5) for r in order]
    backend = StepClock()
    strategy = make_strategy(compose("vllm-v1", "fixed", f"interval:{case.config.interval}"), case.config.budget)
    # vLLM's max_num_seqs as the strategy's own cap, not the run's -c: the requests past it stay in WAITING, where
    # the capacity guard counts them (num_waiting), instead of being held back outside the engine
    strategy.max_num_seqs = case.config.max_num_seqs
    engine.run(backend, strategy, requests, 0)
    ids = [r.id for r in order]
    by_start: dict[int, StepView] = {}
    for start, step, _evicted in backend.started:
        if start in by_start:
            raise BackendError(f"two engine steps started at second {start}: a step took other than one second")
        by_start[start] = StepView(tuple((ids[c.seq_id], len(c.tokens)) for c in step.prefills),
                                   tuple(sorted(ids[d.seq_id] for d in step.decodes)))
    return [by_start.get(i, StepView()) for i in range(max(by_start, default=-1) + 1)]


@dataclass
class Comparison:
    case: Case
    vllm: list[StepView]
    ours: list[StepView]

    def pairs(self):
        n = max(len(self.vllm), len(self.ours))
        pad = lambda side: side + [StepView()] * (n - len(side))  # noqa: E731 (trailing idle turns: dummy batches)
        return list(zip(pad(self.vllm), pad(self.ours)))

    @property
    def steps(self) -> int:
        return sum(1 for v, o in self.pairs() if v.prefill or v.decode or o.prefill or o.decode)

    @property
    def equal(self) -> int:
        return sum(1 for v, o in self.pairs() if (v.prefill or v.decode or o.prefill or o.decode) and v.same(o))

    @property
    def deferred(self) -> int:
        """Throttled steps on which vLLM ran no prompt while one waited or was in progress."""
        return sum(1 for v, _ in self.pairs() if v.throttle and v.decode and not v.prefill)

    @property
    def guarded(self) -> int:
        """Throttled steps on which vLLM ran prompts anyway (its capacity guard, or no decode to protect)."""
        return sum(1 for v, _ in self.pairs() if v.throttle and v.prefill and v.decode)

    def first_mismatch(self) -> str:
        for i, (v, o) in enumerate(self.pairs()):
            if not v.same(o):
                return f"step {i}: vLLM {v} | vllm-v1 {o}"
        return ""


def compare(cases: list[Case], python: Path | None = None) -> list[Comparison]:
    return [Comparison(c, v, strategy_steps(c)) for c, v in zip(cases, references(cases, python))]


def table(results: list[Comparison]) -> str:
    rows = [[r.case.name, len(r.case.trace), r.case.config.interval, r.case.config.budget, r.case.config.max_num_seqs,
             f"{r.equal} of {r.steps}", r.deferred, r.guarded, r.first_mismatch() or "-"] for r in results]
    return tabulate(rows, headers=["case", "requests", "interval", "budget", "max-num-seqs", "steps equal",
                                   "throttled, decodes only", "throttled, prompts run", "first difference"])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, help="one seeded trace instead of the presets (with --random: the cases' seed)")
    parser.add_argument("--random", type=int, default=0, metavar="N", help="N random cases, each its own settings")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--interval", type=int, default=4, help="--prefill-schedule-interval N (at least 2)")
    parser.add_argument("--budget", type=int, default=128, help="--max-num-batched-tokens")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-prompt", type=int, default=200)
    parser.add_argument("--max-output", type=int, default=40)
    parser.add_argument("--mean-gap", type=float, default=6.0, help="mean steps between arrivals")


def main(args: argparse.Namespace) -> int:
    if args.interval < 2 or args.budget < 1 or args.max_num_seqs < 1 or args.requests < 1 or args.random < 0:
        print("vllm_throttle_steps: --interval takes 2 or more; --budget, --max-num-seqs, --requests 1 or more",
              file=sys.stderr)
        return 2
    if args.random:
        cases = random_cases(args.seed or 0, args.random)
    elif args.seed is None:
        cases = presets()
    else:
        trace = make_trace(args.seed, args.requests, args.max_prompt, args.max_output, args.mean_gap)
        cases = [Case(f"seed {args.seed}", trace, Config(args.budget, args.max_num_seqs, args.interval))]
    try:
        results = compare(cases)
    except BackendError as e:
        print(f"vllm_throttle_steps: {e}", file=sys.stderr)
        return 1
    print(table(results))
    return 0 if all(r.equal == r.steps for r in results) else 1


if __name__ == "__main__":
    cli.run(__name__)

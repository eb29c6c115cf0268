"""vLLM 0.32's OffloadingConnector (the host tier under `vllm-v1`, `--kv-offloading-size`) against `vllm-v1` with
its host tier, step for step: vLLM's own `Scheduler` with prefix caching on and the connector's scheduler side,
its worker stood in (benchmarks/engine/vllm_offload_reference.py, run by `make vllm`'s python), and prefillbench's
engine with vllm-v1 reading its block cache and host tier (engine/block_cache.py, engine/host_tier.py) on a step
clock (every step one virtual second, as vllm_throttle_steps), on the same seeded traces.

    python -m benchmarks.engine.vllm_offload_steps                        # the presets: sessions, a small host
    python -m benchmarks.engine.vllm_offload_steps --random 8             # random cases, each its own settings
    python -m benchmarks.engine.vllm_offload_steps --xfer-steps 3         # every load and store done 3 steps on

Both sides finish a transfer on the same rule: the stand-in worker reports each load and store done `xfer-steps`
steps after the step that issued it (1: with the next step's output), and the engine's host tier is built with
each load taking `xfer-steps + 1` seconds from its admission, alone on its link (HostTier(serial=False)), so the
request is scheduled at the same step on both. Compared each step: the prompt chunks (request, start, tokens, in
schedule order), the decoding requests, the requests waiting for remote KV, the preempted ones and the loads issued
(request, tokens); over the run the loads, the blocks stored and the preemptions. Printed: steps equal of steps,
loads, preemptions and stores on each side, and the first step that differs with both sides. `--wrong early` gives
the engine's loads no time (each request scheduled at the step after its admission, whatever the worker says) and
`--wrong late` one step more than the worker takes: the comparison must tell both (tests/test_vllm_offload.py).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tabulate import tabulate

from prefillbench import engine
from prefillbench.backends.fake import FakeBackend
from prefillbench.backends.prefix import PrefixSettings
from prefillbench.errors import BackendError
from prefillbench.sequence import Request
from prefillbench.step import StepResult
from strategies import make_strategy

from benchmarks.engine.vllm_throttle_steps import vllm_python
from benchmarks.lib import cli

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "benchmarks.engine.vllm_offload_reference"
BLOCK = 16
TOKEN = 7  # every token the reference's model samples (vllm_throttle_reference.TOKEN)
WRONG = ("early", "late")


@dataclass(frozen=True)
class TraceRequest:
    id: int
    prompt: tuple[int, ...]
    output_len: int
    arrival_step: int


@dataclass(frozen=True)
class Config:
    budget: int  # --max-num-batched-tokens
    max_num_seqs: int
    num_blocks: int  # vLLM's GPU blocks, its null block among them
    host_blocks: int  # the CPU tier's blocks (--kv-offloading-size in blocks)
    xfer_steps: int = 1  # steps after its step a load or store is reported done
    block_size: int = BLOCK


@dataclass
class Case:
    name: str
    trace: list[TraceRequest]
    config: Config


def sessions_trace(seed: int, n_sessions: int, turns: int, first: int, more: int, output: int, gap: int,
                   think: int) -> list[TraceRequest]:
    """Sessions whose every turn resends the one before whole and adds `more` tokens; a session's turns `think`
    steps apart, sessions starting `gap` steps apart, so the others' turns push a session's blocks off the GPU
    between its turns. Token ids from 3 (the reference's 7 is what the model samples)."""
    rng = random.Random(seed)
    out: list[TraceRequest] = []
    for s in range(n_sessions):
        prompt: tuple[int, ...] = ()
        for t in range(turns):
            prompt = prompt + tuple(rng.randrange(10, 30000) for _ in range(first if t == 0 else more))
            out.append(TraceRequest(len(out), prompt, output, s * gap + t * think))
    return out


def random_trace(rng: random.Random, n: int) -> list[TraceRequest]:
    """Random requests, some resending an earlier one's prompt (whole or its start) with more after it."""
    out: list[TraceRequest] = []
    step = 0
    for i in range(n):
        step += int(rng.expovariate(1.0 / rng.choice([1.0, 4.0, 10.0])))
        if out and rng.random() < 0.6:
            base = rng.choice(out).prompt
            base = base[:rng.randint(len(base) // 2, len(base))]
        else:
            base = ()
        prompt = base + tuple(rng.randrange(10, 30000) for _ in range(rng.randint(1, 120)))
        out.append(TraceRequest(i, prompt, rng.randint(1, 12), step))
    return out


def presets() -> list[Case]:
    return [
        # second turns long after: the GPU lost their first turns, the host holds them: loads, waits, no preemption
        Case("sessions, roomy host", sessions_trace(1, 6, 2, 96, 24, 4, 3, 30),
             Config(budget=64, max_num_seqs=4, num_blocks=24, host_blocks=200)),
        # a host too small for every turn: it evicts, and stores fail while its blocks are still being written
        Case("sessions, small host", sessions_trace(2, 8, 3, 80, 40, 6, 2, 14),
             Config(budget=64, max_num_seqs=6, num_blocks=20, host_blocks=24)),
        # transfers three steps long: more requests wait for their loads while the rest run
        Case("sessions, 3-step transfers", sessions_trace(3, 6, 3, 64, 32, 3, 2, 12),
             Config(budget=48, max_num_seqs=4, num_blocks=24, host_blocks=60, xfer_steps=3)),
        # long outputs on a GPU cache that preempts: resumed requests find their prompts on the host
        Case("sessions, preempting", sessions_trace(4, 6, 3, 48, 24, 40, 2, 20),
             Config(budget=64, max_num_seqs=6, num_blocks=14, host_blocks=30, xfer_steps=2)),
    ]


def random_cases(seed: int, n: int) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        config = Config(budget=rng.choice([32, 48, 64, 128]), max_num_seqs=rng.randint(2, 8),
                        num_blocks=rng.randint(14, 40), host_blocks=rng.choice([8, 16, 40, 200]),
                        xfer_steps=rng.randint(1, 4))
        cases.append(Case(f"random {i}", random_trace(random.Random(rng.randrange(1 << 30)), 16), config))
    return cases


@dataclass(frozen=True)
class StepView:
    prefill: tuple[tuple[int, int, int], ...] = ()  # (request, start, tokens)
    decode: tuple[int, ...] = ()
    remote: tuple[int, ...] = ()  # waiting for remote KV once the step was scheduled
    preempted: tuple[int, ...] = ()
    loads: tuple[tuple[int, int], ...] = ()  # (request, tokens) issued by the step

    @property
    def busy(self) -> bool:
        return bool(self.prefill or self.decode or self.remote or self.preempted or self.loads)

    def __str__(self) -> str:
        return (f"prefill {list(self.prefill)} decode {list(self.decode)} remote {list(self.remote)}"
                + (f" preempted {list(self.preempted)}" if self.preempted else "")
                + (f" loads {list(self.loads)}" if self.loads else ""))


@dataclass
class Side:
    steps: dict[int, StepView] = field(default_factory=dict)
    stores: int = 0
    loads: int = 0
    preemptions: int = 0
    hits: int = 0  # GPU prefix-cache hit tokens over the run, preempted requests' lookups included
    ext_hits: int = 0  # tokens found on the host tier (the connector's hits)


def references(cases: list[Case], python: Path | None = None) -> list[Side]:
    """vLLM's own steps for each case, all in one run of the reference (one import of vLLM)."""
    if python is None:
        python = vllm_python()
    given = {"jobs": [{"config": asdict(c.config), "requests": [asdict(r) for r in c.trace]} for c in cases]}
    done = subprocess.run([str(python), "-W", "ignore", "-m", REFERENCE], input=json.dumps(given),
                          capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-6:])
        raise BackendError(f"vLLM's reference failed (exit {done.returncode}): {tail}")
    out = [Side() for _ in cases]
    for line in done.stdout.splitlines():
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        side = out[d["job"]]
        view = StepView(tuple(map(tuple, d["prefill"])), tuple(d["decode"]), tuple(d["remote"]),
                        tuple(d["preempted"]), tuple(map(tuple, d["loads"])))
        if view.busy:
            side.steps[d["step"]] = view
        side.stores += d["stores"]
        side.hits += d["hits"]
        side.ext_hits += d["ext_hits"]
        side.loads += len(d["loads"])
        side.preemptions += len(d["preempted"])
    return out


class OffloadClock(FakeBackend):
    """The fake backend with every step one virtual second and waits ending on a whole second (step k starts at
    second k), prefix caching on over 16-token blocks, the host tier of the case below it; the steps kept with their
    starts and what the host tier was loading once each was chosen."""

    name = "step-clock"
    context_length = 1 << 20
    shares_kv_blocks = True

    def __init__(self, config: Config, wrong: str | None = None) -> None:
        super().__init__(seconds_per_token=0.0, seconds_per_step=1.0)
        self.prefix = PrefixSettings(True, config.block_size)
        self.kv_cache_tokens = (config.num_blocks - 1) * config.block_size  # BlockPool keeps its null block back
        self.config = config
        self.wrong = wrong
        self.started: list[tuple[int, object, tuple[int, ...], tuple[tuple[int, int], ...]]] = []
        self.strategy = None

    def host_tier(self, block_size: int):
        steps = self.config.xfer_steps
        # reported with the output of the step `steps` on, so schedulable at the step after: steps + 1 seconds from
        # the admitting step's start; each load alone (the stand-in worker has no link to share)
        seconds = {"early": 0.0, "late": steps + 2.0}.get(self.wrong, steps + 1.0)
        return self.config.host_blocks, (lambda n: seconds), None, False, steps + 1.0

    def execute(self, step, return_logits=False):
        self.started.append((round(self.clock), step, (), ()))
        result = super().execute(step, return_logits)
        return StepResult({seq_id: TOKEN for seq_id in result.next_tokens})

    def wait_until(self, t, *, stalled=False, idle=False):
        self.clock = max(self.clock, float(math.ceil(t)))


def strategy_side(case: Case, wrong: str | None = None) -> Side:
    order = sorted(case.trace, key=lambda r: (r.arrival_step, r.id))  # the engine numbers sequences as it admits them
    requests = [Request(r.prompt, r.output_len, arrival_s=0.0 if r.arrival_step == 0 else r.arrival_step - 0.5)
                for r in order]
    backend = OffloadClock(case.config, wrong)
    strategy = make_strategy("vllm-v1", case.config.budget)
    strategy.max_num_seqs = case.config.max_num_seqs
    ids = [r.id for r in order]
    side = Side()
    admitted: dict[int, int] = {}  # a request waiting for its load -> the second the load was issued
    seen: dict[int, object] = {}  # each request's last load seen (a request preempted later may load again)
    waited: list[tuple[int, int, int]] = []  # (request, from, to): waiting for remote KV at the steps from..to-1
    chosen = strategy.next_step

    def watched(waiting, running):  # the step, and what the host tier is loading once it was chosen
        step = chosen(waiting, running)
        host = strategy.memory.host_tier
        now = round(host.now)
        loads = tuple((ids[i], ld.blocks * case.config.block_size) for i, ld in host.loading.items()
                      if seen.get(i) is not ld)
        for i, ld in host.loading.items():
            if seen.get(i) is not ld:
                seen[i] = ld
                admitted[i] = now
        for i in [i for i in admitted if i not in host.loading or host.loading[i].promoted]:  # seen done
            waited.append((ids[i], admitted.pop(i), now))
        prefills = tuple((ids[c.seq_id], c.start, len(c.tokens)) for c in step.prefills)
        view = StepView(prefills, tuple(sorted(ids[d.seq_id] for d in step.decodes)), (),
                        tuple(sorted(ids[p.seq_id] for p in step.preempted)), loads)
        if view.busy:
            if now in side.steps:  # it preempted and scheduled nothing, and was asked again: one schedule() of vLLM's
                was = side.steps[now]
                view = StepView(was.prefill + view.prefill, view.decode or was.decode, (),
                                tuple(sorted(was.preempted + view.preempted)), was.loads + view.loads)
            side.steps[now] = view
        side.loads += len(loads)
        side.preemptions += len(step.preempted)
        return step

    strategy.next_step = watched
    record = engine.run(backend, strategy, requests, 0)
    # vLLM steps on while a load is in flight, scheduling nothing where nothing else runs (the model runner's
    # kv_connector_no_forward); the engine waits for it instead: the request waits for remote KV at every second
    # from its admission to the step that schedules it, run or not
    remote: dict[int, list[int]] = {}
    for rid, first, last in waited:
        for k in range(first, last):
            remote.setdefault(k, []).append(rid)
    for k, rids in remote.items():
        was = side.steps.get(k, StepView())
        side.steps[k] = StepView(was.prefill, was.decode, tuple(sorted(rids)), was.preempted, was.loads)
    side.stores = record.kv_cache.host.stored_blocks
    side.hits = record.kv_cache.hits + record.kv_cache.preempted_hits
    side.ext_hits = record.kv_cache.host.loaded_tokens
    return side


@dataclass
class Comparison:
    case: Case
    vllm: Side
    ours: Side

    def keys(self) -> list[int]:
        return sorted(set(self.vllm.steps) | set(self.ours.steps))

    @property
    def steps(self) -> int:
        return len(self.keys())

    @property
    def equal(self) -> int:
        return sum(1 for k in self.keys() if self.vllm.steps.get(k) == self.ours.steps.get(k))

    @property
    def same(self) -> bool:
        v, o = self.vllm, self.ours
        return (self.equal == self.steps and v.loads == o.loads and v.stores == o.stores
                and v.preemptions == o.preemptions and v.hits == o.hits and v.ext_hits == o.ext_hits)

    def first_mismatch(self) -> str:
        for k in self.keys():
            v, o = self.vllm.steps.get(k, StepView()), self.ours.steps.get(k, StepView())
            if v != o:
                return f"step {k}: vLLM {v} | vllm-v1 {o}"
        return ""


def compare(cases: list[Case], python: Path | None = None, wrong: str | None = None) -> list[Comparison]:
    return [Comparison(c, v, strategy_side(c, wrong)) for c, v in zip(cases, references(cases, python))]


def table(results: list[Comparison]) -> str:
    rows = [[r.case.name, len(r.case.trace), r.case.config.budget, r.case.config.num_blocks,
             r.case.config.host_blocks, r.case.config.xfer_steps, f"{r.equal} of {r.steps}",
             f"{r.vllm.loads} / {r.ours.loads}", f"{r.vllm.stores} / {r.ours.stores}",
             f"{r.vllm.preemptions} / {r.ours.preemptions}", f"{r.vllm.hits} / {r.ours.hits}",
             f"{r.vllm.ext_hits} / {r.ours.ext_hits}", r.first_mismatch() or "-"] for r in results]
    return tabulate(rows, headers=["case", "requests", "budget", "GPU blocks", "host blocks", "xfer steps",
                                   "steps equal", "loads (vLLM / ours)", "blocks stored", "preemptions",
                                   "GPU hit tokens", "host hit tokens", "first difference"])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--random", type=int, default=0, metavar="N", help="N random cases, each its own settings")
    parser.add_argument("--seed", type=int, default=0, help="the random cases' seed")
    parser.add_argument("--xfer-steps", type=int, help="every case's transfers done this many steps on (1 or more)")
    parser.add_argument("--wrong", choices=WRONG, help="the engine's loads on a wrong rule: the comparison must differ")


def main(args: argparse.Namespace) -> int:
    if args.random < 0 or (args.xfer_steps is not None and args.xfer_steps < 1):
        print("vllm_offload_steps: --random takes 0 or more, --xfer-steps 1 or more", file=sys.stderr)
        return 2
    cases = random_cases(args.seed, args.random) if args.random else presets()
    if args.xfer_steps is not None:
        for c in cases:
            c.config = Config(**{**asdict(c.config), "xfer_steps": args.xfer_steps})
    try:
        results = compare(cases, wrong=args.wrong)
    except BackendError as e:
        print(f"vllm_offload_steps: {e}", file=sys.stderr)
        return 1
    print(table(results))
    return 0 if all(r.same for r in results) else 1


if __name__ == "__main__":
    cli.run(__name__)

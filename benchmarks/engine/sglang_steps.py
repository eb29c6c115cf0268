"""SGLang's own scheduler against the `sglang` and `sglang-mixed` strategies, step for step, on seeded traces.

    python -m benchmarks.engine.sglang_steps                    # every preset trace
    python -m benchmarks.engine.sglang_steps --trace retract    # one of them
    python -m benchmarks.engine.sglang_steps --seed 7 --requests 60 --kv-cache-tokens 3000 --ignore-eos 0
    python -m benchmarks.engine.sglang_steps --radix             # the radix cache on: the session presets
    python -m benchmarks.engine.sglang_steps --hicache           # HiCache below it: its session presets

One side is SGLang's code itself (benchmarks/engine/sglang_reference.py, run by the python of `make sglang`'s
environment: its PrefillAdder, SchedulePolicy, new-token-ratio tracker, batch forming and retraction driven with
stand-in requests, allocator and tree cache, one scheduler iteration of `event_loop_normal` at a time). The other is
prefillbench's engine running the same trace with the strategy on a backend whose every step takes one virtual
second (StepClock): a request that arrives at iteration k arrives half a second before step k starts, so it is
admitted before step k is chosen, as SGLang receives it at the top of iteration k; an idle engine waits to the next
whole second, so engine step k starts at second k exactly where SGLang runs iteration k. Iterations SGLang spends
idle are the seconds no step starts in.

Every iteration is compared: the prompt tokens of each request in batch order and where each starts (SGLang's
prefix_len: a cached prefix, or a prompt's progress), the decoding requests, the retracted ones in retraction order,
new_token_ratio after the iteration's scheduling (to 1e-9: both sides do the same float operations, so they agree to
the last bits or differ by a rule), and the tokens the radix cache has evicted so far. With --radix the radix cache is
on, on seeded multi-turn session traces (benchmarks/engine/sglang_sessions.py): the engine's memory is SGLang's
radix cache (prefillbench/engine/radix_cache.py), read by the strategies as SGLang's scheduler reads its own. With
--hicache HiCache sits below it on both sides (SGLang's UnifiedRadixCache with init_hicache, the CUDA copies stood in
for as benchmarks/engine/sglang_hicache.py says; prefillbench/engine/hicache.py), and the tokens loaded back from the
host so far are compared too. A table of traces, steps, equal steps and retractions is printed; on a mismatch the
first differing step is named with both sides and the exit is 1.
"""
from __future__ import annotations

import argparse
import dataclasses
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
from prefillbench.step import Step, StepResult
from strategies import compose, make_strategy

from benchmarks.engine.sglang_trace import NEXT_TOKEN, Config, TraceRequest
from benchmarks.lib import cli

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "benchmarks.engine.sglang_reference"
#: Both sides' ratios come out of the same float operations in the same order (0.7 less k decays, or one division
#: after a retraction); anything past rounding is a different rule, not noise.
RATIO_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Preset:
    name: str
    seed: int
    requests: int
    config: Config
    ignore_eos: bool
    max_prompt: int = 700
    max_output: int = 160
    mean_gap: float = 6.0  # iterations between arrivals, on average
    lull: int = 0  # a first request decoding this many tokens alone before the others come (0: none)
    why: str = ""


PRESETS = (
    Preset("default", 0, 40, Config(256, 16384, 200_000, 16, False), True,
           why="SGLang's default launch: prefill first, a long prompt's chunks stalling every decode"),
    Preset("mixed", 1, 40, Config(256, 16384, 200_000, 16, True), True,
           why="--enable-mixed-chunk: the decodes ride in the prefill batch, its budget shrunk by them"),
    # The ratio decays only on pure decode steps (0.7 to 0.098 over 600): a first request decoding 700 tokens alone
    # takes it to its floor, then requests whose outputs are long beside a small cache are admitted on 10% of their
    # expected output and decodes run out of memory.
    Preset("retract", 3, 40, Config(192, 16384, 3000, 64, False), False, max_prompt=200, max_output=500,
           mean_gap=4.0, lull=700, why="ignore_eos off and a small KV cache: the ratio over-admits, decodes retract"),
    # ignore_eos with the radix cache off: PrefillAdder.add_one_req_ignore_eos simulates every request's remaining
    # output in a small cache before it admits one
    Preset("ignore-eos-small-kv", 11, 40, Config(128, 16384, 2500, 64, False), True, max_prompt=400, max_output=300,
           mean_gap=3.0, lull=600, why="ignore_eos in a small cache: admission by add_one_req_ignore_eos's simulation"),
    # a cache of 600 tokens, prompts to 150 and outputs to 250: several candidates a batch meet the simulation, the
    # later ones inserted into the request states kept since the batch's first (add_req_state(insert_sort=True))
    Preset("ignore-eos-tight", 13, 20, Config(256, 16384, 600, 64, False), True, max_prompt=150, max_output=250,
           mean_gap=3.0, why="ignore_eos in a smaller cache: a batch's later candidates in its kept request states"),
    Preset("retract-mixed", 3, 40, Config(192, 16384, 3000, 64, True), False, max_prompt=200, max_output=500,
           mean_gap=4.0, lull=700, why="the same with --enable-mixed-chunk: mixed batches never retract, decodes do"),
    # --prefill-decode-interval (sglang#35017): after each batch with prompts, N rounds of decodes alone; min-bs 1, so
    # a round with nothing running ends the interval (with 0 SGLang spends such rounds idle, no batch, counted down at
    # once by the cadence: strategies/cadence.py)
    Preset("decode-rounds", 5, 40, Config(256, 16384, 200_000, 16, False, 4, 1), True, mean_gap=3.0,
           why="--prefill-decode-interval 4: prompts wait four decode rounds after each prefill batch"),
    Preset("decode-rounds-mixed", 6, 40, Config(128, 16384, 200_000, 16, True, 3, 4), True, mean_gap=2.0,
           why="the same mixed, min-bs 4: below four running requests the interval ends and prompts go at once"),
    Preset("decode-rounds-retract", 3, 40, Config(192, 16384, 3000, 64, False, 2, 1), False, max_prompt=200,
           max_output=500, mean_gap=4.0, lull=700, why="the interval beside retraction in a small cache"),
)


def make_trace(seed: int, n: int, ignore_eos: bool, max_prompt: int, max_output: int, mean_gap: float,
               kv_capacity_tokens: int, lull: int = 0) -> list[TraceRequest]:
    """Seeded requests: prompts 8..max_prompt tokens, outputs 1..max_output, exponential gaps between arrivals
    (several at one iteration sometimes); with `lull`, a first request of 50 tokens making `lull` alone, the others
    coming from half way through it. Each fits the cache alone with room to spare, so SGLang's own max_new_tokens
    clip (`init_req_max_new_tokens`: the KV tokens less the prompt less two) never binds."""
    rng = random.Random(seed)
    out, step = [], 0
    if lull:
        out.append(TraceRequest(0, 50, lull, 0, ignore_eos))
        step = lull // 2
    for i in range(len(out), n):
        prompt = rng.randint(8, max_prompt)
        output = rng.randint(1, max_output)
        if prompt + output + 2 > kv_capacity_tokens:
            output = max(1, kv_capacity_tokens - prompt - 2)
        out.append(TraceRequest(i, prompt, output, step, ignore_eos))
        step += int(rng.expovariate(1.0 / mean_gap))
    return out


def random_cases(seed: int, n: int, decode_rounds: bool = False) -> list[tuple[str, list[TraceRequest], Config]]:
    """`n` seeded random configurations, each with a trace of its own: chunk sizes down to a few tokens (below the
    mixed decodes' count), max_prefill_tokens below the chunk, caches of a few hundred tokens, one to many running
    requests, ignore_eos on and off, arrivals in bursts and after idle gaps. Where the presets exercise the rules
    one at a time, these meet them together (the ignore_eos admission's kept request states were found here).
    `decode_rounds`: each with a --prefill-decode-interval of 1-8 and a min-bs of 1-4 besides, drawn from a generator
    of their own (the configurations and traces are the same as without)."""
    rng = random.Random(seed)
    cadence_rng = random.Random(seed + 1_000_003)
    out = []
    for k in range(n):
        config = Config(rng.choice([4, 12, 32, 64, 100, 256]), rng.choice([48, 100, 300, 16384]),
                        rng.choice([400, 800, 1500, 5000, 100_000]), rng.choice([2, 3, 8, 64]), rng.random() < 0.5)
        if decode_rounds:
            config = dataclasses.replace(config, prefill_decode_interval=cadence_rng.randint(1, 8),
                                         prefill_decode_interval_min_bs=cadence_rng.randint(1, 4))
        ignore_eos = rng.random() < 0.5
        trace, step = [], 0
        for i in range(rng.randint(5, 40)):
            cap = config.kv_capacity_tokens // 3
            prompt, output = rng.randint(1, min(600, cap)), rng.randint(1, min(300, cap))
            trace.append(TraceRequest(i, prompt, output, step, ignore_eos))
            step += rng.choice([0, 0, 1, 2, 3, 5, 20, 60])
        out.append((f"random {seed}/{k}", trace, config))
    return out


def preset_trace(preset: Preset) -> list[TraceRequest]:
    return make_trace(preset.seed, preset.requests, preset.ignore_eos, preset.max_prompt, preset.max_output,
                      preset.mean_gap, preset.config.kv_capacity_tokens, preset.lull)


# --- one scheduler iteration, either side -----------------------------------------------------------------------

@dataclass(frozen=True)
class Iteration:
    """What one scheduler iteration ran (the reference's JSON line)."""

    kind: str  # extend | mixed | decode | idle
    prefill: tuple[tuple[int, int], ...] = ()  # (request id, prompt tokens), batch order
    decode: tuple[int, ...] = ()  # sorted
    retracted: tuple[int, ...] = ()  # retraction order
    ratio: float = math.nan
    prefix: tuple[int, ...] = ()  # where each prompt chunk starts (SGLang's prefix_len), batch order
    evicted: int = 0  # tokens the radix cache evicted up to this iteration
    loaded: int = 0  # tokens HiCache loaded back from the host up to this iteration

    @classmethod
    def from_json(cls, line: str) -> "Iteration":
        d = json.loads(line)
        return cls(d["kind"], tuple((int(i), int(n)) for i, n in d["prefill"]), tuple(d["decode"]),
                   tuple(d["retracted"]), float(d["ratio"]), tuple(d["prefix"]), int(d["evicted"]),
                   int(d.get("loaded", 0)))

    def same(self, other: "Iteration") -> bool:
        return (self.kind, self.prefill, self.decode, self.retracted) == (
            other.kind, other.prefill, other.decode, other.retracted) and (
            self.kind == "idle" or (abs(self.ratio - other.ratio) <= RATIO_TOLERANCE
                                    and (self.prefix, self.evicted, self.loaded)
                                    == (other.prefix, other.evicted, other.loaded)))

    def __str__(self) -> str:
        if self.kind == "idle":
            return "idle"
        parts = [self.kind]
        if self.prefill:
            parts.append("prefill " + " ".join(f"{i}:{n}@{p}" for (i, n), p in zip(self.prefill, self.prefix)))
        if self.decode:
            parts.append(f"decode {list(self.decode)}")
        if self.retracted:
            parts.append(f"retracted {list(self.retracted)}")
        parts.append(f"ratio {self.ratio:.12g}")
        if self.evicted:
            parts.append(f"evicted {self.evicted}")
        if self.loaded:
            parts.append(f"loaded {self.loaded}")
        return ", ".join(parts)


IDLE = Iteration("idle")


def reference(trace: list[TraceRequest], config: Config, python: Path | None = None) -> list[Iteration]:
    """SGLang's own iterations for the trace: the reference driver run by the SGLang environment's python."""
    return references([(trace, config)], python)[0]


def references(jobs: list[tuple[list[TraceRequest], Config]], python: Path | None = None) -> list[list[Iteration]]:
    """SGLang's own iterations for each (trace, config), all in one run of the reference (one import of SGLang)."""
    if python is None:
        from prefillbench.backends.server import sglang_env

        python = sglang_env.installed_python()
    given = {"jobs": [{"config": asdict(config), "requests": [asdict(r) for r in trace]} for trace, config in jobs]}
    done = subprocess.run([str(python), "-W", "ignore", "-m", REFERENCE], input=json.dumps(given), capture_output=True,
                          text=True, cwd=ROOT, timeout=1800)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-6:])
        raise BackendError(f"SGLang's reference failed (exit {done.returncode}): {tail}")
    out: list[list[Iteration]] = [[] for _ in jobs]
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            out[json.loads(line)["job"]].append(Iteration.from_json(line))
    return out


class StepClock(FakeBackend):
    """The fake backend with every step one virtual second, whatever it holds, and waits ending on a whole second:
    step k of the engine starts at second k, as SGLang's iteration k; the Steps it ran kept with their starts."""

    name = "step-clock"
    context_length = 1 << 20

    def __init__(self, radix: bool = False, hicache: tuple[int, str] | None = None) -> None:
        super().__init__(seconds_per_token=0.0, seconds_per_step=1.0)
        self.started: list[tuple[int, Step, int]] = []  # (second, step, tokens evicted before it ran)
        self.loaded: list[int] = []  # beside each: the tokens HiCache had loaded from the host by then
        #: HiCache's host pool in tokens and its write policy (engine/hicache.py), None: none
        self.hicache = hicache
        if hicache is not None:
            self.hicache_write_policy = hicache[1]
        self.strategy = None  # the run's strategy: its memory's radix cache counts the evictions
        if radix:  # the prefix cache on, held by the engine's memory (SGLang's radix cache), as on the sim
            self.prefix = PrefixSettings(on=True)
            self.shares_kv_blocks = True
        self.radix = radix

    def execute(self, step, return_logits=False):
        stats = self.strategy.memory.cache_stats if self.strategy is not None else None
        self.started.append((round(self.clock), step, 0 if stats is None else stats.evicted_blocks))
        self.loaded.append(0 if stats is None or stats.host is None else stats.host.loaded_tokens)
        result = super().execute(step, return_logits)
        if self.radix:  # every token the reference's model "samples" (sglang_reference.NEXT_TOKEN): a session's
            # next turn resends them, and the tree matches them
            result = StepResult({seq_id: NEXT_TOKEN for seq_id in result.next_tokens})
        return result

    def wait_until(self, t, *, stalled=False, idle=False):
        self.clock = max(self.clock, float(math.ceil(t)))

    def host_tier(self, block_size: int):
        """HiCache's host pool (the engine builds it below the radix cache), its loads taking no time of their own:
        every step is one second."""
        return None if self.hicache is None else (self.hicache[0], lambda n: 0.0, None)


def strategy_spec(config: Config, ignore_eos: bool) -> str:
    name = "sglang-mixed" if config.enable_mixed_chunk else "sglang"
    rules = (f"{name}:ignore-eos={int(ignore_eos)}:max-prefill={config.max_prefill_tokens}"
             f":max-running={config.max_running_requests}")
    cadence = (f"decode-rounds:{config.prefill_decode_interval}:min-bs={config.prefill_decode_interval_min_bs}"
               if config.prefill_decode_interval else "every")
    return compose(rules, "fixed", cadence)


def strategy_iterations(trace: list[TraceRequest], config: Config) -> list[Iteration]:
    """The trace through prefillbench's engine with the strategy, as iterations (idle where no step started)."""
    kinds = {r.ignore_eos for r in trace}
    if len(kinds) != 1:
        raise ValueError("the strategies take ignore_eos for every request at once (-s sglang:ignore-eos=N)")
    if any(r.follows is not None for r in trace):
        requests, keys = session_requests(trace)
    else:
        order = sorted(trace, key=lambda r: (r.arrival_step, r.id))  # the engine numbers sequences as it admits them
        requests = [Request(r.tokens or tuple(range(3, 3 + r.prompt_len)), r.output_len,
                            arrival_s=0.0 if r.arrival_step == 0 else r.arrival_step - 0.5) for r in order]
        keys = None
    # SGLang's host pool: the GPU pool times --hicache-ratio, and its padding page (HostKVCache.__init__)
    hicache = ((int(config.kv_capacity_tokens * config.hicache_ratio) + 1, config.hicache_write_policy)
               if config.hicache_ratio else None)
    backend = StepClock(radix=config.radix_cache, hicache=hicache)
    backend.kv_cache_tokens = config.kv_capacity_tokens
    strategy = make_strategy(strategy_spec(config, kinds.pop()), config.chunked_prefill_size)
    backend.strategy = strategy
    record = engine.run(backend, strategy, requests, 0)
    # sequences are numbered as the engine admits them: its record lists them so
    ids = [r.id for r in order] if keys is None else [keys[(q.session, q.turn)] for q in record.requests]
    by_start: dict[int, Iteration] = {}
    for (start, step, evicted), loaded in zip(backend.started, backend.loaded, strict=True):
        if start in by_start:
            raise BackendError(f"two engine steps started at second {start}: a step took other than one second")
        by_start[start] = iteration_of(step, ids, evicted, loaded)
    last = max(by_start, default=-1)
    return [by_start.get(i, IDLE) for i in range(last + 1)]


def iteration_of(step: Step, ids: list[int], evicted: int = 0, loaded: int = 0) -> Iteration:
    prefill = tuple((ids[c.seq_id], len(c.tokens)) for c in step.prefills)
    decode = tuple(sorted(ids[d.seq_id] for d in step.decodes))
    kind = "mixed" if prefill and decode else "extend" if prefill else "decode"
    ratio = dict(step.policy_values).get("new_token_ratio", math.nan)
    return Iteration(kind, prefill, decode, tuple(ids[p.seq_id] for p in step.preempted), ratio,
                     tuple(c.start for c in step.prefills), evicted, loaded)


def session_requests(trace: list[TraceRequest]) -> tuple[list[Request], dict[tuple[int, int], int]]:
    """A session trace as the engine's requests: each chain of turns a session (its first request's id), a later
    turn arriving `think` - 1.5 s after the last token of the turn before (that token ends iteration f at second
    f + 1: it arrives half a second before iteration f + think starts, as SGLang receives it at that iteration's
    top); and the (session, turn) of each request's id. Arrivals in one iteration are ordered by id, as the
    reference receives them, by a ten-thousandth of a second each."""
    by_id = {r.id: r for r in trace}
    keys: dict[tuple[int, int], int] = {}
    requests = []
    for r in sorted(trace, key=lambda r: r.id):
        root, turn = r, 0
        while root.follows is not None:
            root, turn = by_id[root.follows], turn + 1
        keys[(root.id, turn)] = r.id
        offset = r.id * 1e-4
        if r.follows is None:
            arrival = 0.0 if r.arrival_step == 0 else r.arrival_step - 0.5 + offset
            requests.append(Request(r.tokens, r.output_len, arrival_s=arrival, session=root.id, turn=0))
        else:
            if r.think < 2:
                raise ValueError(f"request {r.id}: a later turn thinks at least 2 iterations")
            requests.append(Request(r.tokens, r.output_len, session=root.id, turn=turn,
                                    think_s=r.think - 1.5 + offset))
    return requests, keys


# --- the comparison ---------------------------------------------------------------------------------------------

@dataclass
class Comparison:
    name: str
    config: Config
    sglang: list[Iteration]
    ours: list[Iteration]
    strategy: str = ""
    mismatches: list[tuple[int, Iteration, Iteration]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # past either side's last iteration it is idle: the other's steps there are differences too
        n = max(len(self.sglang), len(self.ours))
        pad = lambda its: its + [IDLE] * (n - len(its))
        self.mismatches = [(i, a, b) for i, (a, b) in enumerate(zip(pad(self.sglang), pad(self.ours)))
                           if not a.same(b)]

    @property
    def steps(self) -> int:
        """Iterations that ran a batch (SGLang's), the ones compared beside its idle ones."""
        return sum(1 for it in self.sglang if it.kind != "idle")

    @property
    def equal(self) -> int:
        bad = {i for i, _, _ in self.mismatches}
        return sum(1 for i, it in enumerate(self.sglang) if it.kind != "idle" and i not in bad)

    def retractions(self, side: list[Iteration]) -> int:
        return sum(len(it.retracted) for it in side)

    @staticmethod
    def cached(side: list[Iteration]) -> int:
        """Prompt tokens admitted from the radix cache: each request's first chunk's start, on each admission (a
        retracted request's again; a chunk that continues a prompt is not an admission)."""
        going: set[int] = set()
        total = 0
        for it in side:
            for (rid, n), start in zip(it.prefill, it.prefix):
                if rid not in going:
                    total += start
                going.add(rid)
            going -= set(it.retracted)
        return total

    @staticmethod
    def evicted(side: list[Iteration]) -> int:
        return max((it.evicted for it in side), default=0)

    @staticmethod
    def loaded(side: list[Iteration]) -> int:
        return max((it.loaded for it in side), default=0)

    def first_mismatch(self) -> str:
        if not self.mismatches:
            return ""
        i, a, b = self.mismatches[0]
        return f"{self.name}: first differing step {i}\n  SGLang:   {a}\n  {self.strategy}: {b}"


def compare(jobs: list[tuple[str, list[TraceRequest], Config]], python: Path | None = None) -> list[Comparison]:
    """Each named trace on SGLang's code and through the strategy, compared step for step."""
    sglang = references([(trace, config) for _, trace, config in jobs], python)
    return [Comparison(name, config, theirs, strategy_iterations(trace, config),
                       strategy_spec(config, trace[0].ignore_eos))
            for (name, trace, config), theirs in zip(jobs, sglang)]


def table(results: list[Comparison], radix: bool = False, hicache: bool = False) -> str:
    rows = [[c.name, c.strategy, c.config.chunked_prefill_size, c.config.kv_capacity_tokens, c.steps, c.equal,
             c.retractions(c.sglang), c.retractions(c.ours),
             f"{min((it.ratio for it in c.sglang if it.kind != 'idle'), default=math.nan):.4g}"]
            + ([c.cached(c.sglang), c.cached(c.ours), c.evicted(c.sglang), c.evicted(c.ours)] if radix else [])
            + ([c.config.hicache_write_policy, c.loaded(c.sglang), c.loaded(c.ours)] if hicache else [])
            for c in results]
    headers = ["trace", "strategy", "chunked_prefill_size", "KV tokens", "steps", "equal steps",
               "retractions (SGLang)", "retractions (strategy)", "lowest ratio"]
    if radix:
        headers += ["cached tokens (SGLang)", "cached tokens (strategy)", "evicted (SGLang)", "evicted (strategy)"]
    if hicache:
        headers += ["write policy", "host loaded (SGLang)", "host loaded (strategy)"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", action="append",
                        help="a preset trace (repeatable; default: all of them): " + ", ".join(p.name for p in PRESETS)
                        + "; with --radix, one of benchmarks/engine/sglang_sessions.py's")
    parser.add_argument("--seed", type=int, default=None, help="a trace of your own instead: its seed")
    parser.add_argument("--random", type=int, default=0, metavar="N",
                        help="N random configurations and traces instead (random_cases; --seed seeds them, default 0)")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--chunked-prefill-size", type=int, default=256)
    parser.add_argument("--max-prefill-tokens", type=int, default=16384)
    parser.add_argument("--kv-cache-tokens", type=int, default=200_000)
    parser.add_argument("--max-running-requests", type=int, default=16)
    parser.add_argument("--mixed", action="store_true", help="--enable-mixed-chunk (sglang-mixed)")
    parser.add_argument("--ignore-eos", type=int, choices=(0, 1), default=1)
    parser.add_argument("--decode-rounds", type=int, default=0, metavar="N",
                        help="--prefill-decode-interval N (the decode-rounds cadence); with --random: each case draws "
                        "its own, 1-8")
    parser.add_argument("--min-bs", type=int, default=1, metavar="M", help="--prefill-decode-interval-min-bs")
    parser.add_argument("--radix", action="store_true",
                        help="the radix cache on: the session presets (benchmarks/engine/sglang_sessions.py), those "
                        "--trace names, or with --random N, random session cases")
    parser.add_argument("--hicache", action="store_true",
                        help="HiCache below the radix cache: benchmarks/engine/sglang_sessions.py's HiCache presets, "
                        "or those --trace names")
    parser.add_argument("--python", default=None, help="the SGLang environment's python (default: make sglang's)")


def main(args: argparse.Namespace) -> int:
    if args.random and (args.radix or args.hicache):
        from benchmarks.engine.sglang_sessions import random_hicache_cases, random_radix_cases

        jobs = (random_hicache_cases if args.hicache else random_radix_cases)(args.seed or 0, args.random)
    elif args.random:
        jobs = random_cases(args.seed or 0, args.random, decode_rounds=bool(args.decode_rounds))
    elif args.seed is not None:
        config = Config(args.chunked_prefill_size, args.max_prefill_tokens, args.kv_cache_tokens,
                        args.max_running_requests, args.mixed, args.decode_rounds, args.min_bs)
        jobs = [(f"seed {args.seed}", make_trace(args.seed, args.requests, bool(args.ignore_eos), 700, 160, 6.0,
                                                 args.kv_cache_tokens), config)]
    elif args.radix or args.hicache:
        from benchmarks.engine.sglang_sessions import HICACHE_PRESETS, RADIX_PRESETS

        presets = HICACHE_PRESETS if args.hicache else RADIX_PRESETS
        unknown = sorted(set(args.trace or ()) - {p.name for p in presets})
        chosen = [p for p in presets if not args.trace or p.name in args.trace]
        if unknown:
            print(f"error: no {'HiCache' if args.hicache else 'radix'} preset is named {', '.join(unknown)} (they are "
                  f"{', '.join(p.name for p in presets)})", file=sys.stderr)
            return 2
        jobs = [(p.name, p.trace(), p.config) for p in chosen]
    else:
        unknown = sorted(set(args.trace or ()) - {p.name for p in PRESETS})
        if unknown:
            print(f"error: no preset trace is named {', '.join(unknown)} (they are "
                  f"{', '.join(p.name for p in PRESETS)}; --radix has its own)", file=sys.stderr)
            return 2
        chosen = [p for p in PRESETS if not args.trace or p.name in args.trace]
        jobs = [(p.name, preset_trace(p), p.config) for p in chosen]
    python = Path(args.python) if args.python else None
    try:
        results = compare(jobs, python)
    except (BackendError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(results, radix=any(c.config.radix_cache for c in results),
                hicache=any(c.config.hicache_ratio for c in results)))
    bad = [c for c in results if c.mismatches]
    for c in bad:
        print(f"\n{c.first_mismatch()}\n  ({len(c.mismatches)} differing steps in all)")
    return 1 if bad else 0


if __name__ == "__main__":
    cli.run(__name__)

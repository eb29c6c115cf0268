"""Seeded multi-turn session traces for SGLang's radix cache (python -m benchmarks.engine.sglang_steps --radix).

A session is a chain of turns: every prompt starts with one system prompt all sessions share; each later turn is
the turn before's prompt, its answer (the tokens the model made: the reference's constant NEXT_TOKEN, so the tree
holds them as a client's resent history would find them) and a new message, arriving a few iterations after that
turn finished. Sessions start at exponential gaps. The KV pool is a few times the longest conversation: the tree
fills with finished sessions' histories and the running requests' slots, and unlocked leaves are evicted.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from benchmarks.engine.sglang_trace import NEXT_TOKEN, Config, TraceRequest

#: Token ids of the random text: above every token the reference's default prompts use (3..1002) and NEXT_TOKEN,
#: below its vocabulary (1 << 15)
TEXT_TOKENS = (2000, 30000)


def session_trace(seed: int, sessions: int, turns: int, system: int, message: int, answer: int, think: int,
                  mean_gap: float, ignore_eos: bool) -> list[TraceRequest]:
    """`sessions` chains of `turns` turns: a shared `system`-token prompt, messages of message/2..3*message/2 tokens,
    answers of answer/2..3*answer/2, each later turn arriving 2..`think` iterations after the one before finished."""
    rng = random.Random(seed)

    def text(n: int) -> tuple[int, ...]:
        return tuple(rng.randint(*TEXT_TOKENS) for _ in range(n))

    shared = text(system)
    out: list[TraceRequest] = []
    step = 0
    for _ in range(sessions):
        prompt = shared + text(rng.randint(message // 2, message * 3 // 2))
        before = None
        for turn in range(turns):
            n = rng.randint(max(1, answer // 2), answer * 3 // 2)
            rid = len(out)
            out.append(TraceRequest(rid, len(prompt), n, step if turn == 0 else 0, ignore_eos, tokens=prompt,
                                    follows=before, think=0 if turn == 0 else rng.randint(2, think)))
            prompt = prompt + (NEXT_TOKEN,) * n + text(rng.randint(message // 2, message * 3 // 2))
            before = rid
        step += int(rng.expovariate(1.0 / mean_gap))
    return out


@dataclass(frozen=True)
class RadixPreset:
    name: str
    seed: int
    config: Config
    ignore_eos: bool
    sessions: int = 12
    turns: int = 4
    system: int = 96
    message: int = 48
    answer: int = 40
    think: int = 8
    mean_gap: float = 6.0
    why: str = ""

    def trace(self) -> list[TraceRequest]:
        return session_trace(self.seed, self.sessions, self.turns, self.system, self.message, self.answer,
                             self.think, self.mean_gap, self.ignore_eos)


RADIX_PRESETS = (
    RadixPreset("sessions", 21, Config(256, 16384, 1500, 16, False, radix_cache=True), False,
                why="SGLang's default launch with its radix cache: LPM order, a shared system prompt, histories "
                "resent, a pool small enough to evict"),
    RadixPreset("sessions-mixed", 22, Config(128, 16384, 1500, 16, True, radix_cache=True), False,
                why="the same with --enable-mixed-chunk: the decodes in the prefill batch, its prompts before them"),
    # many sessions at once in a small pool: the ratio over-admits, decodes retract, and a retracted request finds
    # its own prompt in the tree again unless it was evicted
    RadixPreset("sessions-retract", 31, Config(192, 16384, 1500, 32, False, radix_cache=True), False,
                sessions=16, answer=200, mean_gap=3.0,
                why="long answers in a small pool: retraction releasing into the tree, evictions beside it"),
    RadixPreset("sessions-ignore-eos", 24, Config(64, 16384, 1500, 16, False, radix_cache=True), True,
                sessions=10, system=160, why="ignore_eos with the radix cache on (the plain admission path), "
                "long prompts chunked at 64"),
)

#: HiCache below the radix cache (--enable-hierarchical-cache): the radix presets' sessions with a host pool the GPU's
#: evictions go to, each write policy, a host pool small enough to evict too
HICACHE_PRESETS = (
    RadixPreset("sessions-hicache", 21, Config(256, 16384, 1500, 16, False, radix_cache=True, hicache_ratio=2.0),
                False, why="SGLang's default HiCache (write_through, --hicache-ratio 2): histories loaded back"),
    RadixPreset("sessions-hicache-mixed", 22, Config(128, 16384, 1500, 16, True, radix_cache=True,
                                                     hicache_ratio=2.0), False, why="the same with mixed chunks"),
    RadixPreset("sessions-hicache-write-back", 21, Config(256, 16384, 1500, 16, False, radix_cache=True,
                                                          hicache_ratio=0.5, hicache_write_policy="write_back"),
                False, why="--hicache-write-policy write_back, a host pool half the GPU's: written as evicted, "
                "duplicates reclaimed"),
    RadixPreset("sessions-hicache-selective", 21, Config(256, 16384, 1500, 16, False, radix_cache=True,
                                                         hicache_ratio=2.0,
                                                         hicache_write_policy="write_through_selective"),
                False, why="write_through_selective: a node written on its second hit, an unwritten one dropped"),
    RadixPreset("sessions-hicache-retract", 31, Config(192, 16384, 1500, 32, False, radix_cache=True,
                                                       hicache_ratio=1.0), False, sessions=16, answer=200,
                mean_gap=3.0, why="a host pool the GPU's size, long answers: host evictions, retractions beside them"),
)


def random_radix_cases(seed: int, n: int) -> list[tuple[str, list[TraceRequest], Config]]:
    """`n` seeded random session traces and configurations: chunks of a few tokens to 256, pools of a few hundred
    tokens to a few thousand (each still holding the longest conversation), one to many running requests, mixed or
    not, ignore_eos or not, system prompts from none to long, think times down to the shortest. Where the presets
    meet the rules one by one, these meet them together."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        sessions, turns = rng.randint(2, 10), rng.randint(1, 5)
        system, message, answer = rng.choice([0, 8, 40, 120]), rng.choice([4, 20, 60]), rng.choice([2, 16, 60])
        trace = session_trace(rng.randrange(1 << 30), sessions, turns, system, message, answer, rng.choice([2, 3, 10]),
                              rng.choice([0.5, 2.0, 8.0]), rng.random() < 0.5)
        longest = max(r.prompt_len + r.output_len for r in trace)
        config = Config(rng.choice([4, 16, 64, 256]), rng.choice([48, 300, 16384]),
                        longest + 4 + rng.choice([0, 100, 400, 2000]), rng.choice([2, 3, 8, 64]), rng.random() < 0.5,
                        radix_cache=True)
        out.append((f"radix random {seed}/{k}", trace, config))
    return out


def random_hicache_cases(seed: int, n: int) -> list[tuple[str, list[TraceRequest], Config]]:
    """random_radix_cases with HiCache below: a host pool of a half to four times the GPU's, each write policy."""
    rng = random.Random(seed ^ 0x41C)
    out = []
    for name, trace, config in random_radix_cases(seed, n):
        policy = rng.choice(["write_through", "write_back", "write_through_selective"])
        out.append((name.replace("radix", "hicache"), trace,
                    dataclasses.replace(config, hicache_ratio=rng.choice([0.5, 1.0, 2.0, 4.0]),
                                        hicache_write_policy=policy)))
    return out


__all__ = ["HICACHE_PRESETS", "RADIX_PRESETS", "RadixPreset", "random_hicache_cases", "random_radix_cases",
           "session_trace"]

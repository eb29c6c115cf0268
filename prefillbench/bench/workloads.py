"""Tests (pp512, tg128, pp512+tg128), the seeded requests that make them up, and when those arrive.

Lengths are fixed by default; `spread` R draws each request's prompt and
generation lengths uniformly from [L(1-R), L(1+R)] (vLLM's --random-range-ratio);
a workload file (traces.py: ours, Mooncake's, Azure's) replays a production trace,
its shared prefix blocks as shared tokens (and its `class` column, a name per request);
sessions.py makes multi-turn sessions; mix.py a seeded mix of length classes.
Arrivals are a closed loop (none), a Poisson process or a gamma process of a given
rate and burstiness (vLLM's convention), seeded, or a trace's own times.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from prefillbench.bench.sessions import SessionSpec
from prefillbench.bench.traces import TraceReading, WorkloadError, WorkloadFile, load_workload
from prefillbench.sequence import Request

__all__ = ["ARRIVALS", "ArrivalSpec", "SessionSpec", "TestSpec", "TraceReading", "WorkloadError", "WorkloadFile",
           "arriving", "load_workload", "make_requests", "make_tests", "request_lengths", "sessions_test", "workload_test"]


@dataclass(frozen=True)
class TestSpec:
    """One llama-bench style test: prompt processing, generation, or both.

    With `spread` the lengths vary per request around n_prompt and n_gen; with
    `workload` they come from a file (n_prompt and n_gen are then its means).
    """

    n_prompt: int
    n_gen: int
    spread: float = 0.0
    workload: WorkloadFile | None = None
    sessions: SessionSpec | None = None  # multi-turn sessions (bench/sessions.py); n_prompt and n_gen their means

    __test__ = False  # not a pytest class

    @property
    def name(self) -> str:
        if self.workload is not None:
            return self.workload.name
        if self.sessions is not None:
            return self.sessions.name
        if self.n_prompt and self.n_gen:
            base = f"pp{self.n_prompt}+tg{self.n_gen}"
        else:
            base = f"pp{self.n_prompt}" if self.n_prompt else f"tg{self.n_gen}"
        return f"{base}±{100 * self.spread:g}%" if self.spread else base

    @property
    def kind(self) -> str:
        return "pp+tg" if self.n_prompt and self.n_gen else ("pp" if self.n_prompt else "tg")

    @property
    def prompt_len(self) -> int:
        """tg runs from a one-token prompt, as llama-bench's does."""
        return self.n_prompt or 1

    @property
    def tokens_to_generate(self) -> int:
        """Tokens the engine must produce per request.

        The first token comes from the prompt pass. pp needs only that one; tg
        times n_gen decode steps after it; pp+tg counts it among its n_gen.
        """
        if self.kind == "pp":
            return 1
        return self.n_gen + 1 if self.kind == "tg" else self.n_gen

    @property
    def tokens_per_request(self) -> int:
        """Tokens a request contributes to the test's throughput."""
        return self.n_prompt + self.n_gen

    @property
    def max_seq_len(self) -> int:
        """The longest request's positions, prompt plus generation."""
        if self.workload is not None:
            return max(p + g for p, g in zip(self.workload.prompt_lens, self.workload.gen_lens))
        if self.sessions is not None:
            return max(p + g for p, g in self.sessions.lengths(0))
        if not self.spread:
            return self.prompt_len + self.tokens_to_generate
        prompt = _spread_high(self.n_prompt, self.spread) if self.n_prompt else 1
        return prompt + (1 if self.kind == "pp" else _spread_high(self.n_gen, self.spread) + (self.kind == "tg"))

    def request_tokens(self, prompt_len: int, n_tokens: int) -> int:
        """Tokens a request of `prompt_len` that emitted `n_tokens` contributes to throughput (cf. tokens_per_request)."""
        if self.kind == "pp":
            return prompt_len
        if self.kind == "tg":
            return n_tokens - 1
        return prompt_len + n_tokens


def make_tests(n_prompt: list[int], n_gen: list[int], pg: list[tuple[int, int]], spread: float = 0.0) -> list[TestSpec]:
    """llama-bench's rule: a 0 in -p or -n skips that kind of test."""
    if not 0 <= spread < 1:
        raise ValueError(f"the length spread must be in [0, 1), got {spread}")
    tests = [TestSpec(p, 0, spread) for p in n_prompt if p > 0]
    tests += [TestSpec(0, n, spread) for n in n_gen if n > 0]
    tests += [TestSpec(p, n, spread) for p, n in pg]
    return list(dict.fromkeys(tests))


def _spread_low(length: int, spread: float) -> int:
    return max(1, math.ceil(length * (1 - spread) - 1e-9))


def _spread_high(length: int, spread: float) -> int:
    return max(1, math.floor(length * (1 + spread) + 1e-9))


def random_prompt(rng: np.random.Generator, length: int, vocab_size: int) -> tuple[int, ...]:
    # Low ids are control tokens in most vocabularies; keep clear of them.
    low = min(100, vocab_size // 4)
    return tuple(rng.integers(low, vocab_size, size=length).tolist())


def request_lengths(test: TestSpec, count: int, seed: int) -> list[tuple[int, int]]:
    """(prompt length, tokens to generate) of each request; a workload file gives its own, all of them."""
    if test.workload is not None:
        return list(zip(test.workload.prompt_lens, test.workload.gen_lens))
    if test.sessions is not None:
        return test.sessions.lengths(seed)
    if not test.spread:
        return [(test.prompt_len, test.tokens_to_generate)] * count
    # A stream of its own, so the prompts' tokens do not depend on the spread.
    rng = np.random.default_rng([seed, 1])

    def draw(length: int) -> np.ndarray:
        return rng.integers(_spread_low(length, test.spread), _spread_high(length, test.spread) + 1, size=count)

    # tg's one-token prompt and pp's single token have no length to spread; tg's first token comes on top.
    prompts = draw(test.n_prompt) if test.n_prompt else np.ones(count, dtype=int)
    gens = np.ones(count, dtype=int) if test.kind == "pp" else draw(test.n_gen) + (test.kind == "tg")
    return [(int(p), int(g)) for p, g in zip(prompts, gens)]


@functools.lru_cache(maxsize=4)
def _seeded_prompts(test: TestSpec, count: int, vocab_size: int, seed: int) -> tuple[tuple[tuple[int, ...], int], ...]:
    """(prompt, tokens to generate) of each seeded request. Kept: a capacity search replays one seed's requests at
    every rate it probes, and drawing 1.7M prompt tokens took a tenth of a 1000-request probe on the sim."""
    rng = np.random.default_rng(seed)
    if test.workload is not None and test.workload.blocks is not None:
        return _block_prompts(test.workload, vocab_size, seed, rng)
    return tuple((random_prompt(rng, p, vocab_size), g) for p, g in request_lengths(test, count, seed))


def _block_prompts(workload: WorkloadFile, vocab_size: int, seed: int,
                   rng: np.random.Generator) -> tuple[tuple[tuple[int, ...], int], ...]:
    """A trace's prompts made of its blocks: block id b is the same `block_size` seeded tokens wherever it appears,
    so requests that share leading block ids share exactly those tokens (a prompt's last block may be partial: its
    first tokens). A prompt longer than its blocks (not in Mooncake's traces) ends in tokens of its own."""
    size, made = workload.block_size, {}
    out = []
    for length, gen, ids in zip(workload.prompt_lens, workload.gen_lens, workload.blocks):
        tokens: list[int] = []
        for b in ids[:math.ceil(length / size)]:
            if b not in made:
                made[b] = random_prompt(np.random.default_rng([seed, 3, b]), size, vocab_size)
            tokens.extend(made[b])
        prompt = tuple(tokens[:length])
        if len(prompt) < length:
            prompt += random_prompt(rng, length - len(prompt), vocab_size)
        out.append((prompt, gen))
    return tuple(out)


def arriving(test: TestSpec, count: int) -> int:
    """How many arrival times `count` requests of `test` take: multi-turn sessions' first turns (a later turn arrives
    its think time after the turn before it finished), else one a request."""
    return test.sessions.n if test.sessions is not None else count


def make_requests(test: TestSpec, count: int, vocab_size: int, seed: int,
                  arrivals: list[float] | None = None) -> list[Request]:
    """`count` seeded requests of `test` (a workload file: all of its rows), arriving at `arrivals` if given
    (sessions: every turn of every session, `arrivals` their first turns')."""
    if test.sessions is not None:
        if arrivals is None:
            raise ValueError("multi-turn sessions arrive in an open loop: give --arrival poisson (or gamma) and --rate")
        return test.sessions.requests(vocab_size, seed, arrivals)
    prompts = _seeded_prompts(test, count, vocab_size, seed)
    if arrivals is not None and len(arrivals) != len(prompts):
        raise ValueError(f"{len(arrivals)} arrival times for {len(prompts)} requests")
    times = arrivals if arrivals is not None else [None] * len(prompts)
    # a workload's classes (its `class` column, a mix's), one a request; none elsewhere
    classes = test.workload.classes if test.workload is not None and test.workload.classes else [None] * len(prompts)
    return [Request(prompt, g, t, length_class=c) for (prompt, g), t, c in zip(prompts, times, classes)]


# ---- arrivals ---------------------------------------------------------------------------------
ARRIVALS = ("closed", "poisson", "gamma")


@dataclass(frozen=True)
class ArrivalSpec:
    """How requests arrive: a closed loop, or an open loop at `rate` requests per second.

    gamma: intervals drawn from a gamma distribution of shape `burstiness` and
    mean 1/rate (vLLM's --burstiness: 1 is Poisson, below 1 burstier, above 1
    more even). "trace" replays a workload file's own arrival times.
    """

    kind: str = "closed"
    rate: float | None = None
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ARRIVALS + ("trace",):
            raise ValueError(f"unknown arrival process {self.kind!r}; choose from {', '.join(ARRIVALS)}")
        if self.kind in ("poisson", "gamma"):
            if self.rate is None or not self.rate > 0 or math.isinf(self.rate):
                raise ValueError(f"--arrival {self.kind} needs a rate above 0 requests/s, got {self.rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be above 0, got {self.burstiness}")

    @property
    def open_loop(self) -> bool:
        return self.kind != "closed"

    @property
    def shape(self) -> float:
        return 1.0 if self.kind == "poisson" else self.burstiness

    def times(self, count: int, seed: int, test: TestSpec | None = None) -> list[float] | None:
        """Arrival times of `count` requests in seconds from the first; None in a closed loop."""
        if self.kind == "closed":
            return None
        if self.kind == "trace":
            if test is None or test.workload is None or test.workload.arrivals is None:
                raise ValueError("replaying arrivals needs a workload file with arrival_s")
            return list(test.workload.arrivals)
        # A stream of its own: the same seed gives the same prompts whatever the arrivals.
        rng = np.random.default_rng([seed, 2])
        gaps = rng.gamma(self.shape, 1.0 / (self.rate * self.shape), size=max(count - 1, 0))
        # The first request arrives at once, as vLLM's benchmark sends it.
        return [0.0] + np.cumsum(gaps).tolist()


def sessions_test(sessions: SessionSpec) -> TestSpec:
    """Multi-turn sessions as a test: pp+tg, their mean prompt and the answer's length as n_prompt and n_gen."""
    lengths = sessions.lengths(0)
    return TestSpec(round(float(np.mean([p for p, _ in lengths]))), sessions.answer, sessions=sessions)


def workload_test(workload: WorkloadFile) -> TestSpec:
    """A workload file as a test: pp+tg, named after the file, its mean lengths as n_prompt and n_gen."""
    return TestSpec(round(float(np.mean(workload.prompt_lens))), round(float(np.mean(workload.gen_lens))), workload=workload)

"""Tests (pp512, tg128, pp512+tg128) and the seeded requests that make them up."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TestSpec:
    """One llama-bench style test: prompt processing, generation, or both."""

    n_prompt: int
    n_gen: int

    __test__ = False  # not a pytest class

    @property
    def name(self) -> str:
        if self.n_prompt and self.n_gen:
            return f"pp{self.n_prompt}+tg{self.n_gen}"
        return f"pp{self.n_prompt}" if self.n_prompt else f"tg{self.n_gen}"

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
        return self.prompt_len + self.tokens_to_generate


def make_tests(n_prompt: list[int], n_gen: list[int], pg: list[tuple[int, int]]) -> list[TestSpec]:
    """llama-bench's rule: a 0 in -p or -n skips that kind of test."""
    tests = [TestSpec(p, 0) for p in n_prompt if p > 0]
    tests += [TestSpec(0, n) for n in n_gen if n > 0]
    tests += [TestSpec(p, n) for p, n in pg]
    return list(dict.fromkeys(tests))


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    n_gen: int


def random_prompt(rng: np.random.Generator, length: int, vocab_size: int) -> tuple[int, ...]:
    # Low ids are control tokens in most vocabularies; keep clear of them.
    low = min(100, vocab_size // 4)
    return tuple(int(t) for t in rng.integers(low, vocab_size, size=length))


def make_requests(test: TestSpec, count: int, vocab_size: int, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(random_prompt(rng, test.prompt_len, vocab_size), test.tokens_to_generate) for _ in range(count)]

"""--verify: teacher-forced logit comparison holds for every strategy and fails a corrupted one."""
from __future__ import annotations

from dataclasses import replace

import pytest

from prefillbench import engine
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.bench.cases import BenchConfig, verify_logits
from prefillbench.report.tables import render_verify
from prefillbench.bench.workloads import TestSpec
from prefillbench.sequence import Request
from strategies import STRATEGIES, make_strategy
from strategies.chunked import Chunked
from prefillbench.backends.fake import FakeBackend
from tiny_models import tiny_model

CHUNK = 5


#: slo-budget needs an SLO and a price to run: its tokens are checked in test_slo_budget.py
UNPRICED = tuple(n for n, c in STRATEGIES.items() if not c.needs_price)


def config(test: TestSpec, strategies=UNPRICED, concurrency=3, requests=5) -> BenchConfig:
    return BenchConfig(tests=[test], strategies=list(strategies), concurrency=[concurrency], chunk_sizes=[CHUNK],
                       requests=requests)


def swap_last_two_prompt_tokens(step, waiting):
    """A wrong position: the last two tokens of every prompt chunk change places."""
    return replace(step, prefills=tuple(c._replace(tokens=c.tokens[:-2] + c.tokens[:-3:-1]) for c in step.prefills))


def drop_first_chunk(step, waiting):
    """A dropped chunk: a prompt's first chunk is never computed; the next one's tokens stand in for it."""
    prompts = {s.seq_id: s.prompt for s in waiting}
    return replace(step, prefills=tuple(
        c._replace(tokens=prompts[c.seq_id][c.end : c.end + len(c.tokens)]) if c.start == 0 and not c.is_last else c
        for c in step.prefills
    ))


CORRUPTIONS = {"wrong position": swap_last_two_prompt_tokens, "dropped chunk": drop_first_chunk}


@pytest.fixture
def corrupt_chunked(monkeypatch):
    def install(corruption):
        original = Chunked.next_step
        monkeypatch.setattr(Chunked, "next_step", lambda self, waiting, running: corruption(original(self, waiting, running), waiting))

    return install


def check_verify(backend, test: TestSpec, expect_pass: bool) -> list:
    results = verify_logits(backend, config(test))
    assert [r.strategy for r in results] == [s if not make_strategy(s).uses_chunk_size else f"{s} ({CHUNK})"
                                             for s in UNPRICED[1:]]
    assert all(r.reference == "sequential" and r.positions == 5 * test.tokens_to_generate for r in results)
    chunked = next(r for r in results if r.strategy.startswith("chunked"))
    assert chunked.passed == expect_pass, chunked
    if expect_pass:
        assert all(r.passed for r in results), [r for r in results if not r.passed]
    return results


def test_forced_tokens_are_fed_back_instead_of_the_models():
    backend = FakeBackend()
    forced = (7, 8, 9)
    record = engine.run(backend, make_strategy("chunked", 2), [Request((1, 2, 3), 3, forced_tokens=forced)], 1)
    assert record.requests[0].tokens == list(forced)
    assert [d.token for s in backend.steps for d in s.decodes] == [7, 8]  # the backend's own choices were 4, 5


# -- torch: float32, a tight tolerance ------------------------------------------------


@pytest.fixture(scope="module")
def tiny_torch():
    model, _ = tiny_model("llama")
    return TorchBackend(model, "tiny-llama")


def test_every_strategy_agrees_on_torch(tiny_torch):
    results = check_verify(tiny_torch, TestSpec(23, 6), expect_pass=True)
    # float32: the strategies differ only by summation order.
    assert max(r.max_abs_diff for r in results) < 1e-4
    assert all(r.confident == r.top1_agree == r.positions for r in results)


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupted_strategy_fails_on_torch(tiny_torch, corrupt_chunked, corruption):
    corrupt_chunked(CORRUPTIONS[corruption])
    results = check_verify(tiny_torch, TestSpec(23, 6), expect_pass=False)
    chunked = next(r for r in results if r.strategy.startswith("chunked"))
    assert chunked.max_abs_diff > 10 * tiny_torch.logit_tolerance().max_abs
    assert "FAIL" in next(line for line in render_verify(results).splitlines() if "chunked" in line)


def test_the_sim_has_no_logits_to_verify():
    with pytest.raises(ValueError, match="computes none"):
        verify_logits(SimBackend.load("llama-13b", "a100"), config(TestSpec(32, 4)))


# -- gguf: the tiny float model with llama.cpp's defaults, and the shipped Q4_1 model -------------


@pytest.fixture(scope="module")
def tiny_gguf(tiny_gguf_path):
    from prefillbench.backends.gguf import GGUFBackend

    backend = GGUFBackend.load(tiny_gguf_path, threads=1)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def smol():
    from prefillbench.backends.gguf import GGUFBackend
    from prefillbench.models import default_model_path

    backend = GGUFBackend.load(default_model_path(), threads=1)
    yield backend
    backend.close()


@pytest.mark.parametrize("model", ["tiny_gguf", "smol"])
def test_every_strategy_agrees_on_gguf(model, request):
    backend = request.getfixturevalue(model)
    check_verify(backend, TestSpec(23, 6), expect_pass=True)


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
@pytest.mark.parametrize("model", ["tiny_gguf", "smol"])
def test_a_corrupted_strategy_fails_on_gguf(model, corruption, request, corrupt_chunked):
    backend = request.getfixturevalue(model)
    corrupt_chunked(CORRUPTIONS[corruption])
    check_verify(backend, TestSpec(23, 6), expect_pass=False)

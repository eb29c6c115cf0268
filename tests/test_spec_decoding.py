"""Speculative decoding in the engine: vLLM's n-gram drafter, greedy acceptance, the rollback of rejected drafts'
KV, and the test that matters: a real model's greedy tokens identical with and without n-gram drafting."""
from __future__ import annotations

import pytest

from prefillbench import engine
from prefillbench.backends.fake import FakeBackend
from prefillbench.engine.drafts import NgramProposer, accepted_tokens, longest_ngram_drafts
from prefillbench.engine.memory import KVMemory
from prefillbench.errors import BackendError
from prefillbench.sequence import Request, Sequence
from prefillbench.speculation import parse_spec
from strategies import make_strategy


def lookup(tokens, min_n, max_n, k, max_model_len=1024):
    return longest_ngram_drafts(tokens, min_n, max_n, k, max_model_len)


def test_ngram_lookup_matches_vllms_own_cases():
    # vLLM tests/v1/spec_decode/test_ngram.py, test_find_longest_matched_ngram_and_propose_tokens
    assert lookup([1, 2, 3, 4, 1, 2, 3, 5, 6], 2, 2, 2) == []
    assert lookup([1, 2, 3, 4, 1, 2, 3], 2, 2, 3) == [4, 1, 2]
    assert lookup([1, 2, 3, 4, 1, 2, 3], 2, 2, 2) == [4, 1]
    assert lookup([1, 2, 3, 4, 1, 2, 3], 1, 1, 3) == [4, 1, 2]
    assert lookup([1, 2, 3, 4, 1, 2, 3], 1, 1, 2) == [4, 1]
    assert lookup([1, 3, 6, 2, 3, 4, 1, 2, 3], 2, 2, 3) == [4, 1, 2]
    assert lookup([1, 3, 6, 2, 3, 4, 1, 2, 3], 1, 1, 2) == [6, 2]  # the earliest match
    # ... and test_ngram_proposer
    assert lookup([1, 2, 3, 4, 5], 2, 2, 2) == []
    assert lookup([1, 2, 3, 4, 1, 2, 3], 4, 4, 2) == []
    assert lookup([1, 2, 3, 4, 1, 2, 3], 3, 4, 2) == [4, 1]
    assert lookup([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], 3, 4, 2) == [1, 2]  # the 4-gram, not the 3-gram's [5, 1]
    assert lookup([3, 4, 5, 2, 3, 4, 1, 2, 3, 4], 2, 4, 2) == [1, 2]
    assert lookup([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], 3, 3, 2) == [100, 1]


def test_ngram_lookup_edges():
    assert lookup([7], 2, 4, 3) == []  # shorter than min_n
    assert lookup([1, 2, 1, 2], 2, 4, 3, max_model_len=4) == []  # the model's length reached
    assert lookup([1, 2, 9, 1, 2], 2, 4, 5) == [9, 1, 2]  # fewer than k follow the match
    assert lookup([1, 2, 9, 1, 2], 2, 4, 5, max_model_len=6) == [9]  # k cut to the model's length


def test_the_proposer_reads_prompt_and_output():
    seq = Sequence(0, (5, 6, 7, 8), 10, 0.0, n_prefilled=4, generated=[5, 6])
    assert NgramProposer(parse_spec("ngram:2"), 1024).propose(seq, 2) == [7, 8]
    assert NgramProposer(parse_spec("ngram:2"), 1024).propose(seq, 1) == [7]


def test_acceptance_is_the_agreeing_prefix_plus_one():
    assert accepted_tokens((4, 5, 6), (4, 5, 6, 7)) == [4, 5, 6, 7]  # all held: the bonus token too
    assert accepted_tokens((4, 5, 6), (4, 9, 6, 7)) == [4, 9]  # the target's correction ends it
    assert accepted_tokens((4, 5, 6), (8, 5, 6, 7)) == [8]
    assert accepted_tokens((), (3,)) == [3]


def test_shrink_frees_the_blocks_left_empty():
    memory = KVMemory(160, block_size=16)
    memory.grow(1, 40)  # 3 blocks
    assert memory.used == 3 and memory.shrink(1, 33) == 0  # still 3 blocks
    assert memory.shrink(1, 32) == 1 and memory.used == 2 and memory.held_blocks(1) == 2
    assert memory.shrink(1, 1) == 1 and memory.used == 1


#: The fake's "model" says position + 1 after every position: a prompt of 20 tokens is followed by 20, 21, 22...
#: This prompt holds 20..27 (so the drafts after 20, 21 and 24, 25 are taken) and then breaks the run (500, 501: a
#: draft rejected), and later 30..33 again.
PROMPT = (20, 21, 22, 23, 24, 25, 26, 27, 500, 501, 28, 29, 30, 31, 32, 33, 777, 600, 601, 602)


def fake_run(spec: str, strategy: str = "vllm-v1", concurrency: int = 1, n_gen: int = 24,
             kv_tokens: int | None = None):
    backend = FakeBackend()
    backend.kv_cache_tokens = kv_tokens
    requests = [Request(PROMPT, n_gen) for _ in range(3)]
    record = engine.run(backend, make_strategy(strategy, 64, parse_spec(spec)), requests, concurrency)
    return backend, record


@pytest.mark.parametrize("strategy", ["vllm-v1", "sarathi-serve", "sglang", "orca", "chunked"])
@pytest.mark.parametrize("concurrency", [1, 3])
def test_drafting_on_the_fake_backend_changes_no_token_and_takes_fewer_steps(strategy, concurrency):
    _, plain = fake_run("off", strategy, concurrency)
    backend, spec = fake_run("ngram:3", strategy, concurrency)
    assert [r.tokens for r in spec.requests] == [r.tokens for r in plain.requests]
    assert all(r.tokens == list(range(20, 44)) for r in spec.requests)
    assert len(spec.steps) < len(plain.steps)
    for r in spec.requests:
        assert 0 < r.accepted < r.drafted  # drafts accepted and rejected
        assert r.verify_steps <= r.decode_steps == len(r.tokens) - 1 - r.accepted
    assert backend.truncated  # rejected drafts rolled back
    assert {r.drafted for r in plain.requests} == {0}


def test_a_verify_step_feeds_k_plus_one_positions_and_rolls_back_past_the_accepted():
    backend, record = fake_run("ngram:3", concurrency=1, n_gen=12)
    fed = [d for step in backend.steps for d in step.decodes if d.seq_id == 0]
    # prefill -> 20; then 20 alone (no 2-gram yet); 21 with drafts 22 23 24, all held (+ 25); 25 with 26 27 500
    assert [(d.token, d.position, d.drafts) for d in fed[:3]] == [
        (20, 20, ()), (21, 21, (22, 23, 24)), (25, 25, (26, 27, 500))]
    # 26 and 27 held, 500 rejected (the target said 28): positions 0..27 kept
    assert (0, 28) in backend.truncated
    r = record.requests[0]
    assert r.tokens == list(range(20, 32))
    # every token of a step appears at its end
    ends = [s.end for s in record.steps]
    assert set(r.token_times) <= set(ends) and r.token_times == sorted(r.token_times)


def test_drafts_never_reach_past_the_output_length():
    backend, record = fake_run("ngram:5", "sarathi-serve", n_gen=7)
    for step in backend.steps:
        for d in step.decodes:
            assert d.position + len(d.drafts) < len(PROMPT) + 7 - 1
    assert all(len(r.tokens) == 7 for r in record.requests)


def test_vllm_v1_drafts_k_on_a_requests_last_steps_as_vllm_does():
    # vLLM's NgramProposer and scheduler know no max_tokens: the last verify step carries K drafts past the output,
    # and the output is still cut at its length
    backend, record = fake_run("ngram:5", "vllm-v1", n_gen=7)
    assert any(d.position + len(d.drafts) >= len(PROMPT) + 7 - 1 for step in backend.steps for d in step.decodes)
    assert all(len(r.tokens) == 7 for r in record.requests)


def test_rejected_drafts_free_their_blocks(monkeypatch):
    shrunk = []
    original = KVMemory.shrink

    def spy(self, seq_id, tokens):
        n = original(self, seq_id, tokens)
        shrunk.append((seq_id, tokens, n, self.held_blocks(seq_id), self.blocks_for(tokens)))
        return n

    monkeypatch.setattr(KVMemory, "shrink", spy)
    fake_run("ngram:3", "vllm-v1", n_gen=24, kv_tokens=4096)
    assert shrunk and all(held == needed for *_, held, needed in shrunk)


def test_spec_is_refused_where_the_backend_cannot_verify():
    backend = FakeBackend()
    with pytest.raises(BackendError, match="cannot run --spec eagle:3:accept=0.7"):
        engine.run(backend, make_strategy("vllm-v1", 64, parse_spec("eagle:3:accept=0.7")), [Request(PROMPT, 4)], 1)


# -- the shipped model, greedy: every token the same with and without n-gram drafting ---------------------------------

#: Prompts that repeat themselves (code, lists), so the drafter finds n-grams whose continuation the model takes
#: (accepted) and n-grams it leaves (rejected); eight, for c=8. Each one's greedy tokens win by a logit margin of at
#: least 0.12 over these 16 tokens: a verify pass computes a decode among other rows, so a near tie (0.03 on
#: "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1,") may fall either way, with drafting or without, as it may between two
#: strategies' batches.
SMOL_TEXTS = (
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(",
    "1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3,",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(",
    "a b c d e f g a b c d e f g a b",
    "Monday, Tuesday, Wednesday, Monday, Tuesday,",
    "A, B, C, D, E, A, B, C, D,",
    "10 20 30 40 50 10 20 30",
    "cat dog cat dog cat dog cat",
)
SMOL_GEN = 16
SPEC_STRATEGIES = ("vllm-v1", "sarathi-serve", "sglang")


@pytest.fixture(scope="module")
def smol_prompts():
    from llama_cpp import Llama

    from prefillbench.models import default_model_path

    vocab = Llama(model_path=default_model_path(), vocab_only=True, verbose=False)
    prompts = [tuple(vocab.tokenize(t.encode(), add_bos=False)) for t in SMOL_TEXTS]
    vocab.close()
    return prompts


def check_exact_with_drafting(backend, prompts):
    requests = [Request(p, SMOL_GEN) for p in prompts]
    drafted = accepted = 0
    for name in SPEC_STRATEGIES:
        for concurrency in (1, len(prompts)):
            plain = engine.run(backend, make_strategy(name, 16), requests, concurrency)
            spec = engine.run(backend, make_strategy(name, 16, parse_spec("ngram:3")), requests, concurrency)
            assert [r.tokens for r in spec.requests] == [r.tokens for r in plain.requests], f"{name} c={concurrency}"
            drafted += sum(r.drafted for r in spec.requests)
            accepted += sum(r.accepted for r in spec.requests)
            assert len(spec.steps) < len(plain.steps), f"{name} c={concurrency}: drafting saved no step"
    assert 0 < accepted < drafted  # drafts were accepted, and some rejected (so rolled back)


@pytest.fixture(scope="module")
def smol_gguf():
    from prefillbench.backends.gguf import GGUFBackend
    from prefillbench.models import default_model_path

    # float32 KV and no flash attention: llama.cpp computes in float32 throughout, so the rows of a verify pass
    # differ from a lone decode's only by summation order (an f16 cache moved a 0.04 margin the other way).
    backend = GGUFBackend.load(default_model_path(), kv_type="f32", flash_attn=False, threads=1)
    yield backend
    backend.close()


def test_gguf_tokens_identical_with_and_without_ngram_drafting(smol_gguf, smol_prompts):
    check_exact_with_drafting(smol_gguf, smol_prompts)


def test_torch_tokens_identical_with_and_without_ngram_drafting(smol_prompts):
    from prefillbench.backends.torch.backend import TorchBackend
    from prefillbench.models import default_model_path

    # Without the linear tuner: it times its candidates at every new row count, and verify steps bring many.
    check_exact_with_drafting(TorchBackend.load(default_model_path(), device="cpu", tune_linear=False), smol_prompts)


def test_a_method_without_a_real_drafter_is_refused_on_gguf(smol_gguf, smol_prompts):
    with pytest.raises(BackendError, match="gguf cannot run --spec mtp:2:accept=0.8: it runs ngram"):
        engine.run(smol_gguf, make_strategy("vllm-v1", 16, parse_spec("mtp:2:accept=0.8")),
                   [Request(smol_prompts[0], 4)], 1)


# -- rows and the command line ------------------------------------------------------------------------------------

def test_spec_columns_count_drafts_acceptance_and_tokens_per_step():
    from prefillbench.bench.spec_columns import spec_columns, spec_of

    _, record = fake_run("ngram:3", n_gen=24)
    reqs = record.requests
    cols = spec_columns("vllm-v1 · spec ngram:3", reqs)
    drafted, accepted = sum(r.drafted for r in reqs), sum(r.accepted for r in reqs)
    verify, steps = sum(r.verify_steps for r in reqs), sum(r.decode_steps for r in reqs)
    assert cols["spec"] == "ngram:3" and cols["spec_k"] == 3
    assert cols["spec_acceptance"] == accepted / drafted
    assert cols["spec_accepted_len"] == 1 + accepted / verify
    assert cols["spec_tokens_per_step"] == 3 * 23 / steps > 1
    assert spec_of("vllm-v1 · cadence interval:4") == "off" and spec_columns("vllm-v1", reqs) == {}


def test_tbt_is_one_gap_per_step_with_drafting():
    from prefillbench.bench.metrics import request_tbts_ms

    _, record = fake_run("ngram:3", n_gen=24)
    r = record.requests[0]
    gaps = request_tbts_ms(r)
    assert len(gaps) == r.decode_steps and (gaps > 0).all()  # one per step that brought it tokens


def test_spec_on_the_command_line_is_a_grid_and_named_in_the_table(run_cli):
    base = ("run", "--backend", "fake", "-p", "0", "-n", "0", "--pg", "32,6", "-c", "1", "-r", "1", "-s", "vllm-v1",
            "--no-results-file", "--no-verdict", "--no-progress")
    code, out, err = run_cli(*base, "--spec", "off,ngram:3")
    assert code == 0, err
    assert "vllm-v1 (256) · spec ngram:3" in out and "| vllm-v1 (256) " in out
    code, out, err = run_cli(*base, "--spec", "ngram:0")
    assert code != 0 and "--spec 'ngram:0': the draft length K must be at least 1" in err and "Traceback" not in err

"""Every strategy computes what a plain forward pass computes."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from prefillbench import generate
from prefillbench import engine
from prefillbench.backends.torch import attention as torch_attention
from prefillbench.backends.base import BackendError
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.step import DecodeToken, PrefillChunk, Step
from prefillbench.sequence import Request
from strategies import STRATEGIES, make_strategy
from tiny_models import ARCHITECTURES, MORE_ARCHITECTURES, TEST_DEVICE, reference_logits, tiny_model

PROMPT_LENGTHS = (13, 7, 24, 1)  # different lengths in one run, one a single token
N_GEN = 5


@pytest.fixture(scope="module", params=ARCHITECTURES)
def pair(request):
    model, reference = tiny_model(request.param)
    return TorchBackend(model, f"tiny-{request.param}", TEST_DEVICE), reference


def _requests(n: int, seed: int = 1) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(tuple(int(t) for t in rng.integers(0, 512, size=PROMPT_LENGTHS[i % 4])), N_GEN) for i in range(n)]


# Chunk sizes 4 and 5 divide some prompt lengths and not others; 32 exceeds them all.
STRATEGY_CASES = [
    ("sequential", 256), ("padded", 256), ("packed", 256), ("orca", 256), ("static", 256),
    ("chunked", 4), ("chunked", 5), ("chunked", 32), ("sarathi-serve", 4), ("sarathi-serve", 9),
]


@pytest.mark.parametrize("strategy,chunk_size", STRATEGY_CASES)
@pytest.mark.parametrize("concurrency", [1, 2, 3, 4])
def test_logits_match_plain_forward(pair, strategy, concurrency, chunk_size):
    backend, reference = pair
    requests = _requests(4)
    record = engine.run(backend, make_strategy(strategy, chunk_size), requests, concurrency, keep_logits=True)
    assert len(record.requests) == len(requests)
    for req, rec in zip(requests, record.requests):
        assert len(rec.tokens) == N_GEN and len(rec.logits) == N_GEN
        full = list(req.prompt) + rec.tokens[:-1]
        expected = reference_logits(reference, full)[len(req.prompt) - 1 :]
        got = torch.tensor(np.stack(rec.logits))
        torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)
        assert rec.tokens == expected.argmax(-1).tolist()


def test_closed_loop_more_requests_than_concurrency(pair):
    backend, reference = pair
    requests = _requests(7, seed=3)
    record = engine.run(backend, make_strategy("chunked", 5), requests, 3, keep_logits=True)
    for req, rec in zip(requests, record.requests):
        full = list(req.prompt) + rec.tokens[:-1]
        expected = reference_logits(reference, full)[len(req.prompt) - 1 :]
        torch.testing.assert_close(torch.tensor(np.stack(rec.logits)), expected, atol=2e-4, rtol=1e-4)
    # Never more than 3 sequences in one step.
    assert max(len(s.decode_contexts) + len(s.prefill_chunks) for s in record.steps) <= 3


def test_chunked_steps_carry_decodes_with_a_chunk(pair):
    backend, _ = pair
    record = engine.run(backend, make_strategy("chunked", 4), _requests(4), 4)
    mixed = [s for s in record.steps if s.prefill_chunks and s.decode_contexts]
    assert mixed, "decodes never rode along with a prefill chunk"
    assert all(len(s.prefill_chunks) <= 1 and all(n <= 4 for _, n in s.prefill_chunks) for s in record.steps)


def test_padded_pads_to_longest_and_computes_pads(pair):
    backend, _ = pair
    record = engine.run(backend, make_strategy("padded"), _requests(4), 4)
    first = record.steps[0]
    assert [n for _, n in first.prefill_chunks] == list(PROMPT_LENGTHS)
    assert first.n_pad == sum(max(PROMPT_LENGTHS) - n for n in PROMPT_LENGTHS)


def test_generate_api_agrees_across_strategies(pair):
    backend, _ = pair
    prompts = [list(r.prompt) for r in _requests(3, seed=5)]
    outputs = {s: generate(prompts, model=backend, strategy=s, chunk_size=3, max_new_tokens=6)
               for s in STRATEGIES if not STRATEGIES[s].needs_price}  # slo-budget needs an SLO
    assert all(len(o) == 3 and all(len(t) == 6 for t in o) for o in outputs.values())
    assert all(o == outputs["sequential"] for o in outputs.values())


def test_context_overflow_is_a_clear_error(pair):
    backend, _ = pair
    with pytest.raises(BackendError, match="context"):
        engine.run(backend, make_strategy("sequential"), [Request((1,) * 250, 10)], 1)


@pytest.mark.parametrize("arch", MORE_ARCHITECTURES)
def test_other_architectures_match_plain_forward(arch):
    model, reference = tiny_model(arch)
    backend = TorchBackend(model, f"tiny-{arch}", TEST_DEVICE)
    requests = _requests(4, seed=7)
    record = engine.run(backend, make_strategy("chunked", 5), requests, 3, keep_logits=True)
    for req, rec in zip(requests, record.requests):
        expected = reference_logits(reference, list(req.prompt) + rec.tokens[:-1])[len(req.prompt) - 1 :]
        torch.testing.assert_close(torch.tensor(np.stack(rec.logits)), expected, atol=2e-4, rtol=1e-4)


def _step_logits(backend, step: Step) -> dict[int, torch.Tensor]:
    result = backend.execute(step, return_logits=True)
    assert set(result.next_tokens) == set(step.emitting_seq_ids)
    return {seq: torch.tensor(row) for seq, row in result.logits.items()}


def test_ragged_multi_chunk_steps_match_plain_forward(pair):
    """Several chunks of different lengths and offsets, with and without decodes, in one step.

    Decodes come in an order that is not their slots' order and skip a slot, so
    attention reads more than one run of slots, some queries out of order.
    """
    backend, reference = pair
    rng = np.random.default_rng(11)
    prompts = {seq: [int(t) for t in rng.integers(0, 512, size=n)] for seq, n in {0: 9, 1: 12, 2: 7, 3: 10}.items()}
    backend.prepare(4, 40, 64)
    tokens = {seq: list(p) for seq, p in prompts.items()}  # each sequence's tokens so far, generated included
    expected_at: dict[int, list[tuple[int, torch.Tensor]]] = {seq: [] for seq in prompts}

    def chunk(seq: int, start: int, end: int) -> PrefillChunk:
        return PrefillChunk(seq, tuple(prompts[seq][start:end]), start, end == len(prompts[seq]))

    def decode(seq: int) -> DecodeToken:
        return DecodeToken(seq, tokens[seq][-1], len(tokens[seq]) - 1)

    def run(step: Step) -> None:
        for seq, logits in _step_logits(backend, step).items():
            expected_at[seq].append((len(tokens[seq]), logits))
            tokens[seq].append(int(logits.argmax()))

    run(Step(prefills=(chunk(0, 0, 5), chunk(1, 0, 3), chunk(2, 0, 7))))  # ragged, all from position 0
    run(Step(prefills=(chunk(0, 5, 9), chunk(1, 3, 10), chunk(3, 0, 4)), decodes=(decode(2),)))  # offsets > 0
    run(Step(prefills=(chunk(1, 10, 12), chunk(3, 4, 10)), decodes=(decode(2), decode(0))))  # decodes out of slot order
    run(Step(decodes=(decode(3), decode(0), decode(2))))  # slots 3, 0, 2: two runs, a gap at slot 1
    run(Step(decodes=tuple(decode(s) for s in (1, 3, 2, 0))))
    for seq, got in expected_at.items():
        assert len(got) >= 2
        full = reference_logits(reference, tokens[seq][:-1])
        for position, logits in got:
            torch.testing.assert_close(logits, full[position - 1], atol=2e-4, rtol=1e-4)
    for seq in prompts:
        backend.release(seq)


@pytest.mark.parametrize("arch, fused", [("llama", True), ("qwen2", True), ("mistral", True), ("phi3", False),
                                         ("qwen3", False), ("gemma", False)])
def test_projections_are_fused_only_for_plain_llama_family_layers(arch, fused):
    model, _ = tiny_model(arch)
    backend = TorchBackend(model, f"tiny-{arch}", TEST_DEVICE)
    assert (backend.fused is not None) == fused
    assert backend.metadata()["fused_projections"].startswith("qkv" if fused else "off")
    if fused:
        first = backend.fused.layers[0]
        attn = first.module.self_attn
        # transformers' modules keep views of the fused rows: the weights are stored once.
        assert attn.k_proj.weight.untyped_storage().data_ptr() == first.qkv.weight.untyped_storage().data_ptr()
        torch.testing.assert_close(first.qkv.weight[first.qkv_sizes[0]:][: first.qkv_sizes[1]], attn.k_proj.weight)
        assert (first.qkv.bias is not None) == (arch == "qwen2")  # qwen2's q, k and v have biases
        # The replaced layers are never called, so the kernel tuner neither routes nor times them.
        assert "forward" not in attn.q_proj.__dict__ and "forward" in attn.o_proj.__dict__
        peers = [t.weight.data_ptr() for ts in backend.linear_kernels.layers.values() for t in ts]
        assert attn.k_proj.weight.data_ptr() not in peers  # a view inside the fused weight, not a peer of its own
        assert first.qkv.weight.data_ptr() in peers


def test_a_layer_whose_projections_cannot_fuse_keeps_transformers_forward():
    model, reference = tiny_model("llama")
    attn = model.model.layers[1].self_attn
    attn.k_proj.bias = torch.nn.Parameter(torch.zeros(attn.k_proj.out_features, device=attn.k_proj.weight.device))
    backend = TorchBackend(model, "tiny-llama-k-bias", TEST_DEVICE)
    assert backend.fused is None  # only k has a bias: no single fused q/k/v product
    requests = _requests(2, seed=3)
    record = engine.run(backend, make_strategy("chunked", 5), requests, 2, keep_logits=True)
    reference.model.layers[1].self_attn.k_proj.bias = torch.nn.Parameter(attn.k_proj.bias.detach().clone())
    for req, rec in zip(requests, record.requests):
        expected = reference_logits(reference, list(req.prompt) + rec.tokens[:-1])[len(req.prompt) - 1 :]
        torch.testing.assert_close(torch.tensor(np.stack(rec.logits)), expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("start,length", [(0, 1), (0, 256), (0, 257), (0, 300), (0, 512), (0, 513), (40, 300)])
def test_query_blocks_cover_the_chunk_once_each_up_to_its_own_positions(start, length):
    blocks = torch_attention.chunk_query_blocks(start, length, torch.float32, "cpu")
    assert [b.first for b in blocks] == list(itertools.accumulate([0] + [b.length for b in blocks[:-1]]))
    assert sum(b.length for b in blocks) == length
    for b in blocks:
        assert b.kv_len == start + b.first + b.length  # no query sees a later position; none misses an earlier one
        assert (b.mask is None) == (start + b.first == 0)
    cut = start == 0 and length in torch_attention.QUERY_BLOCKS_FOR
    assert (len(blocks) > 1) == cut


def test_prompts_attended_in_query_blocks_match_plain_forward():
    """Prompts of 257-512 tokens attend block by block; every position's logits still match a plain forward."""
    model, reference = tiny_model("llama", max_position_embeddings=1024)
    backend = TorchBackend(model, "tiny-llama", TEST_DEVICE)
    rng = np.random.default_rng(5)
    prompts = {0: [int(t) for t in rng.integers(0, 512, size=300)], 1: [int(t) for t in rng.integers(0, 512, size=512)],
               2: [int(t) for t in rng.integers(0, 512, size=40)]}
    backend.prepare(3, 560, 1200)
    step = Step(prefills=tuple(PrefillChunk(seq, tuple(p), 0, True) for seq, p in prompts.items()))
    got = _step_logits(backend, step)
    for seq, p in prompts.items():
        torch.testing.assert_close(got[seq], reference_logits(reference, p)[-1], atol=2e-4, rtol=1e-4)
    # Alone in its step, a blocked prompt's output is assembled from its blocks, not returned from one call.
    backend.prepare(3, 560, 1200)
    alone = _step_logits(backend, Step(prefills=(PrefillChunk(1, tuple(prompts[1]), 0, True),)))
    torch.testing.assert_close(alone[1], reference_logits(reference, prompts[1])[-1], atol=2e-4, rtol=1e-4)

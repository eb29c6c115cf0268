"""The CUDA attention routes' code, run on the CPU: the flex route computes what a plain forward computes,
reads only each row's own context, and is what a CUDA device gets; graph capture runs under inference mode.

test_torch_backend's ragged-step parity test runs here again, unchanged, over a backend forced onto the flex
route (its `pair` fixture is this module's). Eager FlexAttention costs a CPU seconds a run, so every strategy
runs once per architecture at one concurrency, and the linear tuner (which attention does not see) stays off."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from prefillbench import engine
from prefillbench.backends.base import BackendError
from prefillbench.backends.torch import flash, flex
from prefillbench.backends.torch.attention_meta import AttentionMeta
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.backends.torch.graphs import DecodeGraphs
from prefillbench.backends.torch.routes import choose_route
from prefillbench.step import DecodeToken, PrefillChunk, Step, pack
from strategies import make_strategy
from test_torch_backend import STRATEGY_CASES, _requests
from test_torch_backend import test_ragged_multi_chunk_steps_match_plain_forward  # noqa: F401: runs over this module's `pair`
from tiny_models import ARCHITECTURES, TEST_DEVICE, reference_logits, tiny_model


def flex_backend(arch: str = "llama", **overrides) -> tuple[TorchBackend, torch.nn.Module]:
    model, reference = tiny_model(arch, **overrides)
    return TorchBackend(model, f"tiny-{arch}", TEST_DEVICE, attention="flex", tune_linear=False), reference


@pytest.fixture(scope="module", params=ARCHITECTURES)
def pair(request):
    return flex_backend(request.param)


def _assert_matches_plain_forward(record, requests, reference) -> None:
    for req, rec in zip(requests, record.requests):
        expected = reference_logits(reference, list(req.prompt) + rec.tokens[:-1])[len(req.prompt) - 1 :]
        torch.testing.assert_close(torch.tensor(np.stack(rec.logits)), expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("strategy,chunk_size", STRATEGY_CASES)
def test_every_strategy_through_the_flex_route_matches_plain_forward(pair, strategy, chunk_size):
    backend, reference = pair
    requests = _requests(4)
    record = engine.run(backend, make_strategy(strategy, chunk_size), requests, 3, keep_logits=True)
    assert len(record.requests) == len(requests)
    _assert_matches_plain_forward(record, requests, reference)
    for req, rec in zip(requests, record.requests):
        expected = reference_logits(reference, list(req.prompt) + rec.tokens[:-1])[len(req.prompt) - 1 :]
        assert rec.tokens == expected.argmax(-1).tolist()


def test_the_route_for_cuda_is_never_masked_sdpa():
    assert choose_route("cuda", "auto", flash_available=False) == "flex"
    assert choose_route("cuda", "auto", flash_available=True) == "flash"
    assert choose_route("cpu", "auto", flash_available=True) == "cpu"  # the CPU keeps its tuned route
    assert choose_route("cpu", "flex") == "flex"
    assert not flex.FlexRoute.masked_sdpa and not flash.FlashRoute.masked_sdpa
    with pytest.raises(BackendError, match="flash-attn"):
        choose_route("cuda", "flash", flash_available=False)
    with pytest.raises(BackendError, match="unknown attention route"):
        choose_route("cuda", "sdpa")


def test_a_bf16_gqa_model_on_cuda_gets_a_cuda_route_and_no_cpu_measured_extras():
    """Built for device "cuda" (nothing runs on it): the route, the LM head's copy, the query blocks."""
    model, _ = tiny_model("llama")  # 4 query heads over 2 KV heads
    backend = TorchBackend(model.to(torch.bfloat16), "tiny-llama", "cuda")
    assert backend.route_name == ("flash" if flash.available() else "flex")
    assert all(t.weight_t is None for t in backend.linear_kernels.by_module.values())  # no transposed LM head
    assert backend.use_cuda_graphs and backend.decode_plan_note.startswith("off")
    from prefillbench.backends.torch.attention import QUERY_BLOCKS_FOR, chunk_query_blocks

    assert len(chunk_query_blocks(0, QUERY_BLOCKS_FOR.start, torch.bfloat16, "cuda")) == 1


def test_flex_route_steps_call_no_sdpa(monkeypatch):
    backend, reference = flex_backend("qwen2")

    def refuse(*args, **kwargs):
        raise AssertionError("SDPA called on the flex route")

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", refuse)
    requests = _requests(3, seed=2)
    record = engine.run(backend, make_strategy("chunked", 5), requests, 3, keep_logits=True)
    monkeypatch.undo()
    _assert_matches_plain_forward(record, requests, reference)


def test_padded_steps_attend_in_one_call_per_layer():
    backend, _ = flex_backend()
    calls = {"chunks": 0, "decodes": 0}
    route_calls = {}

    def counting(name, fn):
        def call(*args):
            calls[name] += 1
            return fn(*args)
        return call

    backend.prepare(4, 64, 256)
    route_calls["chunks"], route_calls["decodes"] = backend.route._chunks, backend.route._decodes
    backend.route._chunks = counting("chunks", route_calls["chunks"])
    backend.route._decodes = counting("decodes", route_calls["decodes"])
    step = Step(prefills=tuple(PrefillChunk(seq, (5 + seq,) * n, 0, True, pad=13 - n) for seq, n in enumerate((13, 7, 9))))
    backend.execute(step)
    assert calls == {"chunks": backend.n_layers, "decodes": 0}


def _static_decode_steps(backend, reference, poison: bool) -> None:
    """Prompts prefilled eagerly, then decodes through the graphs' forward (uncaptured); cache positions beyond
    each context (and every unused slot) optionally poisoned with huge values before each decode step."""
    rng = np.random.default_rng(4)
    lengths = {0: 5, 1: 130, 2: 20}  # one context spans two tiles
    prompts = {seq: [int(t) for t in rng.integers(0, 512, size=n)] for seq, n in lengths.items()}
    backend.prepare(4, 512, 512)
    graphs = DecodeGraphs(backend._static_decode, backend.cache.n_slots, backend.cache.scratch_slot, backend.torch_device, False)
    tokens = {}
    for seq, p in prompts.items():
        tokens[seq] = p + [backend.execute(Step(prefills=(PrefillChunk(seq, tuple(p), 0, True),))).next_tokens[seq]]
    for _ in range(3):
        decodes = tuple(DecodeToken(seq, tokens[seq][-1], len(tokens[seq]) - 1) for seq in (2, 0, 1))
        if poison:
            with torch.inference_mode():
                for cache in backend.cache.keys + backend.cache.values:
                    for seq, t in tokens.items():
                        cache[backend.slots.slot(seq), :, len(t) - 1 :] = 1e4
                    cache[3:] = -1e4  # the unused slot and the scratch slot
        with torch.inference_mode():
            logits = graphs.run(Step(decodes=decodes), [backend.slots.slot(d.seq_id) for d in decodes])
        # Each decode's block list names exactly its own context's tiles, whatever the cache's length (one list a
        # row over the whole key width, no full list: the layout test_flex_compiled checks against the kernels).
        mask = backend.route.decode_block_mask
        assert mask.full_kv_indices is None and backend.route.layout_problems() == []
        listed = flex.blocks_to_dense(mask.kv_num_blocks[:, 0], mask.kv_indices[:, 0], backend.route.n_tiles)[:, 0]
        for i, d in enumerate(decodes):
            first = backend.slots.slot(d.seq_id) * backend.route.tiles_per_slot
            expected = torch.zeros(backend.route.n_tiles, dtype=torch.bool)
            expected[first : first + -(-(d.position + 1) // flex.KV_BLOCK)] = True
            assert torch.equal(listed[i].cpu(), expected)
        for i, d in enumerate(decodes):
            want = reference_logits(reference, tokens[d.seq_id])[-1]
            torch.testing.assert_close(logits[i].float().cpu(), want, atol=2e-4, rtol=1e-4)
            tokens[d.seq_id].append(int(logits[i].argmax()))
    for seq in prompts:
        backend.release(seq)


@pytest.mark.parametrize("poison", [False, True])
def test_graph_decodes_attend_only_their_real_contexts(poison):
    """The graphs' forward (static buffers, contexts from positions) matches a plain forward, and gives the same
    logits when every cache position beyond each context holds huge values: nothing past a context is read."""
    backend, reference = flex_backend(max_position_embeddings=1024)
    _static_decode_steps(backend, reference, poison)


def test_cuda_graph_layout_matches_plain_forward_through_the_engine():
    """Graph batch sizes padded up (3 decodes replay size 4), run by the engine; captured on a CUDA machine."""
    backend, reference = flex_backend()
    backend.prepare(4, 64, 64)
    backend.decode_graphs = backend.make_decode_graphs(capture=TEST_DEVICE == "cuda")
    assert backend.decode_graphs is not None, backend.graphs_note
    assert backend.decode_graphs.sizes == [1, 2, 4]
    requests = _requests(4, seed=9)
    record = engine.run(backend, make_strategy("chunked", 5), requests, 3, keep_logits=True)
    backend.decode_graphs = None
    assert any(s.decode_contexts and not s.prefill_chunks for s in record.steps)
    _assert_matches_plain_forward(record, requests, reference)


def test_the_cpu_route_cannot_make_graphs():
    model, _ = tiny_model("llama")
    backend = TorchBackend(model, "tiny-llama", "cpu", tune_linear=False)
    backend.prepare(2, 32, 32)
    with pytest.raises(BackendError, match="flex or flash"):
        backend.make_decode_graphs(capture=False)


class RecordingCapturer:
    """A stand-in for CUDA capture: runs each size as CUDA's would and records the autograd state it saw."""

    def __init__(self) -> None:
        self.modes: list[bool] = []
        self.outputs: list[torch.Tensor] = []
        self.reserved = 1000

    def warm_and_capture(self, sizes, run):
        captured = {}
        for n in sizes:
            for _ in range(3):  # two warm-ups and the capture
                self.modes.append(torch.is_inference_mode_enabled())
                self.outputs.append(run(n))
            self.reserved += 4096
            captured[n] = (lambda n=n: None, self.outputs[-1])
        return captured

    def reserved_bytes(self) -> int:
        return self.reserved


def test_graph_capture_runs_under_inference_mode_and_reports_its_pool():
    backend, _ = flex_backend()
    backend.prepare(4, 64, 64)  # outside inference mode, as the engine calls it
    capturer = RecordingCapturer()
    graphs = DecodeGraphs(backend._static_decode, backend.cache.n_slots, backend.cache.scratch_slot, backend.torch_device,
                          True, capturer)
    assert capturer.modes and all(capturer.modes)
    assert not any(o.requires_grad for o in capturer.outputs)
    assert all(t.grad_fn is None and not t.requires_grad for t in backend.cache.keys + backend.cache.values)
    assert graphs.pool_bytes == 3 * 4096 and sorted(graphs.graphs) == graphs.sizes


def _brute_force_tiles(meta: AttentionMeta, max_len: int, n_tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 128-row query tile and KV tile: does any real row see some of it, does every real row see all of it."""
    n = meta.n_prefill
    kv = torch.arange(n_tiles * flex.KV_BLOCK)
    allowed = (meta.row_slots[:n, None] == kv // max_len) & (kv % max_len <= meta.row_positions[:n, None])
    q_tiles = -(-n // flex.Q_BLOCK)
    seen = torch.zeros(q_tiles, n_tiles, dtype=torch.bool)
    whole = torch.zeros(q_tiles, n_tiles, dtype=torch.bool)
    for i in range(q_tiles):
        rows = allowed[i * flex.Q_BLOCK : (i + 1) * flex.Q_BLOCK].view(-1, n_tiles, flex.KV_BLOCK)
        seen[i] = rows.any(-1).any(0)
        whole[i] = rows.all(-1).all(0)
    return seen, whole


def test_chunk_block_lists_name_every_tile_a_row_sees_and_only_those():
    """Ragged chunks at offsets, one spanning query tiles: the partial and full lists against a brute force."""
    route = flex.FlexRoute(max_len=384, n_rows=4, compiled=False)
    step = Step(prefills=(PrefillChunk(0, (1,) * 150, 200, False), PrefillChunk(1, (1,) * 7, 0, True),
                          PrefillChunk(2, (1,) * 100, 128, True, pad=3)))
    meta = AttentionMeta.for_step(step, pack(step), [0, 1, 2], torch.device("cpu"))
    route.begin_step(meta)
    mask = route.chunk_block_mask
    partial = flex.blocks_to_dense(mask.kv_num_blocks[0, 0], mask.kv_indices[0, 0], route.n_tiles)
    full = flex.blocks_to_dense(mask.full_kv_num_blocks[0, 0], mask.full_kv_indices[0, 0], route.n_tiles)
    seen, whole = _brute_force_tiles(meta, 384, route.n_tiles)
    assert not (partial & full).any()
    assert torch.equal(partial | full, seen)
    assert torch.equal(full, whole)
    assert full.any() and partial.any()


def test_a_step_contract_goes_to_cuda_in_one_pinned_non_blocking_copy(monkeypatch):
    """The contract's arrays and the step's tokens and LM-head rows: one pinned host buffer, one non-blocking copy
    (a CUDA copy is stood in for here: the buffer stays on the CPU), the same tensors as the CPU's contract."""
    copies, pins = [], []
    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        if args and isinstance(args[0], torch.device) and args[0].type == "cuda":
            copies.append(kwargs.get("non_blocking"))
            return self
        return real_to(self, *args, **kwargs)

    step = Step(prefills=(PrefillChunk(0, (1,) * 5, 0, True), PrefillChunk(1, (2,) * 3, 4, False, pad=2)),
                decodes=(DecodeToken(2, 7, 9), DecodeToken(3, 8, 130)))
    packed = pack(step)
    extra = {"tokens": packed.tokens, "logit_rows": packed.logit_rows}
    on_cpu = AttentionMeta.for_step(step, packed, [0, 1, 2, 3], torch.device("cpu"), extra=extra)
    monkeypatch.setattr(torch.Tensor, "to", to)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pins.append(self.numel()) or self)
    meta = AttentionMeta.for_step(step, packed, [0, 1, 2, 3], torch.device("cuda"), extra=extra)
    monkeypatch.undo()
    assert copies == [True] and len(pins) == 1
    for name in ("row_slots", "row_positions", "cu_seqlens_q", "cu_seqlens_k", "chunk_slots", "chunk_contexts",
                 "decode_slots", "decode_contexts"):
        a, b = getattr(meta, name), getattr(on_cpu, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    for name in extra:
        assert torch.equal(meta.extra[name], on_cpu.extra[name]) and meta.extra[name].dtype == torch.long

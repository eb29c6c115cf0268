"""The flex route compiled, on this CPU (inductor lowers FlexAttention to its C++ template here, Triton on a GPU).

- every step kind through the compiled route against a plain float32 softmax, at contexts across tile edges
  and in slots other than the first, with the whole cache filled with noise (a tile read that should not be
  changes the result);
- the block lists laid out as a BlockMask is, and read as the Triton decode kernel addresses them: the
  CPU's only guard for that GPU kernel, whose misreading inductor's C++ template cannot show;
- a run through the backend on the compiled route compiles nothing inside its steps (dynamo's own counter),
  across a second run with a larger cache, a fresh route and larger steps.

Compiles are slow here (tens of seconds each), so the compiled functions are shared: the route's and the
backend's calls have the tiny test models' shapes (4 query heads over 2 KV heads of 16, float32, scale 0.25),
and dynamo's graphs are the process's, so the whole module compiles one chunk graph and one decode graph per
batch size (1, 2 and 4), and the backend's layer ops (fused.CompiledLayerOps) their few small graphs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from prefillbench import engine
from prefillbench.backends.base import BackendError
from prefillbench.backends.torch import flex
from prefillbench.backends.torch.attention_meta import AttentionMeta
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.sequence import Request
from prefillbench.step import DecodeToken, PrefillChunk, Step, pack
from strategies import make_strategy
from tiny_models import TEST_DEVICE, reference_logits, tiny_model

HEADS, KV_HEADS, DIM = 4, 2, 16  # tiny_models' llama
SCALE = DIM**-0.5
MAX_LEN = 384  # three tiles a slot
SLOTS = 3  # and the scratch slot


@pytest.fixture(scope="module")
def compiled_route():
    """A compiled route over a noise-filled cache, warmed (batch sizes 1 and 4) once for the module."""
    torch.manual_seed(0)
    device = torch.device(TEST_DEVICE)
    route = flex.FlexRoute(MAX_LEN, SLOTS + 1, compiled=True, batch_sizes=[1, 4])
    caches = [torch.randn(KV_HEADS, SLOTS + 1, MAX_LEN, DIM, device=device).transpose(0, 1) for _ in range(2)]
    route.warm(*caches, SLOTS, HEADS, 64, SCALE)
    return route, caches


def _run_step(route, caches, step: Step, slots: list[int]) -> tuple[AttentionMeta, torch.Tensor, torch.Tensor]:
    """One layer of `step` through the route with random q/k/v: (contract, queries [H, T, D], out [T, H, D])."""
    device = caches[0].device
    packed = pack(step)
    t = len(packed.tokens)
    q = torch.randn(HEADS, t, DIM, device=device)
    k, v = (torch.randn(KV_HEADS, t, DIM, device=device) for _ in range(2))
    with torch.inference_mode():
        meta = AttentionMeta.for_step(step, packed, slots, device)
        route.begin_step(meta)
        out = route.attend(q, k, v, *caches, meta, SCALE).clone()
    # The step's K/V are in the cache where the contract says.
    torch.testing.assert_close(caches[0][meta.row_slots, :, meta.row_positions], k.transpose(0, 1))
    return meta, q, out


def _reference(caches, meta: AttentionMeta, q: torch.Tensor) -> torch.Tensor:
    """Plain float32 softmax attention of each row over its own slot's positions 0 .. its position: [T, H, D]."""
    k_cache, v_cache = caches
    out = torch.empty(q.shape[1], HEADS, DIM)
    for r, (slot, pos) in enumerate(zip(meta.row_slots.tolist(), meta.row_positions.tolist())):
        keys = k_cache[slot, :, : pos + 1].float().repeat_interleave(HEADS // KV_HEADS, 0)
        values = v_cache[slot, :, : pos + 1].float().repeat_interleave(HEADS // KV_HEADS, 0)
        scores = (q[:, r : r + 1].float() @ keys.transpose(1, 2)) * SCALE
        out[r] = (scores.softmax(-1) @ values)[:, 0]
    return out


def chunk(slot: int, start: int, n: int, pad: int = 0) -> PrefillChunk:
    return PrefillChunk(slot, (1,) * n, start, False, pad=pad)


def decode(slot: int, context: int) -> DecodeToken:
    return DecodeToken(slot, 1, context - 1)


# Each step: (its chunks and decodes, by slot). Contexts cross the tile edges 128 and 256 and end at max_len.
STEPS = {
    "prompt at 0": Step(prefills=(chunk(1, 0, 129),)),
    "chunk at an offset": Step(prefills=(chunk(2, 127, 130),)),
    "ragged chunks": Step(prefills=(chunk(0, 0, 7), chunk(2, 200, 57), chunk(1, 255, 3))),
    "padded chunks": Step(prefills=(chunk(1, 120, 9, pad=4), chunk(2, 0, 3, pad=10))),
    "chunk + decodes": Step(prefills=(chunk(0, 100, 28),), decodes=(decode(1, 128), decode(2, 129))),
    "chunk + one decode": Step(prefills=(chunk(2, 250, 6),), decodes=(decode(0, 257),)),
    "decodes padded 3 -> 4": Step(decodes=(decode(2, 127), decode(0, 255), decode(1, 384))),
    "one decode": Step(decodes=(decode(2, 256),)),
    "decodes at tile edges": Step(decodes=(decode(0, 1), decode(1, 129), decode(2, 383), decode(0, 128))),
}


@pytest.mark.parametrize("kind", list(STEPS))
def test_every_step_kind_through_the_compiled_route_matches_plain_softmax(compiled_route, kind):
    route, caches = compiled_route
    step = STEPS[kind]
    slots = [c.seq_id for c in step.prefills] + [d.seq_id for d in step.decodes]
    meta, q, out = _run_step(route, caches, step, slots)
    assert route.layout_problems() == []
    torch.testing.assert_close(out.float().cpu(), _reference(caches, meta, q).cpu(), atol=1e-3, rtol=1e-3)
    # Warmed for these shapes: nothing compiled inside the steps.
    assert route.timed_graphs == 0


def test_the_route_compiles_once_per_batch_size_and_not_per_cache(compiled_route):
    """A fresh route over a cache of another length and slot count reuses the module's graphs."""
    route, _ = compiled_route
    device = torch.device(TEST_DEVICE)
    other = flex.FlexRoute(256, 6, compiled=True, batch_sizes=[1, 4])
    caches = [torch.randn(KV_HEADS, 6, 256, DIM, device=device).transpose(0, 1) for _ in range(2)]
    before = flex.graphs_compiled()
    other.warm(*caches, 5, HEADS, 600, SCALE)
    assert flex.graphs_compiled() == before and other.warm_graphs == 0
    step = Step(prefills=(chunk(4, 100, 140),), decodes=(decode(0, 256), decode(3, 129), decode(1, 2)))
    meta, q, out = _run_step(other, caches, step, [4, 0, 3, 1])
    torch.testing.assert_close(out.float().cpu(), _reference(caches, meta, q).cpu(), atol=1e-3, rtol=1e-3)
    assert flex.graphs_compiled() == before and other.timed_graphs == 0


# ------------------------------------------------------------------ the lists' layout (no compile)
def _memory(t: torch.Tensor) -> torch.Tensor:
    """The tensor's storage from its first element on, flat: what a kernel given its pointer can read."""
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size() - t.storage_offset(),), (1,))


def decode_kernel_reads(mask, row: int) -> set[int]:
    """The key tiles the Triton flex-decoding kernel (torch/_inductor/kernel/flex/templates/flex_decode.py.jinja)
    visits for query batch row `row`, addressed as it addresses them: partial and full lists both at KV_IDX's
    strides (and the counts at KV_NUM_BLKS's), the list width from KV_IDX's last dimension."""
    num, idx = mask.kv_num_blocks, mask.kv_indices
    z = row % num.shape[0]
    count_at, list_at, width = z * num.stride(0), z * idx.stride(0), idx.shape[-1]
    seen = set()
    lists = [(num, idx)] + ([(mask.full_kv_num_blocks, mask.full_kv_indices)] if mask.full_kv_indices is not None else [])
    for counts, indices in lists:
        counts, indices = _memory(counts), _memory(indices)
        for j in range(int(counts[count_at])):
            at = list_at + j % width
            assert at < indices.numel(), f"row {row} reads past the list's storage"
            seen.add(int(indices[at]))
    return seen


def _eager_route_step(step: Step, slots: list[int], max_len: int = MAX_LEN, rows: int = SLOTS + 1, batch_sizes=None):
    route = flex.FlexRoute(max_len, rows, compiled=False)
    route.batch_sizes = batch_sizes or []  # as a compiled route pads its decodes, without compiling anything
    meta = AttentionMeta.for_step(step, pack(step), slots, torch.device("cpu"))
    route.begin_step(meta)
    return route, meta


def test_decode_lists_are_laid_out_as_the_compiled_kernels_read_them():
    """Three decodes in three slots at contexts 300, 200 and 140 (the review's case), padded to a batch of 4."""
    step = Step(decodes=(decode(0, 300), decode(1, 200), decode(2, 140)))
    route, meta = _eager_route_step(step, [0, 1, 2], max_len=512, rows=4, batch_sizes=[4])
    mask = route.decode_block_mask
    assert route.layout_problems() == []
    assert mask.kv_indices.shape == (4, 1, 1, route.n_tiles) and mask.kv_num_blocks.shape == (4, 1, 1)
    assert mask.seq_lengths == (1, route.n_tiles * flex.KV_BLOCK)
    for row, (slot, context) in enumerate([(0, 300), (1, 200), (2, 140), (3, 1)]):  # the padding row reads the scratch slot
        first = slot * route.tiles_per_slot
        assert decode_kernel_reads(mask, row) == set(range(first, first + -(-context // flex.KV_BLOCK)))


def test_the_layout_check_catches_the_old_decode_lists():
    """The lists as they were ([m, 1, 1, 1] partial, [m, 1, 1, per] full over all slots' keys): row 1 read tiles of
    row 0's slot through the full list; both the layout check and the kernel's addressing say so."""
    per, slots, contexts = 4, torch.tensor([0, 1, 2]), torch.tensor([300, 200, 140])
    full_num = (contexts // 128).to(torch.int32).view(3, 1, 1)
    partial_num = (contexts % 128 != 0).to(torch.int32).view(3, 1, 1)
    full_idx = (slots[:, None] * per + torch.arange(per)).to(torch.int32).view(3, 1, 1, per)
    partial_idx = (slots[:, None] * per + (contexts // 128)[:, None]).to(torch.int32).view(3, 1, 1, 1)
    old = flex.BlockMask.from_kv_blocks(partial_num, partial_idx, full_num, full_idx, BLOCK_SIZE=128,
                                        seq_lengths=(1, 4 * per * 128), **flex._NO_Q_BLOCKS)
    problems = flex.layout_problems(old, 3, 1, 4 * per * 128)
    assert any("tiles wide" in p for p in problems) and any("strides" in p for p in problems), problems
    assert decode_kernel_reads(old, 1) != {4, 5}


def test_chunk_lists_are_laid_out_as_a_block_mask():
    step = Step(prefills=(chunk(0, 200, 150), chunk(1, 0, 7), chunk(2, 128, 100, pad=3)), decodes=(decode(1, 9),))
    route, _ = _eager_route_step(step, [0, 1, 2, 1])
    assert route.layout_problems() == []
    mask = route.chunk_block_mask
    assert mask.kv_indices.shape == (1, 1, 3, route.n_tiles)  # 260 rows: three query tiles
    assert mask.full_kv_indices.shape == mask.kv_indices.shape and mask.full_kv_indices.stride() == mask.kv_indices.stride()
    # A compiled route pads its chunk rows to at least two query tiles.
    compiled_rows = flex.padded_rows(7, flex.MIN_Q_TILES)
    assert compiled_rows == 2 * flex.Q_BLOCK and flex.row_capacity(compiled_rows) == flex.ROW_CAPACITY


# ------------------------------------------------------------------ through the backend, counted
def _requests(lengths, n_gen, seed):
    rng = np.random.default_rng(seed)
    return [Request(tuple(int(t) for t in rng.integers(0, 512, size=n)), n_gen) for n in lengths]


@pytest.fixture(scope="module")
def compiled_backend():
    model, reference = tiny_model("llama", max_position_embeddings=512)
    backend = TorchBackend(model, "tiny-llama", TEST_DEVICE, attention="flex", flex_compiled=True, tune_linear=False,
                           compile_layer_ops=True)
    return backend, reference


def test_timed_steps_on_the_compiled_route_compile_nothing(compiled_backend, monkeypatch):
    """A short warm-up run (small cache, short steps), then runs with a larger cache and a fresh route, larger
    steps and every step kind: compiles happen in prepare() only, never inside a step; logits as a plain forward.
    The layer ops are compiled too (CompiledLayerOps, as on CUDA), and counted with the route's calls."""
    backend, reference = compiled_backend
    in_steps: list[int] = []
    real_execute = TorchBackend.execute

    def counted(self, step, return_logits=False):
        before = flex.graphs_compiled()
        result = real_execute(self, step, return_logits)
        in_steps.append(flex.graphs_compiled() - before)
        return result

    monkeypatch.setattr(TorchBackend, "execute", counted)
    engine.run(backend, make_strategy("sequential"), _requests((20, 9, 14), 2, seed=1), 3)  # the warm-up run
    first_route = backend.route
    runs = [("chunked", 64, (150, 130, 40, 127), 8), ("padded", 256, (129, 100, 255), 4)]
    for strategy, chunk_size, lengths, n_gen in runs:
        requests = _requests(lengths, n_gen, seed=len(lengths))
        record = engine.run(backend, make_strategy(strategy, chunk_size), requests, 3, keep_logits=True)
        for req, rec in zip(requests, record.requests):
            expected = reference_logits(reference, list(req.prompt) + rec.tokens[:-1])[len(req.prompt) - 1 :]
            torch.testing.assert_close(torch.tensor(np.stack(rec.logits)), expected, atol=1e-3, rtol=1e-3)
    assert backend.route is not first_route  # the longer prompts made a larger cache and a fresh route
    assert in_steps and sum(in_steps) == 0, in_steps
    assert backend.late_compiles() == 0
    meta = backend.metadata()
    assert meta["flex_compiles"].endswith("0 inside steps") and meta["layer_ops"].startswith("inductor-compiled")


def test_a_larger_step_rewarms_a_route_whose_cache_fits(compiled_backend, monkeypatch):
    """prepare() with a cache that fits but larger steps warms again, with the model's own scale; the route
    runs only the shape classes it has not (a step past ROW_CAPACITY rows is a class of its own)."""
    backend, _ = compiled_backend
    backend.prepare(2, 100, 50)
    route, calls = backend.route, []
    monkeypatch.setattr(route, "warm", lambda *args: calls.append(args[4:]))
    backend.prepare(2, 100, 20_000)
    assert backend.route is route and calls == [(20_000, 0.25)]  # the tiny models' scale, 16 ** -0.5
    assert ("chunks", 4 * flex.ROW_CAPACITY) in route.shape_classes(20_000)
    assert set(route.shape_classes(50)) <= route.warmed and ("chunks", 4 * flex.ROW_CAPACITY) not in route.warmed


def test_past_the_recompile_limit_the_route_fails_in_one_line():
    """No silent eager fallback: dynamo raises at its recompile limit (configured so), and the route says so in
    one line (eager FlexAttention over the whole cache would materialise every score)."""
    import torch._dynamo

    route = flex.FlexRoute(256, 3, compiled=True, batch_sizes=[1])
    config = torch._dynamo.config
    assert getattr(config, "fail_on_recompile_limit_hit", getattr(config, "fail_on_cache_limit_hit", False))
    limit_hit = getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", None) or torch._dynamo.exc.FailOnCacheLimitHit

    def over_the_limit(*args):
        raise limit_hit("recompile_limit reached with fullgraph=True.\nExcessive recompilations can degrade ...")

    route._decodes = over_the_limit
    caches = [torch.zeros(KV_HEADS, 3, 256, DIM).transpose(0, 1) for _ in range(2)]
    step = Step(decodes=(decode(1, 9),))
    with torch.inference_mode():
        meta = AttentionMeta.for_step(step, pack(step), [1], torch.device("cpu"))
        route.begin_step(meta)
        with pytest.raises(BackendError) as error:
            route.attend(torch.zeros(HEADS, 1, DIM), *(torch.zeros(KV_HEADS, 1, DIM) for _ in range(2)), *caches, meta, SCALE)
    message = str(error.value)
    assert "recompile limit" in message and "\n" not in message

"""The torch-only CUDA attention route: FlexAttention over the KV cache, read where it lies.

Why FlexAttention and not SDPA. A chunk at an offset needs causality aligned
to the lower right, and a step of ragged chunks needs one mask per document;
SDPA takes either as an additive `attn_mask` or a `causal_lower_right` bias,
and with an `attn_mask` and grouped-query heads only SDPA's math kernel is left
on CUDA (flash refuses masks, the memory-efficient kernel refuses Hq != Hkv),
which materialises the score matrix and expands K/V per query head. SDPA also
reads K/V as dense [B, H, L, D] tensors, so ragged rows or a batch of decodes
over their own cache slots would need gathering or padding. FlexAttention,
compiled, generates one fused kernel per step kind that takes the mask as
block lists (`BlockMask`): only the 128 x 128 tiles a row may see are visited,
grouped-query heads read their shared K/V head without copying (`enable_gqa`),
and a short query batch goes to its split-KV decode kernel.

The cache of a layer is stored heads first, [kv_heads, slots + 1, max_len, D]
(packed.KVCache hands out the [slots + 1, kv_heads, max_len, D] view every
other reader indexes), so one view puts every slot's positions end to end:
key index s * max_len + p is slot s, position p. max_len is a multiple of
KV_BLOCK, so no tile straddles two slots. The compiled functions read the cache
as [1, kv_heads, tiles, KV_BLOCK, D] (`tiled_cache`), so the key length is
a whole number of tiles by construction. Per step, two calls per layer:

- the prompt chunks, [1, Hq, rows, D] against the whole flattened cache, rows
  padded to whole query tiles (at least MIN_Q_TILES when compiled); a row of
  slot s at position p sees keys [s * max_len, s * max_len + p] (documents,
  causal with offsets): the mask reads each row's key range from two tables
  of a static length (`row_capacity`), and the block lists name, per query
  tile, the key tiles some row sees (partial) and those every row sees whole
  (full);
- the decodes as a batch of one-row queries, [m, Hq, 1, D] against the same
  cache (key batch 1): each row's list names its own slot's first
  ceil(context / KV_BLOCK) tiles, so a decode reads its context and nothing
  up to max_len. Decode lists have no full part: the split-KV decode kernel
  splits a row's listed tiles among its programs only when there is none (with
  one it splits the whole key length, all slots, and one program does the
  work), and the mask trims the last tile. The lists have fixed shapes, built
  from the positions by tensor ops: a CUDA graph captures them.

Every list is laid out as a `BlockMask` is: kv_num_blocks [B, 1, q_tiles],
kv_indices [B, 1, q_tiles, n_tiles] over the whole key width, full lists (where
there are any) of the same shape and strides, all contiguous int32. The Triton
kernels read FULL_KV_IDX with KV_IDX's strides and take the list width from
KV_IDX's last dimension, and inductor's CPU template asserts that the width
covers the key length; `layout_problems` checks all of it.

Compiled (`compiled=True`: on CUDA, and on a CPU where a test asks, through
inductor's C++ template), the two functions are compiled once per process and
shared by every route: static in the decode batch (the split-KV kernel wants
it), dynamic in the key length (a new cache compiles nothing) and in the chunk
rows; `warm` compiles each before a step is timed, with the model's scale and
the layouts the steps pass. Eagerly (`compiled=False`, the CPU tests of the
route's logic) FlexAttention ignores the block lists and evaluates mask_mod
everywhere, so the eager mask admits only the tiles the lists name (full tiles
whole, partial tiles through the key ranges), as the compiled kernels do.
"""
from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.attention.flex_attention as _flex_module
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from prefillbench.backends.base import BackendError
from prefillbench.backends.torch.attention_meta import AttentionMeta
from prefillbench.backends.torch.block_lists import (KV_BLOCK, Q_BLOCK, blocks_to_dense, dense_to_blocks,
                                                     layout_problems)

#: Query tiles a compiled chunk call takes at least: a dimension of size 1 is specialised by dynamo, so one
#: tile would compile a graph of its own; a padding tile lists no key tile and costs the kernels nothing.
MIN_Q_TILES = 2
#: The static length of the chunk path's per-row key-range tables (rows beyond a step's are unused): a
#: mask_mod indexing a table of a dynamic length by q_idx miscompiles in inductor's CPU template (a size
#: symbol is renamed by a string replace that also hits longer names), so the tables keep a fixed length,
#: this one or the next power of two that holds the step's rows.
ROW_CAPACITY = 8192
#: Recompiles one compiled function may have (one per decode batch size and per row-capacity class): more
#: than dynamo's default 8 for a cache of many slots. Past it dynamo would run the frame eagerly; here it
#: raises instead (fail_on_recompile_limit_hit) and `attend` turns that into one line.
RECOMPILE_LIMIT = 64
#: from_kv_blocks' `compute_q_blocks` (torch 2.6+): the transposed lists serve only the backward pass.
_NO_Q_BLOCKS = {"compute_q_blocks": False} if "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters else {}


def padded_rows(n: int, min_tiles: int = 1) -> int:
    """The query rows a chunk call of n rows attends: whole Q_BLOCK tiles, at least min_tiles."""
    return max(min_tiles, -(-n // Q_BLOCK)) * Q_BLOCK


def row_capacity(rows: int) -> int:
    """The length of the per-row key-range tables for a step of `rows` padded rows (a static shape class)."""
    cap = ROW_CAPACITY
    while cap < rows:
        cap *= 2
    return cap


# ------------------------------------------------------------------ the attention calls
def _chunk_attention(q, keys, values, num, idx, full_num, full_idx, lo, hi, scale):
    """q [1, Hq, rows, D]; keys/values [1, Hkv, tiles, KV_BLOCK, D]; lists [1, 1, q_tiles(, tiles)];
    lo/hi [capacity]: row r sees keys [lo[r], hi[r])."""
    k, v = keys.flatten(2, 3), values.flatten(2, 3)

    def mask(b, h, q_idx, kv_idx):
        return (kv_idx >= lo[q_idx]) & (kv_idx < hi[q_idx])

    block_mask = BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=(Q_BLOCK, KV_BLOCK), mask_mod=mask,
                                          seq_lengths=(q.shape[2], k.shape[2]), **_NO_Q_BLOCKS)
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)


def _decode_attention(q, keys, values, num, idx, lo, hi, scale):
    """q [B, Hq, 1, D]; keys/values as above; num [B, 1, 1], idx [B, 1, 1, tiles]; decode b sees keys [lo[b], hi[b])."""
    k, v = keys.flatten(2, 3), values.flatten(2, 3)

    def mask(b, h, q_idx, kv_idx):
        return (kv_idx >= lo[b]) & (kv_idx < hi[b])

    block_mask = BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=(Q_BLOCK, KV_BLOCK), mask_mod=mask,
                                          seq_lengths=(q.shape[2], k.shape[2]), **_NO_Q_BLOCKS)
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)


def _eager_chunk_attention(q, keys, values, num, idx, full_num, full_idx, lo, hi, scale):
    """_chunk_attention as the compiled kernel computes it, eagerly: only the listed tiles, full ones whole."""
    k, v = keys.flatten(2, 3), values.flatten(2, 3)
    tiles = keys.shape[2]
    listed = blocks_to_dense(num[0, 0], idx[0, 0], tiles)
    whole = blocks_to_dense(full_num[0, 0], full_idx[0, 0], tiles)

    def mask(b, h, q_idx, kv_idx):
        r, t = q_idx // Q_BLOCK, kv_idx // KV_BLOCK
        return whole[r, t] | (listed[r, t] & (kv_idx >= lo[q_idx]) & (kv_idx < hi[q_idx]))

    block_mask = BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=(Q_BLOCK, KV_BLOCK), mask_mod=mask,
                                          seq_lengths=(q.shape[2], k.shape[2]), **_NO_Q_BLOCKS)
    return _eager_flex(q, k, v, block_mask, scale)


def _eager_decode_attention(q, keys, values, num, idx, lo, hi, scale):
    k, v = keys.flatten(2, 3), values.flatten(2, 3)
    listed = blocks_to_dense(num[:, 0], idx[:, 0], keys.shape[2])[:, 0]  # [B, tiles]

    def mask(b, h, q_idx, kv_idx):
        return listed[b, kv_idx // KV_BLOCK] & (kv_idx >= lo[b]) & (kv_idx < hi[b])

    block_mask = BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=(Q_BLOCK, KV_BLOCK), mask_mod=mask,
                                          seq_lengths=(q.shape[2], k.shape[2]), **_NO_Q_BLOCKS)
    return _eager_flex(q, k, v, block_mask, scale)


def _eager_flex(q, k, v, block_mask, scale):
    """Eager FlexAttention traces its mask through dynamo (eager backend) and traces again for every new step
    shape, seconds a step on a CPU; its debug switch runs the mask as plain Python over vmap instead. Only for the
    CPU runs of this route (its tests): the GPU runs compiled."""
    previous = _flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    _flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    try:
        return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)
    finally:
        _flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = previous


#: The compiled functions, one each per process: every route shares their graphs.
_COMPILED: dict[str, Callable] = {}
#: Each argument's dimensions that are dynamic (marked while a route warms): rows, query tiles, key tiles.
_DYNAMIC_DIMS = {"chunks": ((2,), (2,), (2,), (2,), (2, 3), (2,), (2, 3), (), ()), "decodes": ((), (2,), (2,), (), (3,), (), ())}


def _configure_dynamo() -> None:
    """Room for one graph per decode batch size and row class, and a loud failure past it, never a silent eager frame."""
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # 2.6+ and older spellings
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
            break
    for name in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(config, name):
            setattr(config, name, True)
            break


def compiled_function(kind: str) -> Callable:
    """The process's compiled `kind` ("chunks" or "decodes"): static in everything it is not marked dynamic in."""
    if kind not in _COMPILED:
        _configure_dynamo()
        fn = {"chunks": _chunk_attention, "decodes": _decode_attention}[kind]
        _COMPILED[kind] = torch.compile(fn, dynamic=False, fullgraph=True)
    return _COMPILED[kind]


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process (its own counter; tests/test_torch_compiled.py reads it too)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _no_duck_shapes():
    """A context without duck sizing: two dynamic sizes that happen to be equal at a compile (query tiles and
    key tiles, say) would otherwise share a symbol, and the next step where they differ would recompile."""
    import contextlib

    try:
        import torch.fx.experimental._config as fx_config
    except ImportError:  # pragma: no cover: torch 2.11 has it
        return contextlib.nullcontext()
    return fx_config.patch(use_duck_shape=False) if hasattr(fx_config, "use_duck_shape") else contextlib.nullcontext()


def tiled_cache(cache: torch.Tensor) -> torch.Tensor:
    """[1, kv_heads, tiles, KV_BLOCK, D]: a heads-first cache with every slot end to end, in key tiles."""
    flat = flat_cache(cache)
    return flat.view(1, flat.shape[1], flat.shape[2] // KV_BLOCK, KV_BLOCK, flat.shape[3])


def flat_cache(cache: torch.Tensor) -> torch.Tensor:
    """[1, kv_heads, slots * max_len, D]: a heads-first cache's [slots, kv_heads, max_len, D] view, slots end to end."""
    heads_first = cache.transpose(0, 1)
    if not heads_first.is_contiguous():
        raise RuntimeError("the flex route needs the KV cache stored heads first (KVCache(heads_first=True))")
    s, h, length, d = cache.shape
    return heads_first.view(1, h, s * length, d)


# ------------------------------------------------------------------ the route
@dataclass
class ChunkLists:
    """A step's prompt rows as the chunk call reads them."""

    n: int  # real rows
    rows: int  # padded rows (whole query tiles)
    num: torch.Tensor  # [1, 1, q_tiles] int32
    idx: torch.Tensor  # [1, 1, q_tiles, tiles] int32
    full_num: torch.Tensor
    full_idx: torch.Tensor
    lo: torch.Tensor  # [row_capacity] long: row r sees keys [lo[r], hi[r]); empty past the real rows
    hi: torch.Tensor

    def args(self) -> tuple[torch.Tensor, ...]:
        return self.num, self.idx, self.full_num, self.full_idx, self.lo, self.hi


@dataclass
class DecodeLists:
    """A step's decodes as the decode call reads them (padded to the call's batch)."""

    m: int  # real decodes
    num: torch.Tensor  # [B, 1, 1] int32
    idx: torch.Tensor  # [B, 1, 1, tiles] int32
    lo: torch.Tensor  # [B] long
    hi: torch.Tensor

    @property
    def batch(self) -> int:
        return self.num.shape[0]

    def args(self) -> tuple[torch.Tensor, ...]:
        return self.num, self.idx, self.lo, self.hi


class FlexRoute:
    """FlexAttention over a heads-first KV cache; `begin_step` once a step, `attend` once a layer."""

    name = "flex"
    masked_sdpa = False

    def __init__(self, max_len: int, n_rows: int, compiled: bool, batch_sizes: list[int] | None = None,
                 strict: bool | None = None) -> None:
        """`max_len`: the cache's positions per slot (a multiple of KV_BLOCK); `n_rows`: its slots, scratch
        included (the last). Compiled, a decode batch is padded to the next of `batch_sizes` (the CUDA graphs'
        sizes), so that each size compiles once, in `warm`, ahead of the run. `strict` (default: on CUDA, decided
        at the first call): a compile after `warm` is reported on stderr, once."""
        if max_len % KV_BLOCK:
            raise ValueError(f"the flex route's cache length must be a multiple of {KV_BLOCK}, got {max_len}")
        self.max_len, self.n_rows = max_len, n_rows
        self.tiles_per_slot = max_len // KV_BLOCK
        self.n_tiles = n_rows * self.tiles_per_slot
        self.compiled = compiled
        self.batch_sizes = sorted(batch_sizes or [1]) if compiled else []
        self.min_q_tiles = MIN_Q_TILES if compiled else 1
        self.strict = strict
        if compiled:
            self._chunks, self._decodes = compiled_function("chunks"), compiled_function("decodes")
        else:
            self._chunks, self._decodes = _eager_chunk_attention, _eager_decode_attention
        self.chunk: ChunkLists | None = None
        self.decode: DecodeLists | None = None
        #: While True (until `warm` ends), compiled calls mark their dynamic dimensions and compile without duck sizing.
        self.marking = True
        self.warmed: set[tuple] = set()  # the shape classes `warm` has run: ("chunks", capacity), ("decodes", batch)
        self.warm_graphs = 0  # graphs compiled inside this route's warm-ups (0 where other routes compiled them)
        self.warm_seconds = 0.0
        self.timed_graphs = 0  # graphs compiled by this route's calls after its warm-up: 0 is the target
        self._reported = False

    # ----------------------------------------------------------------- per step
    def begin_step(self, meta: AttentionMeta) -> None:
        """Build the step's block lists from its contract (tensor ops only: no host sync, capturable)."""
        self.chunk = self._chunk_lists(meta) if meta.n_prefill else None
        self.decode = self._decode_lists(meta) if meta.n_decodes else None

    def _chunk_lists(self, meta: AttentionMeta) -> ChunkLists:
        n = meta.n_prefill
        rows = padded_rows(n, self.min_q_tiles)
        q_tiles = rows // Q_BLOCK
        capacity = row_capacity(rows) if self.compiled else rows
        slots, positions = meta.row_slots[:n], meta.row_positions[:n]
        lo = slots.new_zeros(capacity)
        hi = slots.new_zeros(capacity)
        lo[:n] = slots * self.max_len
        hi[:n] = lo[:n] + positions + 1
        # Key tile j holds keys [j * KV_BLOCK, (j + 1) * KV_BLOCK); row r sees keys [lo[r], hi[r]).
        first = torch.arange(self.n_tiles, device=slots.device) * KV_BLOCK
        row_lo, row_hi = lo[:rows].view(q_tiles, Q_BLOCK, 1), hi[:rows].view(q_tiles, Q_BLOCK, 1)
        seen = ((first < row_hi) & (first + KV_BLOCK > row_lo)).any(1)  # [q_tiles, tiles]
        real = row_hi > row_lo  # pad rows see nothing and do not count
        # A tile is full when every real row of the q tile sees all of it.
        full = (((first >= row_lo) & (first + KV_BLOCK <= row_hi)) | ~real).all(1) & seen
        num, idx = dense_to_blocks(seen & ~full)
        full_num, full_idx = dense_to_blocks(full)
        return ChunkLists(n, rows, num[None, None], idx[None, None], full_num[None, None], full_idx[None, None], lo, hi)

    def decode_batch(self, m: int) -> int:
        """The batch a step of m decodes attends as: m eagerly, the next compiled size otherwise."""
        return next((s for s in self.batch_sizes if s >= m), m)

    def _decode_lists(self, meta: AttentionMeta) -> DecodeLists:
        slots, contexts = meta.decode_slots, meta.decode_contexts
        m = slots.shape[0]
        pad = self.decode_batch(m) - m
        if pad:  # padding rows read the scratch slot's first position
            slots = torch.cat([slots, slots.new_full((pad,), self.n_rows - 1)])
            contexts = torch.cat([contexts, contexts.new_ones(pad)])
        batch, per = slots.shape[0], self.tiles_per_slot
        lo = slots * self.max_len
        hi = lo + contexts
        num = ((contexts + (KV_BLOCK - 1)) // KV_BLOCK).to(torch.int32).view(batch, 1, 1)
        # Each row over the whole key width: its own slot's tiles first (the first `num` are read), then the
        # others in turn, so every index names a real tile.
        tiles = torch.arange(self.n_tiles, device=slots.device)
        idx = ((slots * per).unsqueeze(-1) + tiles).remainder(self.n_tiles).to(torch.int32).view(batch, 1, 1, self.n_tiles)
        return DecodeLists(m, num, idx, lo, hi)

    # ------------------------------------------------------- the lists as BlockMasks
    @property
    def chunk_block_mask(self) -> BlockMask | None:
        """The step's chunk lists as the BlockMask the chunk call builds (its mask_mod a plain function)."""
        c = self.chunk
        if c is None:
            return None
        lo, hi = c.lo, c.hi
        return BlockMask.from_kv_blocks(c.num, c.idx, c.full_num, c.full_idx, BLOCK_SIZE=(Q_BLOCK, KV_BLOCK),
                                        mask_mod=lambda b, h, q, kv: (kv >= lo[q]) & (kv < hi[q]),
                                        seq_lengths=(c.rows, self.n_tiles * KV_BLOCK), **_NO_Q_BLOCKS)

    @property
    def decode_block_mask(self) -> BlockMask | None:
        d = self.decode
        if d is None:
            return None
        lo, hi = d.lo, d.hi
        return BlockMask.from_kv_blocks(d.num, d.idx, BLOCK_SIZE=(Q_BLOCK, KV_BLOCK),
                                        mask_mod=lambda b, h, q, kv: (kv >= lo[b]) & (kv < hi[b]),
                                        seq_lengths=(1, self.n_tiles * KV_BLOCK), **_NO_Q_BLOCKS)

    def layout_problems(self) -> list[str]:
        """layout_problems of the step's masks, each named."""
        out = []
        if self.chunk is not None:
            out += [f"chunk lists: {p}" for p in layout_problems(self.chunk_block_mask, 1, self.chunk.rows, self.n_tiles * KV_BLOCK)]
        if self.decode is not None:
            out += [f"decode lists: {p}" for p in layout_problems(self.decode_block_mask, self.decode.batch, 1, self.n_tiles * KV_BLOCK)]
        return out

    # ---------------------------------------------------------------- per layer
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMeta, scaling: float) -> torch.Tensor:
        """One layer: write the step's K/V [kv_heads, T, D] at their slots and positions, then attend the
        queries [heads, T, D]; returns [T, heads, D]. The queries are copied into fresh contiguous tensors of
        the call's padded shape, whatever layout the caller's views have: the compiled graphs see one layout."""
        k_cache[meta.row_slots, :, meta.row_positions] = k.transpose(0, 1)
        v_cache[meta.row_slots, :, meta.row_positions] = v.transpose(0, 1)
        keys, values = tiled_cache(k_cache), tiled_cache(v_cache)
        n, (heads, t, dim) = meta.n_prefill, q.shape
        chunks = None
        if n:
            c = self.chunk
            queries = q.new_zeros((1, heads, c.rows, dim))
            queries[0, :, :n] = q[:, :n]
            chunks = self._call("chunks", self._chunks, queries, keys, values, *c.args(), scaling)[0, :, :n].transpose(0, 1)
            if n == t:
                return chunks
        d = self.decode
        queries = q.new_zeros((d.batch, heads, 1, dim))
        queries[: d.m, :, 0] = q[:, n:].transpose(0, 1)
        decodes = self._call("decodes", self._decodes, queries, keys, values, *d.args(), scaling)[: d.m, :, 0]
        if chunks is None:
            return decodes
        out = q.new_empty((t, heads, dim))
        out[:n], out[n:] = chunks, decodes
        return out

    def _call(self, kind: str, fn: Callable, *args):
        if not self.compiled:
            return fn(*args)
        if self.marking:
            import torch._dynamo

            for t, dims in zip(args, _DYNAMIC_DIMS[kind]):
                for dim in dims:
                    if t.shape[dim] > 1:  # a size-1 dimension is specialised whatever is marked
                        torch._dynamo.mark_dynamic(t, dim)
            with _no_duck_shapes():
                return self._checked(kind, fn, args)
        before = graphs_compiled()
        out = self._checked(kind, fn, args)
        if graphs_compiled() != before:
            self._compiled_late(kind, args[0])
        return out

    def _checked(self, kind: str, fn: Callable, args):
        try:
            return fn(*args)
        except Exception as e:  # dynamo's FailOnRecompileLimitHit (FailOnCacheLimitHit before 2.6): one line
            if "LimitHit" not in type(e).__name__:
                raise
            raise BackendError(f"the compiled flex route's {kind} call hit dynamo's recompile limit ({RECOMPILE_LIMIT}) "
                               f"at queries {tuple(args[0].shape)}, keys {tuple(args[1].shape)}: a shape class was not "
                               "warmed, and running it eagerly would materialise every score") from None

    def _compiled_late(self, kind: str, query: torch.Tensor) -> None:
        self.timed_graphs += 1
        strict = self.strict if self.strict is not None else query.device.type == "cuda"
        if strict and not self._reported:
            self._reported = True
            print(f"prefillbench: the flex route compiled a {kind} graph after its warm-up (queries {tuple(query.shape)}): "
                  "that step's time includes the compile", file=sys.stderr)

    # ----------------------------------------------------------------- warm-up
    def shape_classes(self, max_step_tokens: int) -> list[tuple[str, int]]:
        """What a compiled call's graphs are static in, for steps of up to `max_step_tokens`: the chunk call's row
        capacity (one class up to ROW_CAPACITY rows, one more for a larger step) and each decode batch size."""
        capacities = sorted({row_capacity(padded_rows(1, self.min_q_tiles)),
                             row_capacity(padded_rows(max(1, max_step_tokens), self.min_q_tiles))})
        return [("chunks", c) for c in capacities] + [("decodes", m) for m in self.batch_sizes]

    def warm(self, k_cache: torch.Tensor, v_cache: torch.Tensor, scratch_slot: int, heads: int, max_step_tokens: int,
             scaling: float) -> None:
        """Compile (or, where another route did, look up) every shape class a step can bring: the chunk call at the
        row capacity of one row and of `max_step_tokens`, the decode call at each batch size; on the scratch
        slot, with the model's scale, under inference mode as the steps run. Classes this route has run are
        skipped, so a prepare() that keeps the cache only warms what a larger step adds."""
        if not self.compiled:
            return
        device = k_cache.device
        metas = []
        for kind, size in self.shape_classes(max_step_tokens):
            if (kind, size) in self.warmed:
                continue
            if kind == "chunks":
                # Enough rows to land in this capacity class (the first one needs a single row), in chunks of at
                # most max_len on the scratch slot.
                rows = 1 if size == ROW_CAPACITY else size // 2 + 1
                lengths = [min(self.max_len, rows - i) for i in range(0, rows, self.max_len)]
                metas.append(((kind, size), _scratch_chunks(lengths, scratch_slot, device)))
            else:
                slots = torch.full((size,), scratch_slot, dtype=torch.long, device=device)
                metas.append(((kind, size), AttentionMeta.for_decodes(torch.zeros_like(slots), slots)))
        if not metas:
            return
        t0, before = time.perf_counter(), graphs_compiled()
        self.marking = True
        try:
            with torch.inference_mode():
                for key, meta in metas:
                    t = meta.row_slots.shape[0]
                    q = k_cache.new_zeros((heads, t, k_cache.shape[3]))
                    kv = k_cache.new_zeros((k_cache.shape[1], t, k_cache.shape[3]))
                    self.begin_step(meta)
                    problems = self.layout_problems()
                    if problems:
                        raise BackendError(f"the flex route's block lists are laid out wrong: {problems[0]}")
                    self.attend(q, kv, kv, k_cache, v_cache, meta, scaling)
                    self.warmed.add(key)
        finally:
            self.marking = False
            self.chunk = self.decode = None
        self.warm_graphs += graphs_compiled() - before
        self.warm_seconds += time.perf_counter() - t0


def _scratch_chunks(lengths: list[int], scratch_slot: int, device: torch.device) -> AttentionMeta:
    """A prompt step of chunks of these lengths, all at position 0 of the scratch slot."""
    from prefillbench.step import PrefillChunk, Step, pack

    step = Step(prefills=tuple(PrefillChunk(-1 - i, (0,) * n, 0, False) for i, n in enumerate(lengths)))
    return AttentionMeta.for_step(step, pack(step), [scratch_slot] * len(lengths), device)

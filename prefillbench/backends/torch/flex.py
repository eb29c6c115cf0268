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
and a short query batch goes to its split-KV decode kernel. It runs on a
CPU too (eagerly), which is how this route is tested here.

The cache of a layer is stored heads first, [kv_heads, slots + 1, max_len, D]
(packed.KVCache hands out the [slots + 1, kv_heads, max_len, D] view every
other reader indexes), so one view puts every slot's positions end to end:
key index s * max_len + p is slot s, position p. max_len is a multiple of
KV_BLOCK, so no tile straddles two slots. Per step, two calls per layer:

- the prompt chunks, [1, Hq, n_prefill, D] against the whole flattened cache,
  with a block mask whose rows are the packed rows: a row of slot s at
  position p sees slot s's positions 0 .. p (documents, causal with offsets);
- the decodes as a batch of one-row queries, [m, Hq, 1, D] against the same
  cache (key batch 1), each row's block list its own slot's first
  ceil(context / KV_BLOCK) tiles, so a decode reads its context and nothing
  up to max_len. The lists have fixed shapes, built from the positions by
  tensor ops: a CUDA graph captures them.

Compiled on CUDA (`torch.compile(flex_attention)`); on the CPU it runs eagerly,
and eager FlexAttention ignores the block lists (it evaluates `mask_mod`
everywhere). So that a CPU test checks what the GPU kernel will read, the
eager run's mask_mod admits only the tiles the lists name (full tiles whole,
partial tiles through mask_mod), as the compiled kernel does.
"""
from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass

import torch
import torch.nn.attention.flex_attention as _flex_module
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from prefillbench.backends.torch.attention_meta import AttentionMeta

#: Tile edge of the block masks (FlexAttention's default sparse block size).
KV_BLOCK = 128
Q_BLOCK = 128
#: from_kv_blocks' `compute_q_blocks` (torch 2.6+): the transposed lists serve only the backward pass.
_NO_Q_BLOCKS = {"compute_q_blocks": False} if "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters else {}


def _flex_chunks(q, k, v, block_mask, scale):
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)


def _flex_decodes(q, k, v, block_mask, scale):
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)


def _eager(call):
    """`call` run without dynamo. Eager FlexAttention traces its mask through dynamo (eager backend) and
    traces again for every new step shape, seconds a step on a CPU; its debug switch runs the mask as plain
    Python over vmap instead. Only for the CPU runs of this route (its tests): the GPU runs compiled."""
    def run(*args):
        previous = _flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
        _flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
        try:
            return call(*args)
        finally:
            _flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = previous
    return run


def blocks_to_dense(num: torch.Tensor, indices: torch.Tensor, n_cols: int) -> torch.Tensor:
    """[..., rows, n_cols] bool: the tiles a (num [..., rows], indices [..., rows, k]) block list names."""
    listed = torch.arange(indices.shape[-1], device=indices.device) < num.unsqueeze(-1)
    dense = torch.zeros((*indices.shape[:-1], n_cols), dtype=torch.bool, device=indices.device)
    return dense.scatter_(-1, indices.long(), listed)


def dense_to_blocks(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(num, indices) int32 of a [..., rows, cols] bool tile mask: each row's named tiles first, in order."""
    order = torch.argsort(dense.to(torch.int8), dim=-1, descending=True, stable=True)
    return dense.sum(-1, dtype=torch.int32), order.to(torch.int32)


@dataclass
class _Step:
    """The per-step tensors the mask_mods read (one holder per route: compiled code guards on its identity)."""

    row_slots: torch.Tensor | None = None  # [rows padded to Q_BLOCK] long, -1 past the last real row
    row_positions: torch.Tensor | None = None
    decode_slots: torch.Tensor | None = None  # [m] long
    decode_contexts: torch.Tensor | None = None  # [m] int32
    chunk_tiles: torch.Tensor | None = None  # eager only: [Qb, KVb] bool, tiles listed (partial or full)
    chunk_full: torch.Tensor | None = None
    decode_tiles: torch.Tensor | None = None  # eager only: [m, KVb]
    decode_full: torch.Tensor | None = None


class FlexRoute:
    """FlexAttention over a heads-first KV cache; `begin_step` once a step, `attend` once a layer."""

    name = "flex"
    masked_sdpa = False

    def __init__(self, max_len: int, n_rows: int, compiled: bool, batch_sizes: list[int] | None = None) -> None:
        """`max_len`: the cache's positions per slot (a multiple of KV_BLOCK); `n_rows`: its slots, scratch
        included (the last). Compiled, a decode batch is padded to the next of `batch_sizes` (the CUDA
        graphs' sizes), so that each size compiles once, ahead of the run (TorchBackend.route_warm)."""
        if max_len % KV_BLOCK:
            raise ValueError(f"the flex route's cache length must be a multiple of {KV_BLOCK}, got {max_len}")
        self.max_len, self.n_rows = max_len, n_rows
        self.tiles_per_slot = max_len // KV_BLOCK
        self.n_tiles = n_rows * self.tiles_per_slot
        self.compiled = compiled
        self.batch_sizes = sorted(batch_sizes or [1]) if compiled else []
        self.state = _Step()
        if compiled:
            import torch._dynamo

            # One compiled variant per decode batch size and per chunk-length class: more than the default 8.
            for name in ("recompile_limit", "cache_size_limit"):
                if hasattr(torch._dynamo.config, name):
                    setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 64))
            # Decodes static per batch size (flex's split-KV decode kernel wants a static batch);
            # chunks dynamic in their length, which changes every step.
            self._chunks = torch.compile(_flex_chunks, dynamic=True, fullgraph=True)
            self._decodes = torch.compile(_flex_decodes, dynamic=False, fullgraph=True)
        else:
            self._chunks, self._decodes = _eager(_flex_chunks), _eager(_flex_decodes)
        st, length = self.state, max_len

        def chunk_mask(b, h, q, kv):
            return (st.row_slots[q] == kv // length) & (kv % length <= st.row_positions[q])

        def decode_mask(b, h, q, kv):
            return (st.decode_slots[b] == kv // length) & (kv % length < st.decode_contexts[b])

        self.chunk_mask_mod = chunk_mask if compiled else _chunk_listed(st, chunk_mask)
        self.decode_mask_mod = decode_mask if compiled else _decode_listed(st, decode_mask)
        self.chunk_block_mask: BlockMask | None = None
        self.decode_block_mask: BlockMask | None = None

    # ----------------------------------------------------------------- per step
    def begin_step(self, meta: AttentionMeta) -> None:
        """Build the step's block masks from its contract (tensor ops only)."""
        self.chunk_block_mask = self._chunk_blocks(meta) if meta.n_prefill else None
        self.decode_block_mask = self._decode_blocks(meta) if meta.n_decodes else None

    def _chunk_blocks(self, meta: AttentionMeta) -> BlockMask:
        n = meta.n_prefill
        q_tiles = -(-n // Q_BLOCK)
        pad = q_tiles * Q_BLOCK - n
        slots = meta.row_slots[:n]
        positions = meta.row_positions[:n]
        if pad:
            slots = torch.cat([slots, slots.new_full((pad,), -1)])
            positions = torch.cat([positions, positions.new_zeros(pad)])
        self.state.row_slots, self.state.row_positions = slots, positions
        # Tile j is slot j // tiles_per_slot, positions first_j .. first_j + KV_BLOCK - 1.
        tile = torch.arange(self.n_tiles, device=slots.device)
        tile_slot = tile // self.tiles_per_slot
        first = (tile % self.tiles_per_slot) * KV_BLOCK
        rows_slot = slots.view(q_tiles, Q_BLOCK, 1)
        rows_pos = positions.view(q_tiles, Q_BLOCK, 1)
        same = rows_slot == tile_slot
        real = (rows_slot >= 0)
        any_seen = (same & (first <= rows_pos)).any(1)  # [q_tiles, n_tiles]
        # A tile is full when every real row of the q tile sees all of it; pad rows do not count.
        full = ((same & (first + KV_BLOCK - 1 <= rows_pos)) | ~real).all(1) & any_seen
        partial = any_seen & ~full
        num, idx = dense_to_blocks(partial)
        full_num, full_idx = dense_to_blocks(full)
        if not self.compiled:
            self.state.chunk_tiles = blocks_to_dense(num, idx, self.n_tiles)
            self.state.chunk_full = blocks_to_dense(full_num, full_idx, self.n_tiles)
        return BlockMask.from_kv_blocks(num[None, None], idx[None, None], full_num[None, None], full_idx[None, None],
                                        BLOCK_SIZE=(Q_BLOCK, KV_BLOCK), mask_mod=self.chunk_mask_mod,
                                        seq_lengths=(n, self.n_tiles * KV_BLOCK), **_NO_Q_BLOCKS)

    def decode_batch(self, m: int) -> int:
        """The batch a step of m decodes attends as: m eagerly, the next compiled size otherwise."""
        return next((s for s in self.batch_sizes if s >= m), m)

    def _decode_blocks(self, meta: AttentionMeta) -> BlockMask:
        slots, contexts = meta.decode_slots, meta.decode_contexts
        pad = self.decode_batch(slots.shape[0]) - slots.shape[0]
        if pad:  # padding rows read the scratch slot's first position
            slots = torch.cat([slots, slots.new_full((pad,), self.n_rows - 1)])
            contexts = torch.cat([contexts, contexts.new_ones(pad)])
        self.state.decode_slots, self.state.decode_contexts = slots, contexts
        per = self.tiles_per_slot
        base = (slots * per).unsqueeze(-1)  # [m, 1]: the slot's first tile
        full_num = (contexts // KV_BLOCK).to(torch.int32)  # tiles wholly inside the context
        partial_num = (contexts % KV_BLOCK != 0).to(torch.int32)  # the one it ends inside, if any
        full_idx = (base + torch.arange(per, device=slots.device)).to(torch.int32)  # its first full_num are listed
        partial_idx = (base + full_num.unsqueeze(-1).clamp(max=per - 1)).to(torch.int32)  # [m, 1]
        if not self.compiled:
            self.state.decode_tiles = blocks_to_dense(partial_num.view(-1, 1), partial_idx.view(-1, 1, 1), self.n_tiles)[:, 0]
            self.state.decode_full = blocks_to_dense(full_num.view(-1, 1), full_idx.view(-1, 1, per), self.n_tiles)[:, 0]
        shape = (slots.shape[0], 1, 1)
        return BlockMask.from_kv_blocks(partial_num.view(shape), partial_idx.view(*shape, 1), full_num.view(shape),
                                        full_idx.view(*shape, per), BLOCK_SIZE=(Q_BLOCK, KV_BLOCK),
                                        mask_mod=self.decode_mask_mod, seq_lengths=(1, self.n_tiles * KV_BLOCK),
                                        **_NO_Q_BLOCKS)

    # ---------------------------------------------------------------- per layer
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMeta, scaling: float) -> torch.Tensor:
        """One layer: write the step's K/V [kv_heads, T, D] at their slots and positions, then attend the
        queries [heads, T, D]; returns [T, heads, D]."""
        k_cache[meta.row_slots, :, meta.row_positions] = k.transpose(0, 1)
        v_cache[meta.row_slots, :, meta.row_positions] = v.transpose(0, 1)
        keys, values = flat_cache(k_cache), flat_cache(v_cache)
        n, heads = meta.n_prefill, q.shape[0]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            chunks = None
            if n:
                chunks = self._chunks(q[None, :, :n], keys, values, self.chunk_block_mask, scaling)[0].transpose(0, 1)
                if n == q.shape[1]:
                    return chunks
            queries = q[:, n:].transpose(0, 1).unsqueeze(2)  # [m, heads, 1, D]
            m = queries.shape[0]
            batch = self.decode_batch(m)
            if batch > m:
                queries = torch.cat([queries, queries.new_zeros((batch - m, *queries.shape[1:]))])
            decodes = self._decodes(queries, keys, values, self.decode_block_mask, scaling)[:m, :, 0]
        if chunks is None:
            return decodes
        out = q.new_empty((q.shape[1], heads, q.shape[2]))
        out[:n], out[n:] = chunks, decodes
        return out


def _chunk_listed(st: _Step, exact):
    """Eager: the mask the compiled kernel applies, full tiles whole and partial tiles through `exact`."""
    def mask(b, h, q, kv):
        r, t = q // Q_BLOCK, kv // KV_BLOCK
        return st.chunk_full[r, t] | (st.chunk_tiles[r, t] & exact(b, h, q, kv))
    return mask


def _decode_listed(st: _Step, exact):
    def mask(b, h, q, kv):
        t = kv // KV_BLOCK
        return st.decode_full[b, t] | (st.decode_tiles[b, t] & exact(b, h, q, kv))
    return mask


def flat_cache(cache: torch.Tensor) -> torch.Tensor:
    """[1, kv_heads, slots * max_len, D]: a heads-first cache's [slots, kv_heads, max_len, D] view, slots end to end."""
    heads_first = cache.transpose(0, 1)
    if not heads_first.is_contiguous():
        raise RuntimeError("the flex route needs the KV cache stored heads first (KVCache(heads_first=True))")
    s, h, length, d = cache.shape
    return heads_first.view(1, h, s * length, d)

"""One sequence's KV as bytes, out of one llama.cpp context and into another: the handoff of a disaggregated
deployment (deploy/gguf_split.py). llama.cpp's own sequence state copy (llama_state_seq_get_data /
llama_state_seq_set_data): the sequence's cells, positions and K and V in the cache's own type, so the receiving
context continues exactly where the prompt ended (its contexts must share the model, KV type and flash attention)."""
from __future__ import annotations

import ctypes

from prefillbench.errors import BackendError


def export_sequence(llama, ctx, slot: int) -> bytes:
    size = int(llama.llama_state_seq_get_size(ctx, slot))
    buf = (ctypes.c_uint8 * size)()
    got = int(llama.llama_state_seq_get_data(ctx, buf, size, slot))
    if got != size:
        raise BackendError(f"llama.cpp wrote {got} of sequence {slot}'s {size} state bytes")
    return bytes(buf)


def import_sequence(llama, ctx, slot: int, data: bytes) -> None:
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    if int(llama.llama_state_seq_set_data(ctx, buf, len(data), slot)) != len(data):
        raise BackendError(f"llama.cpp could not take a handed-off prompt's {len(data)} state bytes into sequence "
                           f"{slot} (its cache has no room for them)")

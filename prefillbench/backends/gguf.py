"""The GGUF backend: llama.cpp through llama-cpp-python's low-level API.

Each step becomes one `llama_batch` and one `llama_decode`: every token carries
its own sequence id and position, so a prompt chunk at any offset, the pads of
the padded strategy and the decode tokens of other sequences share one pass,
as in llama.cpp's own server. Logits are requested only for the tokens that
emit (the last real token of a prompt's last chunk, every decode token).

Design notes
------------
* Batch memory is ours: the `llama_batch` struct points into numpy arrays
  allocated once per context (`llama_batch_init`/`llama_batch_free` are not
  used), and the per-token `seq_id` pointer table is built once, pointing into
  one int32 array. A step is laid out by `prefillbench.step.pack` (the layout
  the torch backend uses too) and copied in with a few slice assignments; a
  decode-only step (every step of a tg run) is written straight in, in the
  order pack() would give, without building the packed arrays.
* Per decode step the Python side is kept to a few microseconds: no
  allocation of ctypes structures, the logits read through a cached numpy view
  of llama.cpp's output buffer (argmax over it, no copy unless logits are
  asked for), and the clock read without a llama_synchronize (execute
  synchronizes before it returns, so the device is idle whenever the engine
  reads the clock).
* One context per size: `prepare()` creates a context only when a run needs a
  larger one (n_seq_max >= sequences, cells per sequence >= positions,
  n_batch >= the largest step); otherwise it clears the KV cache.
* One KV stream per sequence (`kv_unified = False`, llama.cpp PR #14363) by
  default: every row of a batch attends over its own sequence's cells only.
  With the unified cache (one cell range shared by all sequences) every row is
  masked against the cells of every sequence, and llama.cpp's CPU flash
  attention computes a query tile of 64 rows against every KV tile that any
  row of the tile can see: a decode token inside a prompt chunk's batch then
  costs 64 rows' worth of attention over its whole context (a 64-token chunk
  with 3 decodes at 1,024 positions took 8x a decode-only step more than the
  chunk alone; benchmarks/gguf/llama_mixed_batch.py shows it without prefillbench).
  With streams llama.cpp cuts a step into micro-batches of equally many
  tokens per sequence (a chunk with decodes: one micro-batch of one token per
  sequence, then the rest of the chunk), which costs one more pass over the
  weights but no cross-sequence attention. `kv_unified=True` restores the
  shared cache for comparison.
* Padding (the `padded` strategy): a chunk's pad tokens go into the same
  sequence at the positions right after its real tokens (the last real token
  repeated), with no logits requested. They are computed in full: their
  projections, MLPs and attention over the sequence's own prefix cost what the
  padded rows of a rectangular [B, Lmax] batch cost. Attention is causal by
  position, so no real token sees them, and the step's results are exactly
  those without pads (the tests check this). After the step,
  `llama_memory_seq_rm(seq, real_end, -1)` drops their cache cells, so the
  sequence's next token continues at real_end as llama.cpp requires. A scratch
  sequence was the alternative; it would need an extra sequence slot and give
  the pads a different (shorter) attention span than the rows they stand for.
* llama.cpp splits a `llama_decode` batch larger than n_ubatch into
  micro-batches itself (a chunking of its own); `metadata()` reports n_ubatch
  and how many steps were split.
* Timing: `decode_seconds` accumulates the time spent inside `llama_decode`
  (plus `llama_synchronize`), and `step_decode_seconds` keeps it per step of the
  current run, so the harness overhead of a step can be measured.
"""
from __future__ import annotations

import ctypes
import sys
import os
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from prefillbench.step import Step, StepResult, pack

from prefillbench.backends.base import BackendError, LogitTolerance, SlotTable, StepBackend, check_cache_room
from prefillbench.backends import gguf_lib
from prefillbench.backends.gguf_lib import (FLASH_ATTN_TYPES, KV_TYPES, DEFAULT_FLASH_ATTN, FLASH_ATTN_CHOICES,
                                            check_gguf_file, ggml_version, install_log, last_error, llama,
                                            llama_version, logits_address, weights_label)
from prefillbench.backends.gguf_state import export_sequence, import_sequence
from prefillbench.backends.gguf_prefix import LlamaPrefixes
from prefillbench.backends.prefix import PrefixSettings
from prefillbench.backends.llama_kernels import extra_buffers, say_extra_buffers

# --verify's tolerances (see LogitTolerance). llama.cpp's CPU kernels are not batch-invariant: a token's
# logits move with the other tokens of its ubatch and its row in it. Measured teacher-forced across all
# strategies: SmolLM2-135M Q4_1, pp128+tg16 at c=1 and 4, moves by up to 0.98 (0 at c=1), and top-1 flips
# only where the top-2 margin was below 1.0; a dropped chunk or a token at a wrong position moves it by 7 to 14.
# The tiny float32 Llama with llama.cpp's f16 KV cache moves by up to 0.021, a corruption by 10.
QUANTIZED_TOLERANCE = LogitTolerance(3.0, 2.0, "quantized GGUF: 3x the largest move measured on Q4_1")
FLOAT_TOLERANCE = LogitTolerance(0.1, 0.1, "float GGUF with an f16 KV cache: 5x the largest move measured")

#: llama.cpp sequence ids kept for the prefix cache's entries (each a cached prefix that branches off the others):
#: beside the run's own sequences, within LLAMA_MAX_SEQ.
PREFIX_ENTRY_IDS = 32
#: The least the prefix cache holds, in tokens (KV cells beside the run's own): 8,192 cells of SmolLM2-135M's f16 KV
#: are 180 MiB.
PREFIX_CACHE_CELLS = 8192


class GGUFBackend(StepBackend):
    name = "gguf"
    sequence_limit = 256  # llama.cpp's LLAMA_MAX_SEQ: n_seq_max above it fails at context creation
    spec_methods = ("ngram",)  # drafts verified in the step's one llama_decode, a logit row at each position
    options = frozenset({"device", "threads", "n_gpu_layers", "n_ubatch", "n_ctx", "kv_type", "flash_attn", "kv_unified",
                         "prefix_cache", "prefix_block"})

    @classmethod
    def unusable_options(cls) -> dict[str, str]:
        if llama is not None and not llama.llama_supports_gpu_offload():
            return {"n_gpu_layers": "this llama-cpp-python was built without GPU offload"}
        return {}

    def __init__(self, model_ptr, path: Path, *, threads: int, n_gpu_layers: int, n_ubatch: int | None,
                 n_ctx_limit: int | None, kv_type: str, flash_attn: str, kv_unified: bool, extra_buffers: str,
                 prefix: PrefixSettings = PrefixSettings()) -> None:
        self.model = model_ptr
        self.path = path
        self.model_name = path.name.removesuffix(".gguf")
        self.threads = threads
        self.n_gpu_layers = n_gpu_layers
        self.n_ubatch_request = n_ubatch
        self.n_ctx_limit = n_ctx_limit
        self.kv_type = kv_type
        self.flash_attn = flash_attn
        self.extra_buffers = extra_buffers  # extra_buffers()'s reason, for the metadata
        # A cached prefix's cells are shared by tagging them with another sequence, which only the unified cache can
        # do without copying whole streams (gguf_prefix.py).
        self.kv_unified = kv_unified or prefix.on
        self.prefix = prefix
        self.prefixes: LlamaPrefixes | None = None  # the current run's cache
        self.device = "CUDA" if n_gpu_layers > 0 else "CPU"
        vocab = llama.llama_model_get_vocab(model_ptr)
        self.vocab_size = int(llama.llama_vocab_n_tokens(vocab))
        self.context_length = int(llama.llama_model_n_ctx_train(model_ptr))
        buf = ctypes.create_string_buffer(256)
        llama.llama_model_desc(model_ptr, buf, len(buf))
        self.description = buf.value.decode("utf-8", "replace")
        self.weights = weights_label(self.description)

        self.ctx = None
        self.mem = None
        self._logits_addr, self._logits_views = None, {}  # _logits()'s views of llama.cpp's output buffer
        self.n_ctx = self.n_batch = self.n_ubatch = self.n_seq_max = self.n_ctx_seq = 0
        self.max_seq_len = 0
        self.slots = SlotTable(0)
        self.decode_seconds = 0.0  # inside llama_decode, all runs
        self.step_decode_seconds: list[float] = []  # inside llama_decode, per step of the current run
        self.n_decode_calls = 0
        self.n_split_steps = 0  # steps larger than n_ubatch, which llama.cpp split itself
        self.contexts_created = 0
        #: A disaggregated deployment's prefill instance (deploy/gguf_split.py): told (seq_id, first token, state) as
        #: each prompt's last chunk is computed, its KV exported inside that step, which pays for the copy.
        self.handoff_sink = None
        self.handoff_seconds = 0.0  # exporting (prefill instance) or importing (decode instance) sequence state
        self.handoffs = 0

    # -- loading -----------------------------------------------------------

    @classmethod
    def load(cls, model: str, device: str = "auto", threads: int | None = None, n_gpu_layers: int | None = None,
             n_ubatch: int | None = None, n_ctx: int | None = None, kv_type: str = "f16",
             flash_attn: str | bool | None = DEFAULT_FLASH_ATTN, kv_unified: bool = False,
             prefix_cache: str | None = None, prefix_block: int | None = None) -> "GGUFBackend":
        """Load a .gguf file. `n_ctx` caps the context size (default: as large as a run needs);
        `kv_type` is the KV cache type (f16, llama.cpp's default, f32 or q8_0); `flash_attn`
        is on, off or auto (llama.cpp decides; True/False/None mean the same); `kv_unified`
        shares one KV cell range among all sequences instead of one stream each."""
        if llama is None:
            raise BackendError(
                "--backend gguf needs llama-cpp-python, which is not installed: "
                "pip install llama-cpp-python (it compiles llama.cpp, a few minutes), or use --backend torch"
            )
        if threads is not None and threads < 1:
            raise BackendError(f"threads must be at least 1, got {threads}")
        if n_ubatch is not None and n_ubatch < 1:
            raise BackendError(f"--ubatch must be at least 1, got {n_ubatch}")
        if n_gpu_layers is not None and n_gpu_layers < 0:
            raise BackendError(f"--n-gpu-layers must be 0 or more, got {n_gpu_layers}")
        if n_ctx is not None and n_ctx < 1:
            raise BackendError(f"n_ctx must be at least 1, got {n_ctx}")
        if kv_type not in KV_TYPES:
            raise BackendError(f"unknown KV cache type {kv_type!r}; use {', '.join(KV_TYPES)}")
        flash = {True: "on", False: "off", None: "auto"}.get(flash_attn, flash_attn) if not isinstance(flash_attn, str) else flash_attn
        if flash not in FLASH_ATTN_CHOICES:
            raise BackendError(f"unknown flash attention setting {flash_attn!r}; use {', '.join(FLASH_ATTN_CHOICES)}")
        try:
            prefix = PrefixSettings.from_options(prefix_cache, prefix_block)
        except ValueError as e:
            raise BackendError(str(e)) from None
        if prefix.on and not kv_unified:
            print("prefillbench: gguf: --prefix-cache on runs on llama.cpp's unified KV cache (a cached prefix's cells "
                  "are shared, not copied), where a step mixing sequences attends over all their cells (see kv_unified)",
                  file=sys.stderr)
        path = check_gguf_file(model)
        install_log()
        gpu = bool(llama.llama_supports_gpu_offload())
        if device == "cuda" and not gpu:
            raise BackendError("--device cuda was asked for, but this llama-cpp-python was built without GPU support "
                               "(reinstall it with CMAKE_ARGS=\"-DGGML_CUDA=on\")")
        if device not in ("auto", "cpu", "cuda"):
            raise BackendError(f"unknown device {device!r}; use auto, cuda or cpu")
        if device == "cpu" or not gpu:
            ngl = 0
        else:
            ngl = 999 if n_gpu_layers is None else n_gpu_layers
        params = llama.llama_model_default_params()
        params.n_gpu_layers = ngl
        params.use_extra_bufts, extra_why = extra_buffers()
        say_extra_buffers(params.use_extra_bufts, extra_why)
        gguf_lib.log_lines.clear()
        ptr = llama.llama_model_load_from_file(str(path).encode(), params)
        if not ptr:
            raise BackendError(f"llama.cpp cannot load {model}: {last_error()}")
        if threads is None:
            threads = max(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1), 1)
        backend = cls(ptr, path, threads=threads, n_gpu_layers=ngl, n_ubatch=n_ubatch, n_ctx_limit=n_ctx,
                      kv_type=kv_type, flash_attn=flash, kv_unified=bool(kv_unified), extra_buffers=extra_why,
                      prefix=prefix)
        has_encoder = getattr(llama, "llama_model_has_encoder", None)
        if has_encoder is not None and has_encoder(ptr):
            backend.close()
            raise BackendError(f"{model} is an encoder-decoder model; prefillbench needs a decoder-only LM")
        return backend

    # -- context -----------------------------------------------------------

    def prepare(self, max_sequences: int, max_seq_len: int, max_step_tokens: int) -> None:
        need_ctx = max_sequences * max_seq_len
        if self.n_ctx_limit is not None and need_ctx > self.n_ctx_limit:
            raise BackendError(
                f"context too small: {max_sequences} sequence(s) of up to {max_seq_len} positions need n_ctx >= {need_ctx}, "
                f"but n_ctx is limited to {self.n_ctx_limit}"
            )
        need_batch = max(max_step_tokens, 1)
        if self.prefix.on:
            self._prepare_cached(max_sequences, max_seq_len, need_batch)
        elif (self.ctx is None or max_seq_len > self.n_ctx_seq or max_sequences > self.n_seq_max
                or need_batch > self.n_batch):
            # Grow monotonically, so runs of alternating sizes do not rebuild the context each time.
            n_seq_max = max(max_sequences, self.n_seq_max)
            self._create_context(n_seq_max * max(max_seq_len, self.n_ctx_seq), n_seq_max, max(need_batch, self.n_batch))
        else:
            llama.llama_memory_clear(self.mem, False)
        if not self.prefix.on:
            self.slots = SlotTable(self.n_seq_max)
        self.max_seq_len = max_seq_len
        self.step_decode_seconds = []

    def _prepare_cached(self, max_sequences: int, max_seq_len: int, need_batch: int) -> None:
        """The context of a run with a prefix cache: the run's sequences, plus sequence ids for the cache's entries
        and cells for what it holds (as many as the run's own sequences, at least PREFIX_CACHE_CELLS)."""
        ids = min(self.sequence_limit - max_sequences, PREFIX_ENTRY_IDS)
        if ids < 2:
            raise BackendError(f"-c {max_sequences} leaves no llama.cpp sequence ids for the prefix cache's entries "
                               f"(it has {self.sequence_limit}); lower -c or turn --prefix-cache off")
        room = max_sequences * max_seq_len
        cache_cells = self.prefix.capacity or max(room, PREFIX_CACHE_CELLS)
        seqs = max_sequences + ids
        cells = -(-(room + cache_cells) // seqs) * seqs  # a multiple of the ids: llama.cpp's cells per sequence
        if self.n_ctx_limit is not None and cells > self.n_ctx_limit:
            raise BackendError(f"context too small: {max_sequences} sequence(s) of {max_seq_len} positions and a prefix "
                               f"cache of {cache_cells} tokens need n_ctx >= {cells}, but n_ctx is limited to {self.n_ctx_limit}")
        need_batch = max(need_batch, seqs)  # llama.cpp reserves an output row per sequence id in the batch
        if self.ctx is None or cells > self.n_ctx or seqs > self.n_seq_max or need_batch > self.n_batch:
            self._create_context(max(cells, self.n_ctx), max(seqs, self.n_seq_max), max(need_batch, self.n_batch))
        else:
            llama.llama_memory_clear(self.mem, False)
        self.slots = SlotTable(max_sequences)
        capacity = max(cache_cells // self.prefix.block, 1)
        self.prefixes = LlamaPrefixes(llama, self.mem, self.prefix, range(max_sequences, self.n_seq_max), capacity)
        self.prefix_capacity = capacity

    def reuse_prefix(self, seq_id: int, prompt: tuple[int, ...]) -> int:
        return self.prefixes.reuse(seq_id, prompt) if self.prefixes is not None else 0

    def refreshed_prefixes(self) -> dict[int, int]:
        return self.prefixes.refreshed() if self.prefixes is not None else {}

    def _create_context(self, n_ctx: int, n_seq_max: int, n_batch: int) -> None:
        self._free_context()
        install_log()
        p = llama.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = n_batch
        p.n_ubatch = min(self.n_ubatch_request or p.n_ubatch, n_batch)
        p.n_seq_max = n_seq_max
        p.kv_unified = self.kv_unified
        p.n_threads = p.n_threads_batch = self.threads
        p.type_k = p.type_v = KV_TYPES[self.kv_type]
        p.flash_attn_type = FLASH_ATTN_TYPES[self.flash_attn]
        p.no_perf = True
        gguf_lib.log_lines.clear()
        ctx = llama.llama_init_from_model(self.model, p)
        if not ctx:
            raise BackendError(
                f"llama.cpp could not create a context with n_ctx={n_ctx}, n_seq_max={n_seq_max}, n_batch={n_batch}: {last_error()}"
            )
        self.ctx = ctx
        self.mem = llama.llama_get_memory(ctx)
        self.n_ctx = int(llama.llama_n_ctx(ctx))
        self.n_batch = int(llama.llama_n_batch(ctx))
        self.n_ubatch = int(llama.llama_n_ubatch(ctx))
        self.n_seq_max = int(llama.llama_n_seq_max(ctx))
        # Cells each sequence may hold: its own stream's, or the whole shared cache.
        self.n_ctx_seq = int(llama.llama_n_ctx_seq(ctx)) if not self.kv_unified else self.n_ctx // max(self.n_seq_max, 1)
        self.contexts_created += 1
        if self.n_ctx_seq * n_seq_max < n_ctx or self.n_seq_max < n_seq_max or self.n_batch < n_batch:
            got = (self.n_ctx, self.n_seq_max, self.n_batch)
            self._free_context()
            raise BackendError(
                f"context too small: the run needs n_ctx >= {n_ctx}, n_seq_max >= {n_seq_max} and n_batch >= {n_batch}; "
                f"llama.cpp made n_ctx={got[0]}, n_seq_max={got[1]}, n_batch={got[2]}"
            )
        self._alloc_batch(self.n_batch)

    def _alloc_batch(self, n: int) -> None:
        self._tok = np.zeros(n, dtype=np.int32)
        self._pos = np.zeros(n, dtype=np.int32)
        self._n_seq = np.ones(n, dtype=np.int32)
        self._seq = np.zeros(n, dtype=np.int32)
        self._out = np.zeros(n, dtype=np.int8)
        # seq_id[i] points at self._seq[i]: one sequence per token, set by writing self._seq.
        self._seq_ptrs = (self._seq.ctypes.data + self._seq.itemsize * np.arange(n, dtype=np.uintp)).astype(np.uintp)
        b = llama.llama_batch()
        b.n_tokens = 0
        b.token = self._tok.ctypes.data_as(ctypes.POINTER(llama.llama_token))
        b.embd = ctypes.POINTER(ctypes.c_float)()
        b.pos = self._pos.ctypes.data_as(ctypes.POINTER(llama.llama_pos))
        b.n_seq_id = self._n_seq.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        b.seq_id = self._seq_ptrs.ctypes.data_as(ctypes.POINTER(ctypes.POINTER(llama.llama_seq_id)))
        b.logits = self._out.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self._batch = b

    def _free_context(self) -> None:
        if self.ctx is not None:
            llama.llama_free(self.ctx)
            self.ctx = self.mem = None
            self._logits_addr, self._logits_views = None, {}
            self.n_ctx = self.n_batch = self.n_ubatch = self.n_seq_max = self.n_ctx_seq = 0

    # -- execution ---------------------------------------------------------

    def execute(self, step: Step, return_logits: bool = False) -> StepResult:
        if self.ctx is None:
            raise BackendError("prepare() must be called before execute()")
        padded: list[tuple[int, int]] = []
        out = self._out
        packed = None
        # A decode with drafts (speculative decoding) feeds K+1 positions, a logit row at each: pack()'s layout.
        if step.prefills or any(d[3] for d in step.decodes):
            check_cache_room(step, self.max_seq_len)
            packed = pack(step)
            n = len(packed.tokens)
            if n > self.n_batch:
                raise BackendError(f"a step of {n} tokens exceeds the prepared n_batch={self.n_batch}")
            # Bulk copies into the arrays the llama_batch points at; only the sequence ids need mapping to slots.
            self._tok[:n] = packed.tokens
            self._pos[:n] = packed.positions
            seq, slot_of = self._seq, self.slots.slot
            bounds = packed.chunk_offsets + (packed.decode_from,)
            for c, a, b in zip(step.prefills, bounds, bounds[1:]):
                seq[a:b] = slot = slot_of(c.seq_id)
                if c.pad:
                    padded.append((slot, c.end))
            if step.decodes:
                seq[packed.decode_from : n] = [slot_of(s) for s in packed.seq_ids[packed.decode_from : n].tolist()]
            out[:n] = 0
            out[packed.logit_rows] = 1
            seq_ids = packed.emitting
        else:
            # Decode-only (every step of a tg run): one token per sequence, each emitting, in step order, which is
            # what pack() would give; written straight into the batch arrays.
            decodes = step.decodes
            n = len(decodes)
            if n > self.n_batch:
                raise BackendError(f"a step of {n} tokens exceeds the prepared n_batch={self.n_batch}")
            if n == 1:
                seq_id, self._tok[0], self._pos[0], _ = decodes[0]
                self._seq[0] = self.slots.slot(seq_id)
                seq_ids = (seq_id,)
            elif n:
                seq_ids, self._tok[:n], self._pos[:n], _ = zip(*decodes)
                slot_of = self.slots.slot
                self._seq[:n] = [slot_of(s) for s in seq_ids]
            else:
                seq_ids = ()
            out[:n] = 1
        self._batch.n_tokens = n
        if self.prefixes is not None and step.prefills:
            self.prefixes.before(step, self.slots.slot)

        t0 = perf_counter()
        rc = llama.llama_decode(self.ctx, self._batch)
        llama.llama_synchronize(self.ctx)
        dt = perf_counter() - t0
        self.decode_seconds += dt
        self.step_decode_seconds.append(dt)
        self.n_decode_calls += 1
        if n > self.n_ubatch:
            self.n_split_steps += 1
        if rc != 0:
            raise BackendError(self._decode_error(rc, n))

        # Pads leave the cache: the sequence continues right after its real tokens.
        for slot, real_end in padded:
            llama.llama_memory_seq_rm(self.mem, slot, real_end, -1)
        if self.prefixes is not None and step.prefills:
            self.prefixes.after(step, self.slots.slot)

        n_out = len(seq_ids) if packed is None or not packed.row_counts else len(packed.logit_rows)
        if not n_out:
            return StepResult({})
        # llama.cpp stores output rows in batch order, which is pack()'s `emitting` order.
        logits = self._logits(n_out)
        if packed is not None and packed.row_counts:  # drafts: the target's token after every fed one
            result = packed.greedy_result(logits.argmax(axis=1).tolist())
        elif n_out == 1:
            result = StepResult({seq_ids[0]: int(logits.argmax())})
        else:
            result = StepResult(dict(zip(seq_ids, logits.argmax(axis=1).tolist())))
        if return_logits:
            result.logits = dict(zip(seq_ids, logits.copy()))
        if self.handoff_sink is not None:
            for c in step.prefills:
                if c.is_last:
                    t0 = perf_counter()
                    state = export_sequence(llama, self.ctx, self.slots.slot(c.seq_id))
                    self._count_handoff(perf_counter() - t0)
                    self.handoff_sink(c.seq_id, result.next_tokens[c.seq_id], state)
        return result

    def accept_handoff(self, seq_id: int, request) -> None:
        """A prompt prefilled in another context: its state into this sequence's slot (the time is the decode
        instance's, between its steps)."""
        if request.handoff.state is None:
            raise BackendError("a handed-off prompt without its KV state reached the gguf backend")
        t0 = perf_counter()
        import_sequence(llama, self.ctx, self.slots.slot(seq_id), request.handoff.state)
        self._count_handoff(perf_counter() - t0)

    def _count_handoff(self, seconds: float) -> None:
        self.handoff_seconds += seconds
        self.handoffs += 1

    def _logits(self, n_out: int) -> np.ndarray:
        """The step's logits, [n_out, vocab], as a view of llama.cpp's output buffer (valid until the next decode).

        The views are cached per buffer address and row count: the buffer moves only when llama.cpp grows it, and
        building a view through np.ctypeslib.as_array each step cost more than the argmax over it."""
        addr = logits_address(self.ctx)
        if not addr:
            raise BackendError("llama.cpp returned no logits")
        if addr != self._logits_addr:
            self._logits_addr, self._logits_views = addr, {}
        view = self._logits_views.get(n_out)
        if view is None:
            size = n_out * self.vocab_size
            view = np.ctypeslib.as_array((ctypes.c_float * size).from_address(addr)).reshape(n_out, self.vocab_size)
            self._logits_views[n_out] = view
        return view

    def _decode_error(self, rc: int, n_tokens: int) -> str:
        if rc == 1:
            return (f"llama_decode found no free KV cache cells for {n_tokens} tokens "
                    f"(n_ctx={self.n_ctx}; used by {len(self.slots)} sequence(s))")
        if rc == 2:
            return "llama_decode was aborted"
        return f"llama_decode failed with code {rc}: {last_error()}"

    def logit_tolerance(self) -> LogitTolerance:
        return QUANTIZED_TOLERANCE if "quantized" in self.weights else FLOAT_TOLERANCE

    def truncate(self, seq_id: int, n_tokens: int) -> None:
        """Rejected drafts leave the cache (llama.cpp attends to every cell a sequence holds): positions from
        `n_tokens` on removed, as llama.cpp's own speculative example does (llama_memory_seq_rm(seq, n_past, -1))."""
        llama.llama_memory_seq_rm(self.mem, self.slots.slot(seq_id), n_tokens, -1)

    def release(self, seq_id: int) -> None:
        if self.prefixes is not None:
            self.prefixes.release(seq_id)
        slot = self.slots.release(seq_id)
        if slot is not None and self.mem is not None:
            llama.llama_memory_seq_rm(self.mem, slot, -1, -1)

    def synchronize(self) -> None:
        if self.ctx is not None:
            llama.llama_synchronize(self.ctx)

    def now(self) -> float:
        """The run's clock. execute() synchronizes before it returns, so the device is idle whenever the engine
        reads the clock, and the base class's synchronize before each reading (three a step) is left out."""
        return perf_counter() + self.idle_skipped

    # -- reporting ---------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        return {
            "weights": self.weights,
            "model_desc": self.description,
            "llama_cpp_python": getattr(llama, "__version__", "unknown"),
            "llama_cpp": llama_version(),
            "ggml": ggml_version(),
            "threads": self.threads,
            "n_gpu_layers": self.n_gpu_layers,
            "n_ctx": self.n_ctx,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_ubatch,
            "n_seq_max": self.n_seq_max,
            "kv_unified": self.kv_unified,
            "prefix_cache": "on" if self.prefix.on else "off",
            **(self.prefixes.store.metadata() if self.prefixes is not None else {}),
            "n_ctx_seq": self.n_ctx_seq,
            "kv_type": self.kv_type,
            "flash_attn": self.flash_attn,
            "llama_extra_buffers": self.extra_buffers,
            # llama_decode cuts a batch above n_ubatch tokens into micro-batches by itself.
            "ubatch_split": f"llama.cpp splits any step above n_ubatch={self.n_ubatch} tokens; "
                            f"{self.n_split_steps} of {self.n_decode_calls} steps were split",
            "split_steps": self.n_split_steps,
            "decode_calls": self.n_decode_calls,
            **({"handoffs": self.handoffs, "handoff_ms_mean": 1e3 * self.handoff_seconds / self.handoffs}
               if self.handoffs else {}),
        }

    def close(self) -> None:
        self._free_context()
        if self.model is not None and llama is not None:
            llama.llama_model_free(self.model)
            self.model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

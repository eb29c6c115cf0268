"""The PyTorch backend: a transformers causal LM driven over packed mixed batches.

The model runs as its own modules; only attention is ours. Every token of a
step (prompt chunks at any offset, pads, single decode tokens) is packed into
one [1, T] row with its own position, so all linear layers run once over the
whole step: that shared pass is where decodes piggyback on a prefill chunk.
Attention then reads and writes a static per-slot KV cache (gpt-fast style).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

from prefillbench.step import PackedStep, Step, StepResult, pack

from prefillbench.backends.torch.cpu import decode_attention as cpu_decode_attention
from prefillbench.backends.torch.cpu import layer_ops as cpu_layer_ops
from prefillbench.backends.torch.cpu import prefill_attention as cpu_prefill_attention
from prefillbench.backends.torch.cpu import huge_pages
from prefillbench.backends.base import BackendError, LogitTolerance, SlotTable, StepBackend, check_cache_room
from prefillbench.backends.distributed import TensorParallel, check_heads_divide
from prefillbench.backends.torch.attention import chunk_query_blocks, decode_runs
from prefillbench.backends.torch import flash, flex
from prefillbench.backends.torch.attention_meta import AttentionMeta
from prefillbench.backends.torch.routes import Route, RouteLayout, choose_route, make_route, requested_route, route_note, warm_route
from prefillbench.backends.torch.cpu.decode_plan import CpuDecodePlan
from prefillbench.backends.torch.compiled import CompiledDecode
from prefillbench.backends.torch.fused import CompiledLayerOps, FusedDecoder
from prefillbench.backends.torch.graphs import DecodeGraphs
from prefillbench.backends.torch.kernel_choice import TIMED_CONTEXT, KernelChoice, Shapes, decide
from prefillbench.backends.torch.linear import LinearKernels
from prefillbench.backends.torch import memory
from prefillbench.backends.prefix import PrefixSettings
from prefillbench.backends.torch.loading import DTYPES, load_model, resolve_device
from prefillbench.backends.torch.prefixes import PREFIX_ENTRY_ROWS, TorchPrefixes
from prefillbench.backends.torch.verify import drafted_as_chunks
from prefillbench.backends.torch.packed import ATTENTION_NAME, ChunkSpan, KVCache, StepLayout, packed_attention, register_attention

# --verify's tolerances per dtype (see LogitTolerance). float32 strategies differ only in summation order:
# measured teacher-forced, SmolLM2-135M moves by up to 5.1e-5 (pp128+tg16, c=4, all strategies), the tiny
# test Llama by 6.4e-6, while a dropped chunk or a token at a wrong position moves the tiny Llama's by > 1.
LOGIT_TOLERANCE = {
    torch.float32: LogitTolerance(1e-3, 1e-3, "torch float32: 20x the largest move measured on SmolLM2-135M"),
    torch.bfloat16: LogitTolerance(1.0, 1.0, "torch bfloat16: 8 mantissa bits, an estimate"),
    torch.float16: LogitTolerance(0.25, 0.25, "torch float16: 11 mantissa bits, an estimate"),
}


class TorchBackend(StepBackend):
    name = "torch"
    spec_methods = ("ngram",)  # drafts verified in the packed path, a logit row at each position (verify.py)
    options = frozenset({"device", "dtype", "threads", "tp", "tune_linear", "cuda_graphs", "compile_decode", "decode_plan",
                         "attention", "kernels", "prefix_cache", "prefix_block"})

    def __init__(self, model, model_name: str, device: str = "cpu", weights: str | None = None,
                 parallel: TensorParallel | None = None, *, tune_linear: bool = True, cuda_graphs: bool = True,
                 compile_decode: bool = False, decode_plan: bool = True, attention: str | None = None,
                 kernels: str = "auto", flex_compiled: bool | None = None, compile_layer_ops: bool | None = None,
                 prefix: PrefixSettings = PrefixSettings()) -> None:
        """`tune_linear`: time the linear-layer kernels per row count (torch_linear); `cuda_graphs`:
        replay decode-only steps from CUDA graphs on a CUDA device (torch_graphs); `compile_decode`: run
        decode-only steps on the CPU through inductor-compiled graphs (torch_compiled); `decode_plan`: run
        them on the CPU as one list of C calls where it applies (cpu_decode_plan); `attention`: auto, flex
        or flash (default: PREFILLBENCH_ATTENTION, else auto: the CPU route on a CPU, flash or flex on
        CUDA; flex on a CPU runs the CUDA route's code eagerly, for tests; see routes.py); `kernels`: "auto",
        the C kernels where they build and win when timed at prepare(), or "torch", plain torch only (kernel_choice);
        `flex_compiled`: whether the flex route compiles (default: on CUDA only; True on a CPU compiles it through
        inductor's C++ template, for the tests of the compiled route; not a command-line option);
        `compile_layer_ops`: a fused decoder's elementwise work (add + RMSNorm, rotary, SiLU gate) through
        inductor-compiled functions, one kernel a call (fused.CompiledLayerOps; default: on CUDA, off a CPU route);
        `prefix`: --prefix-cache and --prefix-block, the cache's entries copied in rows of the KV cache (prefixes.py)."""
        try:
            self.kernel_choice = KernelChoice(kernels)
        except ValueError as e:
            raise BackendError(str(e)) from None
        if self.kernel_choice.plain_torch:
            tune_linear = decode_plan = False
        register_attention()
        config = model.config
        if getattr(config, "is_encoder_decoder", False):
            raise BackendError(f"{config.model_type} is an encoder-decoder model; prefillbench needs a decoder-only LM")
        if not getattr(model, "_supports_attention_backend", False):
            raise BackendError(f"architecture {config.model_type!r} does not accept a custom attention function")
        model.config._attn_implementation = ATTENTION_NAME
        self.model = model.eval()
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.torch_device = torch.device(device)
        self.device = "CUDA" if self.torch_device.type == "cuda" else "CPU"
        self.parallel = parallel
        tp = parallel.tp if parallel else 1
        if parallel:
            self.device = f"{tp}x{self.device} TP{tp}"  # the sim's spelling, so the two line up in tables
        self.model_name = model_name
        self.dtype = next(model.parameters()).dtype
        self.weights = weights or str(self.dtype).removeprefix("torch.")
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.n_layers = text.num_hidden_layers
        check_heads_divide(text, tp)
        # The config keeps the global head counts; this rank's attention sees only its own share.
        self.kv_heads = (getattr(text, "num_key_value_heads", None) or text.num_attention_heads) // tp
        self.heads = text.num_attention_heads // tp
        self.head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        self.context_length = getattr(text, "max_position_embeddings", 2048)
        self.vocab_size = text.vocab_size
        self.route_name = choose_route(self.torch_device.type, requested_route(attention), flash.available())
        self.route: Route | None = None  # made with the cache it reads
        self.flex_compiled = self.torch_device.type == "cuda" if flex_compiled is None else bool(flex_compiled)
        # The compiled flex route's compiles: at warm-ups (graphs, seconds), and after them (inside steps: 0 is the target).
        self.flex_compiles = {"warm_graphs": 0, "warm_seconds": 0.0, "late_graphs": 0}
        self.sizes = memory.ModelSizes(self.n_layers, self.heads, self.kv_heads, self.head_dim, text.hidden_size,
                                       getattr(text, "intermediate_size", None) or 4 * text.hidden_size, self.vocab_size,
                                       self.dtype.itemsize)
        self.free_memory: memory.FreeMemoryReader = memory.free_memory  # tests inject a smaller figure
        self.memory_plan: memory.MemoryPlan | None = None  # the last one the engine asked for
        self.cache: KVCache | None = None
        self.slots = SlotTable(0)
        self.prefix = prefix
        self.prefixes: TorchPrefixes | None = None  # the current run's cache
        self.use_cuda_graphs = cuda_graphs and self.torch_device.type == "cuda" and parallel is None and self.route_name != "cpu"
        self.decode_graphs: DecodeGraphs | None = None
        self.graphs_note = "on" if self.use_cuda_graphs else "off"
        # Sharded layers keep transformers' own forward (its hooks do the all-reduces).
        self.fused = FusedDecoder.build(model, packed_attention) if parallel is None else None
        if compile_layer_ops is None:
            compile_layer_ops = self.torch_device.type == "cuda" and self.route_name != "cpu"
        self.layer_ops_note: str | None = None  # why the compiled layer ops are off, where they were asked for
        if compile_layer_ops and self.fused is not None:
            if self.route_name == "cpu":
                raise BackendError("compiled layer ops run beside a CUDA route's attention (flex or flash), not the CPU route's")
            self.fused.compile_ops = self.fused.rms_norms
            if not self.fused.rms_norms:
                self.layer_ops_note = "torch ops (this model's norms are not the compiled functions' kind)"
        self.linear_kernels = LinearKernels(tune=tune_linear and parallel is None)
        if self.linear_kernels.tune:
            # The LM head's transposed copy (its size again) won its place on CPUs; on CUDA nothing measured it.
            transposed = {self.lm_head} if self.torch_device.type == "cpu" else set()
            self.linear_kernels.install(model, transposed_for=transposed, skip=self.fused.replaced if self.fused else set())
            if self.fused is not None:
                self.fused.register(self.linear_kernels)
        self.compiled: CompiledDecode | None = None
        if compile_decode:
            if self.torch_device.type != "cpu":
                raise BackendError("--compile is for the CPU; on CUDA, decode-only steps replay CUDA graphs")
            if self.route_name != "cpu":
                raise BackendError(f"--compile runs the CPU route's attention, not attention={self.route_name}")
            if self.fused is None:
                raise BackendError(f"--compile needs a Llama-family decoder (llama, mistral, qwen2), not {config.model_type!r}")
            self.compiled = CompiledDecode(self.fused, self.lm_head)
        self.decode_plan: CpuDecodePlan | None = None
        # Decided at the first prepare(): the plan needs the tuner's packed weights.
        self.decode_plan_note: str | None = None if decode_plan else "off (decode_plan=False)"
        if self.route_name != "cpu" and decode_plan:
            self.decode_plan_note = f"off (the {self.route_name} route attends)"
        self.graph_pool_bytes: int | None = None
        if self.route_name != "cpu":
            print(f"prefillbench: torch attention through the {self.route_note()} route", file=sys.stderr)
        if self.kernel_choice.plain_torch:
            self.decode_plan_note = "off (--kernels torch)"

    @classmethod
    def load(cls, model: str, device: str = "auto", dtype: str = "float32", threads: int | None = None,
             tp: int = 1, prefix_cache: str | None = None, prefix_block: int | None = None,
             **options: Any) -> "TorchBackend":
        """`options`: `tune_linear`, `cuda_graphs`, `decode_plan` (default True), `compile_decode`, `attention`,
        `kernels` ("auto"), see TorchBackend.__init__."""
        if dtype not in DTYPES:
            raise BackendError(f"unknown dtype {dtype!r}; use {', '.join(DTYPES)}")
        try:
            prefix = PrefixSettings.from_options(prefix_cache, prefix_block)
        except ValueError as e:
            raise BackendError(str(e)) from None
        if threads is not None:
            if threads < 1:
                raise BackendError(f"threads must be at least 1, got {threads}")
            torch.set_num_threads(threads)
        dev = resolve_device(device)
        parallel = None
        if tp > 1:
            from prefillbench.backends.distributed import join

            parallel = join(tp, dev)
            dev = parallel.device
        lm = load_model(model, DTYPES[dtype], dev, tp)
        name = Path(model).name.removesuffix(".gguf") if Path(model).exists() else model
        weights = f"{dtype} (dequantized from GGUF by transformers)" if model.endswith(".gguf") else dtype
        return cls(lm, name, dev, weights, parallel, prefix=prefix, **options)

    def prepare(self, max_sequences: int, max_seq_len: int, max_step_tokens: int) -> None:
        with self.kernel_choice.active():
            self._prepare(max_sequences, max_seq_len, max_step_tokens)

    def max_concurrency(self, max_seq_len: int, max_step_tokens: int) -> int:
        """Sequences of `max_seq_len` whose KV cache fits in what the device has free (memory.plan); the engine clamps to it."""
        huge = self.torch_device.type == "cpu" and not self.kernel_choice.plain_torch
        # while timing, the tuner makes a kind's oneDNN and packed copies before it drops the unchosen
        timing = self.torch_device.type == "cpu" and self.linear_kernels.tune and not self.linear_kernels.choice
        copies = 2 * sum(memory.nbytes(t.weight) for peers in self.linear_kernels.layers.values() for t in peers) if timing else 0
        reusable = 0 if self.cache is None else sum(map(memory.nbytes, self.cache.keys + self.cache.values))
        self.memory_plan = memory.plan(self.sizes, max_seq_len, max_step_tokens, self.free_memory(self.torch_device), copies,
                                       reusable, 2 * self.n_layers * huge_pages.HUGE_PAGE if huge else 0)
        return self.parallel.fewest(self.memory_plan.sequences) if self.parallel else self.memory_plan.sequences

    def room(self) -> str:
        return self.memory_plan.describe() if self.memory_plan is not None else super().room()

    def _prepare(self, max_sequences: int, max_seq_len: int, max_step_tokens: int) -> None:
        run_rows = max_sequences
        if self.prefix.on:  # rows for the cache's entries beside the run's own, as many as the memory holds
            room = self.max_concurrency(max_seq_len, max_step_tokens) - max_sequences
            if room < 2:
                raise BackendError(f"{max_sequences} sequences of {max_seq_len} tokens leave no room in "
                                   f"{self.room()} for the prefix cache's entries; lower -c or turn --prefix-cache off")
            max_sequences += min(room, PREFIX_ENTRY_ROWS)
        if self.cache is None or not self.cache.fits(max_sequences, max_seq_len):
            self.cache = None  # free the old one before allocating
            self.decode_graphs = None  # captured over the old cache's addresses
            if self.decode_plan is not None:
                self.decode_plan.bind(None)  # its programs hold the old cache's tensors
            on_route = self.route_name != "cpu"
            # The routes' tiles are KV_BLOCK positions and must not straddle two slots.
            length = -(-max_seq_len // flex.KV_BLOCK) * flex.KV_BLOCK if on_route else max_seq_len
            try:
                self.cache = KVCache(self.n_layers, max_sequences, self.kv_heads, length, self.head_dim, self.dtype,
                                     self.torch_device, heads_first=on_route, huge=not self.kernel_choice.plain_torch)
            except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError; the host's is "can't allocate memory"
                need = memory.kv_bytes(self.sizes, max_sequences + 1, max_seq_len) / memory.GiB
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise BackendError(f"cannot allocate the KV cache of {max_sequences} sequences of {max_seq_len} tokens "
                                   f"({need:.2f} GiB; {self.free_memory(self.torch_device).describe()}): {first}") from None
            if on_route:
                self._retire_route()
                self.route = self._make_route()
                self.route_warm(max_step_tokens)  # before the graphs' capture, whose warm-up runs would compile
                self.layer_ops_warm()
            if self.use_cuda_graphs:
                self.decode_graphs = self.make_decode_graphs(capture=True)
            if self.compiled is not None:
                self.compiled.batch_sizes.clear()  # warmed on the old cache; a new one may change the graphs' guards
        elif self.route is not None:
            self.route_warm(max_step_tokens)  # the cache fits, but a larger step may bring a row class not warmed
        if self.compiled is not None:
            self.compiled.warm(range(1, self.cache.n_slots + 1), self.cache.scratch_slot, self.cache.keys, self.cache.values)
        with torch.inference_mode():
            self.linear_kernels.tune_ahead(max_step_tokens, max_sequences)
            if self.torch_device.type == "cpu" and not self.kernel_choice.plain_torch and not self.kernel_choice.decided:
                self._decide_kernels(max_step_tokens)
            if self.decode_plan_note is None and self.compiled is not None:
                self.decode_plan_note = "off (--compile runs decode-only steps)"
            elif self.decode_plan_note is None:
                with self.kernel_choice.active():
                    self._build_decode_plan(max_seq_len)
        if self.decode_plan is not None:
            self.decode_plan.bind(self.cache)
        self.slots = SlotTable(run_rows if self.prefix.on else self.cache.n_slots)
        if self.prefix.on:
            self.prefixes = TorchPrefixes(self.cache, self.prefix, range(run_rows, max_sequences))
            self.prefix_capacity = self.prefixes.store.cache.capacity

    def _make_route(self) -> "Route":
        return make_route(self.route_name, self.cache.max_len, self.cache.n_slots, self.torch_device, self.flex_compiled)

    def _retire_route(self) -> None:
        """Fold the route's late compiles into the backend's count before a new cache replaces it."""
        if isinstance(self.route, flex.FlexRoute):
            self.flex_compiles["late_graphs"] += self.route.timed_graphs
            self.route.timed_graphs = 0

    def route_note(self) -> str:
        return route_note(self.route_name, self.torch_device.type, self.flex_compiled)

    def attention_scaling(self) -> float:
        """The scale the model's attention passes (the first layer's; head_dim ** -0.5 where it keeps none)."""
        first = next(iter(getattr(self.decoder, "layers", [])), None)
        return getattr(getattr(first, "self_attn", None), "scaling", self.head_dim**-0.5)

    def route_warm(self, max_step_tokens: int) -> None:
        """Compile the flex route's kernels for every shape class a step can bring, before any step is timed:
        with the model's own scale (a compiled call guards on it), on the cache the steps will read."""
        if not isinstance(self.route, flex.FlexRoute) or not self.route.compiled:
            return
        graphs, seconds = self.route.warm_graphs, self.route.warm_seconds
        warm_route(self.route, self.cache.keys[0], self.cache.values[0], self.cache.scratch_slot, self.heads, max_step_tokens,
                   self.attention_scaling())
        self.flex_compiles["warm_graphs"] += self.route.warm_graphs - graphs
        self.flex_compiles["warm_seconds"] += self.route.warm_seconds - seconds

    def layer_ops_warm(self) -> None:
        """Compile the fused decoder's CompiledLayerOps before anything is timed: a forward of one token (a graph
        of its own) and one of two (every longer step's), on the scratch slot. Where inductor fails, the layer
        ops stay torch's, and the metadata says why."""
        if self.fused is None or not self.fused.compile_ops or self.route is None:
            return
        dev, scratch = self.torch_device, self.cache.scratch_slot
        graphs, t0 = flex.graphs_compiled(), time.perf_counter()
        CompiledLayerOps.marking = True
        try:
            with torch.inference_mode():
                one = torch.full((1,), scratch, dtype=torch.long, device=dev)
                for meta in (AttentionMeta.for_decodes(torch.zeros_like(one), one), flex._scratch_chunks([2], scratch, dev)):
                    positions = meta.row_positions
                    self.route.begin_step(meta)
                    self._hidden(torch.zeros_like(positions)[None], positions[None], RouteLayout(self.route, meta, self.cache))
        except Exception as e:  # noqa: BLE001: the torch ops compute the same; the metadata says which ran
            self.fused.compile_ops = False
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self.layer_ops_note = f"torch ops (inductor failed: {type(e).__name__}: {first[:160]})"
        finally:
            CompiledLayerOps.marking = False
        self.flex_compiles["warm_graphs"] += flex.graphs_compiled() - graphs
        self.flex_compiles["warm_seconds"] += time.perf_counter() - t0

    def late_compiles(self) -> int:
        """Graphs the compiled flex route compiled inside steps, after its warm-ups (the target is 0)."""
        late = self.flex_compiles["late_graphs"]
        return late + (self.route.timed_graphs if isinstance(self.route, flex.FlexRoute) else 0)

    def _decide_kernels(self, max_step_tokens: int) -> None:
        """Time each C kernel against its torch equivalent on this model's shapes (kernel_choice): it runs only where it won."""
        self.kernel_choice.decide(Shapes(self.cache.keys[0], self.cache.values[0], self.cache.scratch_slot, self.heads,
                                         self.attention_scaling(),
                                         self.fused, max_step_tokens))

    def _build_decode_plan(self, max_seq_len: int) -> None:
        """The decode plan where it applies and, timed against the eager step of one decode it replaces, wins."""
        refused = self.kernel_choice.refused() & {cpu_layer_ops.KERNELS.name, cpu_decode_attention.KERNEL.name}
        if refused:
            self.decode_plan_note = f"off (the {', '.join(sorted(refused))} kernel lost to torch when timed)"
            return
        plan, self.decode_plan_note = CpuDecodePlan.build(self.fused, self.lm_head, self.linear_kernels, self.torch_device, self.dtype)
        if plan is None:
            return
        plan.bind(self.cache)
        slot, position = self.cache.scratch_slot, min(max_seq_len, TIMED_CONTEXT) - 1
        dev = self.torch_device
        tokens, positions, slots = torch.zeros(1, dtype=torch.long), torch.tensor([position]), torch.tensor([slot])
        layout = StepLayout(chunks=[], decode_from=0, decode_slots=slots, decode_positions=positions,
                            decode_runs=decode_runs([slot], positions, self.dtype), cache=self.cache)
        eager = lambda: self.lm_head(self._hidden(tokens.to(dev)[None], positions.to(dev)[None], layout)[0])  # noqa: E731
        d = decide(lambda: plan.run([0], [position], [slot]), eager, "the eager step")
        self.kernel_choice.decisions["decode_plan"] = d
        if d.on:
            self.decode_plan = plan
            self.decode_plan_note += self.kernel_choice.note("decode_plan")
        else:
            self.decode_plan_note = f"off ({d.note})"

    def make_decode_graphs(self, capture: bool) -> DecodeGraphs | None:
        """Graphs for decode-only steps of up to the cache's slots; None (eager) if capture fails."""
        if self.route is None:
            raise BackendError("CUDA-graph decodes attend through the flex or flash route, not the CPU route")
        try:
            graphs = DecodeGraphs(self._static_decode, self.cache.n_slots, self.cache.scratch_slot, self.torch_device, capture)
        except Exception as e:  # noqa: BLE001: any capture failure leaves the eager path, which is always right
            self.graphs_note = f"off: capture failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            return None
        self.graphs_note = f"on, batch sizes {','.join(map(str, graphs.sizes))}"
        self.graph_pool_bytes = graphs.pool_bytes
        return graphs

    def _static_decode(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """A decode step from tensors alone: its contract (context lengths = positions + 1) is built inside the graph."""
        meta = AttentionMeta.for_decodes(positions, slots)
        self.route.begin_step(meta)
        return self.lm_head(self._hidden(tokens[None], positions[None], RouteLayout(self.route, meta, self.cache))[0])

    def _hidden(self, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: "StepLayout | RouteLayout") -> torch.Tensor:
        """The decoder's last hidden state for a packed step: fused projections where the model allows."""
        if self.fused is not None:
            return self.fused.forward(input_ids, position_ids, layout, self.linear_kernels)
        return self.decoder(input_ids=input_ids, position_ids=position_ids, use_cache=False, pb_layout=layout).last_hidden_state

    def release(self, seq_id: int) -> None:
        self.slots.release(seq_id)
        if self.prefixes is not None:
            self.prefixes.release(seq_id)

    def reuse_prefix(self, seq_id: int, prompt: tuple[int, ...]) -> int:
        return self.prefixes.reuse(seq_id, prompt) if self.prefixes is not None else 0

    def refreshed_prefixes(self) -> dict[int, int]:
        return self.prefixes.refreshed() if self.prefixes is not None else {}

    def synchronize(self) -> None:
        if self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)

    def now(self) -> float:
        if not self.parallel:
            return super().now()
        # After this rank's device is idle, every rank waits for the slowest and reads rank 0's clock.
        self.synchronize()
        return self.parallel.clock() + self.idle_skipped  # every rank skipped the same: it waited on this clock

    def _layout(self, step: Step, packed: PackedStep) -> "StepLayout | RouteLayout":
        dev, dtype = self.torch_device, self.dtype
        check_cache_room(step, self.cache.max_len)
        if self.route is not None:
            slots = [self.slots.slot(c.seq_id) for c in step.prefills] + [self.slots.slot(d.seq_id) for d in step.decodes]
            # The step's tokens and LM-head rows ride in the contract's one copy to the device.
            meta = AttentionMeta.for_step(step, packed, slots, dev, extra={"tokens": packed.tokens, "logit_rows": packed.logit_rows})
            self.route.begin_step(meta)
            return RouteLayout(self.route, meta, self.cache)
        # Decided once a step, so SDPA's masks are built only for the chunks SDPA attends.
        prefill_kernel = bool(step.prefills) and cpu_prefill_attention.applies(dev, dtype, self.head_dim)
        chunks = []
        for chunk, row in zip(step.prefills, packed.chunk_offsets):
            n = len(chunk.tokens) + chunk.pad
            blocks = [] if prefill_kernel else chunk_query_blocks(chunk.start, n, dtype, dev)
            chunks.append(ChunkSpan(self.slots.slot(chunk.seq_id), chunk.start, row, n, blocks))
        slots = [self.slots.slot(d.seq_id) for d in step.decodes]
        positions = torch.from_numpy(packed.positions[packed.decode_from :]).to(dev)
        return StepLayout(
            chunks=chunks,
            decode_from=packed.decode_from,
            decode_slots=torch.tensor(slots, device=dev, dtype=torch.long),
            decode_positions=positions,
            decode_runs=decode_runs(slots, positions, dtype) if slots else [],
            cache=self.cache,
            prefill_kernel=prefill_kernel,
        )

    def execute(self, step: Step, return_logits: bool = False) -> StepResult:
        with self.kernel_choice.active():
            return self._execute(step, return_logits)

    @torch.inference_mode()
    def _execute(self, step: Step, return_logits: bool = False) -> StepResult:
        if self.cache is None:
            raise BackendError("prepare() must be called before execute()")
        # Drafts (speculative decoding) go through the packed path, each drafted decode as a chunk (verify.py).
        verify = drafted_as_chunks(step) if any(d[3] for d in step.decodes) else None
        if verify is None and self.decode_graphs is not None and self.decode_graphs.fits(step):
            check_cache_room(step, self.cache.max_len)
            logits = self.decode_graphs.run(step, [self.slots.slot(d.seq_id) for d in step.decodes])
            return self._result(step.emitting_seq_ids, logits, return_logits)
        if verify is None and self.decode_plan is not None and self.decode_plan.fits(len(step.prefills), len(step.decodes)):
            check_cache_room(step, self.cache.max_len)
            logits = self.decode_plan.run([d.token for d in step.decodes], [d.position for d in step.decodes],
                                          [self.slots.slot(d.seq_id) for d in step.decodes])
            # The plan's logits are a static buffer: what is handed out must outlive the next step.
            return self._result(step.emitting_seq_ids, logits.clone() if return_logits else logits, return_logits)
        if verify is None and self.compiled is not None and not step.prefills and step.decodes:
            check_cache_room(step, self.cache.max_len)
            dev = self.torch_device
            tokens = torch.tensor([d.token for d in step.decodes], device=dev)
            positions = torch.tensor([d.position for d in step.decodes], device=dev)
            logits = self.compiled(tokens, positions, [self.slots.slot(d.seq_id) for d in step.decodes], self.cache.keys, self.cache.values)
            return self._result(step.emitting_seq_ids, logits, return_logits)
        if self.prefixes is not None and step.prefills:
            self.prefixes.before(step, self.slots.slot)
        run = step if verify is None else verify.step
        packed = pack(run)
        layout = self._layout(run, packed)
        dev = self.torch_device
        if isinstance(layout, RouteLayout):
            tokens, positions, logit_rows = layout.meta.extra["tokens"], layout.meta.row_positions, layout.meta.extra["logit_rows"]
        else:
            tokens, positions = torch.from_numpy(packed.tokens).to(dev), torch.from_numpy(packed.positions).to(dev)
            logit_rows = None
        hidden = self._hidden(tokens.unsqueeze(0), positions.unsqueeze(0), layout)
        if layout.calls != self.n_layers:
            raise BackendError(
                f"architecture {self.model.config.model_type!r} bypassed the packed attention "
                f"({layout.calls} of {self.n_layers} layers used it)"
            )
        if self.prefixes is not None and step.prefills:
            self.prefixes.after(step, self.slots.slot)
        if verify is not None:
            rows = torch.from_numpy(verify.rows).to(dev)
            return verify.result(self.lm_head(hidden[0, rows]).float().argmax(dim=-1).tolist())
        seq_ids = packed.emitting
        if not seq_ids:  # a chunk in mid-prompt: no token, no LM head
            return StepResult({})
        # The LM head runs only where a next token is needed.
        if logit_rows is None:
            logit_rows = torch.from_numpy(packed.logit_rows).to(dev)
        return self._result(seq_ids, self.lm_head(hidden[0, logit_rows]), return_logits)

    @staticmethod
    def _result(seq_ids, logits: torch.Tensor, return_logits: bool) -> StepResult:
        logits = logits.float()
        result = StepResult(dict(zip(seq_ids, logits.argmax(dim=-1).tolist())))
        if return_logits:
            result.logits = dict(zip(seq_ids, logits.cpu().numpy()))
        return result

    def metadata(self) -> dict[str, Any]:
        meta = {"weights": self.weights, "dtype": str(self.dtype).removeprefix("torch."), "torch": torch.__version__,
                "threads": torch.get_num_threads()}
        if self.torch_device.type == "cuda":
            meta["gpu"] = torch.cuda.get_device_name(self.torch_device)
            meta["cuda_graphs"] = self.graphs_note
        if self.graph_pool_bytes is not None:
            meta["cuda_graph_pool"] = f"{self.graph_pool_bytes / 2**20:.1f} MiB"
        meta["attention_route"] = self.route_note()
        if (self.route_name == "flex" and self.flex_compiled) or (self.fused is not None and self.fused.compile_ops):
            c = self.flex_compiles
            meta["flex_compiles"] = (f"{c['warm_graphs']} graphs at warm-up ({c['warm_seconds']:.0f} s), "
                                     f"{self.late_compiles()} inside steps")
        meta["kernels"] = self.kernel_choice.mode
        if self.torch_device.type == "cpu" and not self.kernel_choice.plain_torch:
            meta["kernel_build"] = cpu_prefill_attention.KERNEL.describe()
        meta["tune_linear"] = "on" if self.linear_kernels.tune else "off"
        if self.torch_device.type == "cpu":
            meta["decode_plan"] = self.decode_plan_note or "off (not prepared)"
        if self.compiled is not None:
            meta["compile"] = f"decode-only steps, batch sizes 1-{max(self.compiled.batch_sizes, default=0)}, compiled in {self.compiled.compile_s:.0f} s"
        meta.update(self.kernel_choice.paths(self.torch_device, self.dtype, self.head_dim, self.fused))
        if self.fused is not None and self.fused.compile_ops:
            meta["layer_ops"] = "inductor-compiled (add + RMSNorm, rotary, SiLU gate: one kernel a call)"
        elif self.layer_ops_note:
            meta["layer_ops"] = self.layer_ops_note
        if self.route_name != "cpu":  # the route attends: the CPU kernels' notes do not apply
            meta["decode_attention"] = f"{self.route_name} route: each decode reads its own context"
            meta["prefill_attention"] = "flex route: one call for the step's chunks" if self.route_name == "flex" else "flash route"
        meta["fused_projections"] = "qkv, gate_up" if self.fused is not None else "off (transformers' forward)"
        if self.linear_kernels.choice:
            meta["linear_kernels"] = ", ".join(f"{k} {v}" for k, v in self.linear_kernels.summary().items())
        if self.memory_plan is not None:
            meta["memory"] = f"{self.memory_plan.sequences} sequences fit in {self.memory_plan.describe()}"
        if self.clamped:
            meta["concurrency_clamped"] = self.clamp_note()
        meta["prefix_cache"] = "on" if self.prefix.on else "off"
        if self.prefixes is not None:
            meta |= self.prefixes.metadata()
        if self.parallel:
            meta.update(self.parallel.metadata())
        return meta

    def logit_tolerance(self) -> LogitTolerance:
        return LOGIT_TOLERANCE[self.dtype]

    def close(self) -> None:
        if self.parallel:
            self.parallel.close()

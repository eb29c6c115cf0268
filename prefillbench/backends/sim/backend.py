"""The sim backend: the strategies' steps priced by a roofline cost model on a virtual clock.

No weights, no tensors: `execute` adds the modelled step time to the clock
and returns deterministic placeholder tokens, so every table, export and
comparison of prefillbench works for GPUs and models that are not here.
"""
from __future__ import annotations

import copy
import math
import random
import sys
from itertools import repeat
from operator import add
from pathlib import Path
from typing import Any

from prefillbench.backends.prefix import PrefixSettings, PrefixStore
from prefillbench.backends.sim import calibration_measured, links
from prefillbench.backends.sim import host_tier as sim_host_tier
from prefillbench.backends.sim.calibration import calibration_specs, load_calibration
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.backends.sim.cost import Batch, CostModel, StepCost
from prefillbench.backends.sim.data_parallel import check_dp, rank_backends
from prefillbench.backends.sim.pipeline import Pipeline
from prefillbench.backends.sim.pricing import default_pricing, engine_overheads, pricing_for
from prefillbench.backends.sim.run_metadata import approximations, sim_metadata
from prefillbench.backends.sim.specs import (GiB, GPUSpec, ModelSpec, SimConfigError, kv_format, precision_words,
                                             weight_format, with_precision)
from prefillbench.backends.sim.step_trace import StepTrace
from prefillbench.backends.sim.placeholders import POSITION_STRIDE, SEQ_STRIDE, placeholder_run, placeholder_token
from prefillbench.backends.sim.windowed import execute_windowed, run_decodes_windowed
from prefillbench.step import Step, StepResult

from prefillbench.backends.base import BackendError, DecodeRun, Launched, StepBackend

JITTER_SEED = 7
#: The engine's cap on sequences in flight where no engine is named: vLLM 0.32's max_num_seqs on an H100 or H200
#: (vllm/engine/arg_utils.py get_batch_defaults), the sim's cap before engines' limits were read.
DEFAULT_MAX_NUM_SEQS = 1024


#: What this process has said on stderr already: a grid of sims loads the same model many times.
_SAID: set[str] = set()


def say_once(line: str) -> None:
    if line not in _SAID:
        _SAID.add(line)
        print(f"prefillbench: sim: {line}", file=sys.stderr)


class SimBackend(StepBackend):
    name = "sim"
    # No refusal of a large -c: the engine's cap on sequences in flight (max_num_seqs) and the KV cache clamp it,
    # and the rest wait in the engine's queue, as on a real server.
    sequence_limit = None
    # Speculative decoding: the methods whose drafts it prices, acceptance drawn from --spec's rate (drafting.py);
    # ngram needs real tokens to look drafts up in, which the sim has not.
    spec_methods = ("eagle", "eagle3", "mtp", "draft")
    real_tokens = False
    drafting = None  # the run's SimDrafting (speculate), None: off
    # It holds no KV: sequences share blocks as the engine's block cache decides (vllm-v1 with --prefix-cache on).
    shares_kv_blocks = True
    # sim_model and sim_gpu stand in for model and gpu: the flags that name what the sim prices.
    # sim_dtype / kv_dtype: the precision the sim prices. --dtype is the torch backend's: any given is named on stderr.
    options = frozenset({"sim_model", "sim_gpu", "tp", "pp", "ep", "sim_dtype", "kv_dtype", "dtype", "calibration",
                         "trace", "sim_pricing", "sim_overheads", "max_num_seqs", "prefix_cache", "prefix_block",
                         "sim_link", "dp", "kv_host_cache", "kv_host_link", "hicache_write_policy"})
    #: --kv-host-cache: GiB of host memory below the GPU's KV blocks (host_tier.py); None: no host tier
    kv_host_gib: float | None = None
    #: --kv-host-link: what the tier's loads cross (host_tier.HostLink); None: the card's PCIe slot
    kv_host_link = None

    def __init__(self, model: ModelSpec, gpu: GPUSpec, *, tp: int = 1, pp: int = 1, ep: int = 1,
                 calibration: dict[str, Any] | None = None, calibration_path: str | None = None,
                 trace: str | Path | None = None, pricing: str = "spec", overheads: str | None = None,
                 prefix: PrefixSettings = PrefixSettings(), max_num_seqs: int | None = None,
                 pricing_why: str = "--sim-pricing", dp: int = 1) -> None:
        check_dp(dp, tp=tp, pp=pp, ep=ep, windows=bool(model.windows))
        if dp > 1 and trace:
            raise SimConfigError(f"--trace with --dp {dp}: a trace writes one step's operators, not each rank's; drop one")
        self.data_parallel = dp  # lockstep data-parallel ranks, each a copy of this layout (data_parallel.py)
        self._ranks: list[SimBackend] = []  # their backends, built at the first run (rank_backends)
        self.spec_gpu = gpu
        # what another instance of this deployment needs (instance): all but the parallelism and the trace file
        self._settings = dict(calibration=calibration, calibration_path=calibration_path, pricing=pricing,
                              overheads=overheads, prefix=prefix, max_num_seqs=max_num_seqs, pricing_why=pricing_why)
        # a calibration holds both pricings' terms: the spec fractions, and the measured curves and host line
        gpu, measured_fit = calibration_measured.applied(calibration, calibration_path, gpu, pricing)
        links.with_link(gpu, None, tp * pp * (ep // tp if ep > 1 else 1))  # a bridge joins a pair only
        self.model, self.gpu = model, gpu
        self.pricing = calibration_measured.pricing(measured_fit, gpu) if measured_fit else pricing_for(pricing, gpu)
        # measured pricing prices an engine's steps: vLLM's overheads (a calibration's own host line) unless named
        self.overheads = (calibration_measured.engine(measured_fit, gpu.name) if measured_fit and not overheads else
                          engine_overheads(overheads or ("vllm" if pricing == "measured" else "none"), gpu, tp))
        self.cost = CostModel(model, gpu, tp, pp, ep, self.pricing, self.overheads)
        # the header line of every sim run: which pricing and whose overheads priced it, and why those
        ran = "measured curves" if self.pricing is not None else "spec sheets"
        host = (f"{self.overheads.name}'s overheads" if self.overheads is not None else "no engine overheads")
        host_why = "--sim-overheads" if overheads else ("the calibration's host line" if measured_fit else
                                                        "measured pricing's default" if self.pricing is not None else
                                                        "spec pricing's default")
        self.pricing_line = f"priced by {ran} ({pricing_why}) with {host} ({host_why})" + links.pricing_words(
            self.gpu, self.pricing is not None, self.cost.allreduce_engine, tp * self.cost.dp, pp)
        self.cost.check_fits()
        self.max_num_seqs, self.max_num_seqs_source = self._sequence_cap(max_num_seqs, tp)
        if dp > 1:  # each rank's own: N ranks hold N times as many, each within its own (engine/lockstep.py)
            self.max_num_seqs_source += f", each of {dp} data-parallel ranks"
        # A windowed model's sequences hold fewer positions on its windowed layers: its cache is counted in
        # positions summed over layers (ModelSpec.kv_positions), a dense one's in tokens, as before.
        self._windows = model.windows
        self._kv_capacity = dp * (self.cost.kv_capacity_positions() if self._windows else self.cost.kv_capacity_tokens())
        if self._windows:
            self._full_layers = sum(1 for w in model.windows if not w)
            self._window_layers = {w: sum(1 for x in model.windows if x == w) for w in self.cost.windows}
        self.tp, self.pp, self.ep = tp, pp, ep
        self.max_steps_in_flight = pp
        self.calibrated = calibration is not None
        self.calibration_path = calibration_path
        n = self.cost.n_gpus
        self.device = gpu.name if n == 1 else f"{n}x{gpu.name} TP{tp} PP{pp}" + (f" EP{ep}" if ep > 1 else "")
        if dp > 1:
            self.device = f"DP{dp} x " + self.device
        if self.calibrated:
            self.device += " calibrated"
        self.model_name = model.name
        self.context_length = model.max_context
        self.vocab_size = model.vocab
        self._token_span = max(model.vocab - 100, 1)  # placeholder_token's range
        active = f", {model.n_active_params / 1e9:.3g}B active per token" if model.is_moe else ""
        priced = (f"{model.weight_bytes:.3g} bytes each" if not (model.precision or model.kv_bytes)
                  else precision_words(model))
        self.weights = f"none (roofline model of {model.n_params / 1e9:.3g}B params{active}, {priced}; " + (
            f"calibrated from {calibration_path})" if self.calibrated else
            "measured curves)" if self.pricing is not None else "spec sheets only)")
        self.clock = 0.0
        self._idle = True  # nothing ran before the next step: its host work cannot hide behind one (cost.step_cost)
        self.n_steps = 0
        self.n_runs = 0  # prepare() calls: one per engine run, warm-ups included
        self._seq_tokens: dict[int, int] = {}  # cache positions each live sequence holds
        self._held = 0  # their sum, kept as they change: summing every step was a share of the sim's time
        self.pipeline: Pipeline | None = None  # the current run's stage timelines, with --pp > 1
        self.pipeline_stats: dict[str, Any] | None = None  # the last finished run's
        self._jitter: random.Random | None = None  # each run's draws of step jitter, from the same seed
        self._trace = StepTrace(trace) if trace else None
        self.prefix = prefix
        self.prefix_capacity = prefix.blocks(self._kv_capacity) if prefix.on else None
        self.prefixes: PrefixStore | None = None  # the current run's cache, with --prefix-cache on
        say_once(self.pricing_line)
        for line in self.approximations():
            say_once(line)

    def _sequence_cap(self, given: int | None, tp: int) -> tuple[int, str]:
        """The engine's cap on sequences in flight and where it comes from: --max-num-seqs, else the --sim-overheads
        engine's own default on this GPU (vLLM 0.32: 1024 on GPUs of 70 GiB and more but A100s, 256 elsewhere;
        SGLang: its max_running_requests from the KV tokens; TensorRT-LLM: max_batch_size 2048), else 1024 (vLLM's
        default on an H100 or H200, the sim's cap before the engines' limits)."""
        if given is not None:
            if given < 1:
                raise SimConfigError(f"--max-num-seqs must be at least 1, got {given}")
            return given, "--max-num-seqs"
        o = self.overheads
        if o is not None and o.name == "sglang":
            from prefillbench.backends.sim.measured.overheads import sglang_max_running_requests

            return (sglang_max_running_requests(self.cost.kv_capacity_tokens(), self.model.max_context),
                    "sglang's max_running_requests from its KV tokens")
        if o is not None and o.max_num_seqs:
            return o.max_num_seqs, f"{o.version or o.name}'s default on {self.gpu.name}"
        return DEFAULT_MAX_NUM_SEQS, "the sim's default, vLLM's on an H100 or H200"

    def approximations(self) -> list[str]:
        """What the sim prices by a named approximation for this model and GPU (also in the metadata)."""
        return approximations(self)

    @classmethod
    def load(cls, model: str | None = None, gpu: str | None = None, *, tp: int = 1, pp: int = 1, ep: int = 1,
             calibration: str | None = None, trace: str | None = None, sim_model: str | None = None,
             sim_gpu: str | None = None, sim_dtype: str | None = None, kv_dtype: str | None = None,
             dtype: str | None = None, sim_pricing: str | None = None, sim_overheads: str | None = None,
             prefix_cache: str | None = None, prefix_block: int | None = None,
             max_num_seqs: int | None = None, sim_link: str | None = None, dp: int = 1,
             kv_host_cache: float | None = None, kv_host_link: str | None = None,
             hicache_write_policy: str | None = None) -> "SimBackend":
        """Presets or files by name; a calibration file supplies the model and device it measured when none is named.
        sim_dtype: the weights' precision (bf16, fp16, fp8, int8, int4, mxfp4), kv_dtype: the KV cache's (bf16,
        fp16, fp8); by default what the preset or config ships (bf16, or a config's quantization_config). dtype (the
        shared --dtype, as the torch backend runs weights and KV cache in it) prices the weights (a different
        --sim-dtype is refused) and the KV cache where --kv-dtype does not set it; float32 is refused."""
        if dtype is not None:
            try:
                weight_format(dtype), kv_format(dtype)
            except SimConfigError as e:
                raise SimConfigError(f"--dtype {dtype}: {str(e).split(': ', 1)[-1]}") from None
            if sim_dtype is not None and weight_format(sim_dtype) != weight_format(dtype):
                raise SimConfigError(f"--dtype {dtype} and --sim-dtype {sim_dtype} disagree; give one")
            sim_dtype = sim_dtype if sim_dtype is not None else dtype
            kv_dtype = kv_dtype if kv_dtype is not None else dtype
        model, gpu = sim_model or model, sim_gpu or gpu
        cal = load_calibration(calibration) if calibration else None
        cal_model, cal_gpu = calibration_specs(cal) if cal else (None, None)
        model_spec = (load_model_spec(model, precision_given=sim_dtype is not None) if model
                      else (cal_model or load_model_spec("llama-13b")))
        if sim_dtype is not None or kv_dtype is not None:
            model_spec = with_precision(model_spec, sim_dtype, kv_dtype)
        gpu_spec = load_gpu_spec(gpu) if gpu else (cal_gpu or load_gpu_spec("a6000"))
        gpu_spec = links.with_link(gpu_spec, sim_link, tp * pp * (ep // tp if ep > 1 else 1))
        try:
            prefix = PrefixSettings.from_options(prefix_cache, prefix_block)
        except ValueError as e:
            raise SimConfigError(str(e)) from None
        why = "--sim-pricing"
        if sim_pricing is None:
            sim_pricing, why = default_pricing(gpu_spec, cal is not None)
            why = f"the default: {why}"
        host_link = sim_host_tier.parse_link(kv_host_link)
        sim_host_tier.check(kv_host_cache, gpu_spec, pp, dp, host_link)
        backend = cls(model_spec, gpu_spec, tp=tp, pp=pp, ep=ep, calibration=cal, calibration_path=calibration,
                      trace=trace, pricing=sim_pricing, overheads=sim_overheads, prefix=prefix,
                      max_num_seqs=max_num_seqs, pricing_why=why, dp=dp)
        backend.kv_host_gib = kv_host_cache
        backend.kv_host_link = host_link
        backend.hicache_write_policy = hicache_write_policy
        if kv_host_cache is not None:
            say_once(sim_host_tier.words(backend))
        return backend

    def host_tier(self, block_size: int):
        """The host tier's blocks and prices (host_tier.py), None without --kv-host-cache."""
        return sim_host_tier.host_tier(self, block_size)

    def with_kv_host_cache(self, gib: float) -> "SimBackend":
        """A copy with a host tier of `gib` GiB (0: none), one configuration of a grid of tier sizes; the copy shares
        the model, the GPU and the prices (a run prepares its own state)."""
        size = gib or None
        if size == self.kv_host_gib:
            return self
        sim_host_tier.check(size, self.gpu, self.pp, self.data_parallel, self.kv_host_link)
        sized = copy.copy(self)
        sized.kv_host_gib = size
        return sized

    def rank_backends(self) -> list["SimBackend"]:
        """Its data-parallel ranks' backends (data_parallel.py), built once: each a copy of this layout."""
        self._ranks = self._ranks or rank_backends(self)
        return self._ranks

    def join_step(self, end: float) -> None:
        self.clock = max(self.clock, end)
        self._idle = False

    def instance(self, tp: int) -> "SimBackend":
        """Another GPU instance of the same model, device, pricing and cache at tensor parallelism `tp` (a
        deployment's pool, deploy/), with a clock of its own."""
        return SimBackend(self.model, self.spec_gpu, tp=tp, ep=min(self.ep, tp), **self._settings)

    # ---- capacity ---------------------------------------------------------------
    def max_concurrency(self, max_seq_len: int, max_step_tokens: int = 0) -> int:
        """Sequences of `max_seq_len` whose KV cache fits beside the weights, at most the engine's max_num_seqs;
        the engine clamps to it."""
        return self.data_parallel * min(self.cost.max_sequences(max_seq_len, max_step_tokens), self.max_num_seqs)

    def own_kv_capacity_tokens(self, max_step_tokens: int) -> int:
        return self.data_parallel * self.cost.kv_capacity_tokens(max_step_tokens)

    @property
    def engine_max_num_seqs(self) -> int:
        return self.max_num_seqs

    @property
    def schedules_ahead(self) -> bool:
        """The --sim-overheads engine's default: vLLM V1's async scheduling, SGLang's and TensorRT-LLM's overlap
        schedulers choose the next step while the last runs (the same property that hides their host work)."""
        return self.overheads is not None and self.overheads.overlapped

    def clamp_kind(self, allowed: int) -> str:
        return "engine" if allowed >= self.max_num_seqs else "kv"

    def say_clamp(self, asked: int, allowed: int, limit: str = "") -> None:
        if self.clamp_kind(allowed) == "kv":
            return super().say_clamp(asked, allowed, limit)
        print(f"prefillbench: sim: {asked} sequences asked; the engine runs at most {allowed} at a time, the rest "
              f"wait in its queue (max_num_seqs {allowed}: {self.max_num_seqs_source})", file=sys.stderr)

    def room(self) -> str:
        return f"{self.gpu.name}'s KV cache beside {self.model.name}'s weights"

    def prepare(self, max_sequences: int, max_seq_len: int, max_step_tokens: int) -> None:
        # The engine keeps the sequences in flight within the cache (engine.admission.fit reserves each at its
        # whole length; a paged strategy admits and preempts by the engine's KV memory): here, only that one fits.
        fits = self.max_concurrency(max_seq_len, max_step_tokens)
        if fits < 1:
            held = max_seq_len if not self.model.windows else self.model.kv_positions(max_seq_len) / self.model.n_layers
            kv = max_sequences * held * self.cost.kv_bytes_per_token_per_gpu() / GiB / self.cost.dp
            raise BackendError(
                f"{max_sequences} sequences of {max_seq_len} tokens need {kv:.1f} GiB of KV cache per GPU; "
                f"{self.gpu.name} has room for {fits} beside {self.model.name}'s weights"
            )
        self._seq_tokens.clear()
        self._held = 0
        # A run whose longest sequence stays within every window holds and prices as a dense model's (kv_positions
        # is n_layers x length, min(context, W) the context): the plain path, counting tokens, gives the same floats
        # and the same overflow checks at a fraction of the windowed one's time (mistral-7b's 4096-token windows
        # under tune's 4,026-token sequences: half of a probe's CPU went to _execute_windowed).
        binds = bool(self.model.windows) and self.model.kv_positions(max_seq_len) < self.model.n_layers * max_seq_len
        self._windows = self.model.windows if binds else ()
        self._kv_capacity = self.data_parallel * (self.cost.kv_capacity_positions() if binds else self.cost.kv_capacity_tokens())
        # The cache holds what the KV pool does (vLLM's: cached blocks live in the pool and are evicted as it fills),
        # counted as the model's pool is, whichever path the run takes.
        pool = self.cost.kv_capacity_positions() if self.model.windows else self._kv_capacity
        self.prefixes = (PrefixStore(self.prefix.block, self.prefix.blocks(pool))
                         if self.prefix.on and not self.kv_shared else None)  # kv_shared: the engine's cache decides
        # The same draws in every run: configurations compared on one trace also meet the same jitter, step by step.
        self._jitter = random.Random(JITTER_SEED) if self.gpu.step_jitter else None
        self.n_runs += 1
        self._idle = True
        self.pipeline = Pipeline(self.pp, self.clock) if self.pp > 1 else None

    # ---- the clock ----------------------------------------------------------------
    def now(self) -> float:
        return self.clock

    def wait_until(self, t: float, *, stalled: bool = False, idle: bool = False) -> None:
        if stalled and self.pipeline is not None:
            self.pipeline.stall(self.clock)
        self._idle = self._idle or t > self.clock
        self.clock = max(self.clock, t)

    def step_cost(self, step: Step, after_idle: bool = False) -> StepCost:
        return self.cost.step_cost(Batch.from_step(step), after_idle)

    # ---- speculative decoding ------------------------------------------------------
    def speculate(self, spec) -> None:
        from prefillbench.backends.sim.drafting import SimDrafting

        if spec is None:
            self.drafting = None
            return
        if self.data_parallel > 1:
            raise BackendError(f"--spec {spec.label} with --dp {self.data_parallel}: not modelled (data_parallel.py)")
        if self._windows or self.pp > 1:
            raise BackendError(f"--spec {spec.label}: the sim prices speculative decoding without sliding windows "
                               "or pipeline stages")
        try:
            self.drafting = SimDrafting(spec, self.model, self.cost)
        except ValueError as e:
            raise BackendError(str(e)) from None
        say_once(f"--spec {spec.label}: acceptance {self.drafting.acceptance.label} (drafting.py), drafts priced as "
                 + ("nothing on the GPU" if self.drafting.drafter is None else
                    f"{self.drafting.drafter.model.name} forwards, K after each step"))

    def truncate(self, seq_id: int, n_tokens: int) -> None:
        length = self._seq_tokens.get(seq_id, 0)
        if length > n_tokens:
            self._seq_tokens[seq_id] = n_tokens
            self._held -= length - n_tokens

    def _verify_step(self, step: Step) -> StepResult:
        from prefillbench.backends.sim.drafting import execute_verify

        result, seconds = execute_verify(self, step)
        self.end_step(step, seconds)
        return result

    def hold_prefills(self, step: Step, tokens: dict[int, int], charge=None) -> tuple[list[tuple[int, int]], int]:
        """Every prompt chunk of `step`, as each execute path takes it: its KV held (`charge`: the positions a length
        holds where windows cap some layers; None, the length itself), its token put in `tokens` where it ends its
        prompt, the prefix store told. Returns the chunks as the price takes them, (start, tokens with pads), and how
        many of them emit a token."""
        held, span, prefixes = self._seq_tokens, self._token_span, self.prefixes
        chunks = []
        emitting = 0
        for c in step.prefills:
            end = c.start + len(c.tokens)
            chunks.append((c.start, len(c.tokens) + c.pad))
            before = held.get(c.seq_id, 0)
            self._held += end - before if charge is None else charge(end) - charge(before)
            held[c.seq_id] = end
            if c.is_last:
                emitting += 1
                tokens[c.seq_id] = placeholder_token(c.seq_id, end, span)
            if prefixes is not None:
                prefixes.computed(c.seq_id, end)
        return chunks, emitting

    def end_step(self, step: Step, seconds: float, held: str = "positions") -> None:
        """A step's price onto the clock, as every path of execute ends: the jitter, a host tier's loads, the KV
        held checked against the cache (`held` names what a sequence holds: positions, or layer-positions where
        windows cap some layers)."""
        self._idle = False
        if self._jitter is not None:  # median-preserving: the calibration fits the medians of its repeats
            seconds *= math.exp(self.gpu.step_jitter * self._jitter.gauss(0.0, 1.0))
        if step.host_loads:  # a host tier's loads, waited for before the step (host_tier.py says why)
            seconds += sim_host_tier.load_seconds(self, sum(n for _, n in step.host_loads))
        self.clock += seconds
        self.n_steps += 1
        if self._held > self._kv_capacity and not self.kv_shared:
            raise BackendError(f"the KV cache overflowed: {self._held} {held} held, "
                               f"{self._kv_capacity} fit on {self.gpu.name}")

    def execute(self, step: Step, return_logits: bool = False) -> StepResult:
        if return_logits:
            raise BackendError("the sim backend has no logits: it never runs the model")
        if self.drafting is not None:
            return self._verify_step(step)
        if self._windows:
            return execute_windowed(self, step)
        # One pass over the step: the shape the cost model needs, the cache it holds, and its tokens. This loop
        # runs once per sequence per simulated step, so it is written out here (see benchmarks.sim.steps).
        held = self._seq_tokens
        span = self._token_span
        decodes = step.decodes
        n_emit = len(decodes)
        if decodes:
            # Comprehensions and maps over the decodes rather than one loop of four statements: a third faster here.
            ids = [d[0] for d in decodes]
            lengths = [d[2] + 1 for d in decodes]
            ctx = sum(lengths)
            self._held += ctx - sum(map(held.get, ids, repeat(0, n_emit)))
            held.update(zip(ids, lengths))
            tokens = dict(zip(ids, [100 + (SEQ_STRIDE * i + POSITION_STRIDE * n) % span for i, n in zip(ids, lengths)]))  # placeholder_token
        else:
            tokens, ctx = {}, 0
        chunks, emitting = self.hold_prefills(step, tokens)
        n_emit += emitting
        if self.data_parallel > 1:
            raise BackendError(f"--dp {self.data_parallel}: each rank steps on its own backend (rank_backends, engine/lockstep.py)")
        if self._trace is None:
            seconds = self.cost.fast_seconds(chunks, len(step.decodes), ctx, n_emit, None, self._idle)
        else:
            cost = self.step_cost(step, self._idle)
            self.trace_step(step, self.clock, cost)
            seconds = cost.seconds
        self.end_step(step, seconds)
        return StepResult(tokens)

    @property
    def runs_decodes(self) -> bool:
        # Pipeline stages hold several steps at once, and a trace writes each step's operators.
        return self.pipeline is None and self._trace is None and self.data_parallel == 1

    def run_decodes(self, step: Step, max_steps: int, until: float) -> DecodeRun | None:
        """Decode-only steps in a row, priced and held as execute would one at a time, to the same float: the
        engine's and strategy's work per step was most of a lightly loaded run's time, and such runs are mostly
        decode steps that change nothing but positions (benchmarks.sim.steps)."""
        if not self.runs_decodes or step.prefills or not step.decodes:
            return None
        if self._windows:
            return run_decodes_windowed(self, step, max_steps, until)
        decodes = step.decodes
        n = len(decodes)
        ids = [d[0] for d in decodes]
        lengths = [d[2] + 1 for d in decodes]
        held = self._seq_tokens
        ctx = sum(lengths)
        grown = ctx - sum(map(held.get, ids, repeat(0, n)))  # the first step's; each later one adds n
        room = self._kv_capacity - self._held - grown
        if room < 0:
            return None  # the first step overflows: execute says so
        max_steps = min(max_steps, 1 + room // n)
        price, sigma, jitter = self.cost.fast_seconds, self.gpu.step_jitter, self._jitter
        start = clock = self.clock
        ends = []
        idle, self._idle = self._idle, False
        for _ in range(max_steps):
            seconds = price((), n, ctx, n, None, idle)
            idle = False
            if jitter is not None:
                seconds *= math.exp(sigma * jitter.gauss(0.0, 1.0))
            clock += seconds
            ends.append(clock)
            if clock >= until:
                break
            ctx += n
        k = len(ends)
        self.clock = clock
        self.n_steps += k
        self._held += grown + (k - 1) * n
        held.update(zip(ids, map(add, lengths, repeat(k - 1, n))))
        span = self._token_span
        return DecodeRun(start, ends, {i: placeholder_run(i, length, k, span) for i, length in zip(ids, lengths)})

    def placeholder_tokens(self, step: Step) -> dict[int, int]:
        """Deterministic in (sequence, position), so every strategy emits the same tokens."""
        span = max(self.vocab_size - 100, 1)
        out = {c.seq_id: placeholder_token(c.seq_id, c.end, span) for c in step.prefills if c.is_last}
        out.update((d.seq_id, placeholder_token(d.seq_id, d.position + 1, span)) for d in step.decodes)
        return out

    def reuse_prefix(self, seq_id: int, prompt: tuple[int, ...]) -> int:
        """The cached prefix costs nothing to compute; its KV is held as the sequence's own (execute counts the
        sequence's whole length) and read by its attention (a chunk's context starts there)."""
        return self.prefixes.reuse(seq_id, prompt) if self.prefixes is not None else 0

    def refreshed_prefixes(self) -> dict[int, int]:
        return self.prefixes.refreshed() if self.prefixes is not None else {}

    def release(self, seq_id: int) -> None:
        if self.prefixes is not None:
            self.prefixes.release(seq_id)
        length = self._seq_tokens.pop(seq_id, 0)
        self._held -= self.model.kv_positions(length) if self._windows else length

    # ---- the pipeline --------------------------------------------------------------
    def launch(self, step: Step, return_logits: bool = False) -> Launched:
        """With --pp > 1 the step enters the stage queues; the clock moves to when stage 0 is free again."""
        if self.pipeline is None:
            return super().launch(step, return_logits)
        if return_logits:
            raise BackendError("the sim backend has no logits: it never runs the model")
        cost = self.step_cost(step)
        t0 = max(self.clock, self.pipeline.stage_free[0])
        mb = self.pipeline.launch(step, t0, cost)
        if self.prefixes is not None:
            for c in step.prefills:
                self.prefixes.computed(c.seq_id, c.end)
        self.trace_step(step, t0, cost, stage_starts=mb.starts, stage_ends=mb.ends, bubble_s=mb.bubble)
        self.n_steps += 1
        self.clock = self.pipeline.stage_free[0]
        return Launched(t0, mb.exit, StepResult(self.placeholder_tokens(step)))

    def end_run(self) -> None:
        if self.pipeline is None:
            return
        self.clock = max(self.clock, self.pipeline.end)
        stats = self.pipeline_stats = self.pipeline.stats()
        busy = " ".join(f"{b:.0%}" for b in stats["stage_busy_fraction"])
        print(f"prefillbench: sim pipeline: {stats['micro_batches']} micro-batches, median bubble "
              f"{stats['median_bubble_per_request_s'] * 1e3:.1f} ms per request, stage busy {busy}", file=sys.stderr)

    # ---- trace -------------------------------------------------------------------------
    def trace_step(self, step: Step, start: float, cost: StepCost, **extra: Any) -> None:
        if self._trace is not None:
            self._trace.write(self.n_runs, self.n_steps, step, start, cost, **extra)

    def close(self) -> None:
        if self._trace is not None:
            self._trace.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def metadata(self) -> dict[str, Any]:
        return sim_metadata(self)

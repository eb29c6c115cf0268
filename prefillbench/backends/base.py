"""The backend contracts: what every backend is (Backend), and the two ways one runs a case: executing the engine's
steps, owning the KV cache and keeping the clock (StepBackend), or serving whole requests as an engine that
schedules its own steps (ServingBackend)."""
from __future__ import annotations

import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from prefillbench.backends.prefix import PrefixSettings
from prefillbench.errors import BackendError
from prefillbench.step import Step, StepResult

if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Callable

    from prefillbench.backends.server.client import StreamRun, Streamed
    from prefillbench.sequence import Request

__all__ = ["Backend", "BackendError", "DecodeRun", "Launched", "LogitTolerance", "ServingBackend", "SlotTable",
           "StepBackend", "check_cache_room"]


@dataclass(frozen=True)
class LogitTolerance:
    """How far a backend's logits for the same tokens may move with the rest of the step around them.

    Kernels that are not batch-invariant (llama.cpp's CPU kernels, low-precision
    matmuls) give a token slightly different logits depending on which other
    tokens share its pass and where in the batch it sits. `--verify` accepts
    logits within `max_abs` of the reference's, and requires the same top-1
    token wherever the reference's top-1 leads the runner-up by more than
    `margin`; a flip below that margin is a near tie, not an error.
    """

    max_abs: float
    margin: float
    basis: str  # where the numbers come from, for the report


@dataclass
class Launched:
    """A step handed to a backend: when it started and when its tokens exist (its result)."""

    start: float
    end: float
    result: StepResult


@dataclass
class DecodeRun:
    """Decode-only steps of the same sequences one after another (StepBackend.run_decodes): the clock when the first
    began, when each ended (the next began then), and each sequence's tokens, one a step."""

    start: float
    ends: list[float]
    tokens: dict[int, list[int]]


class Backend(ABC):
    """What every backend is, whichever way it runs a case: a model on a device, with the options it takes.

    A backend either executes the steps the engine's strategy makes (StepBackend: torch, gguf, the sim) or is a
    serving engine that schedules its own and is measured from outside (ServingBackend: backends/server). The
    engine, bench and the commands tell the two apart by type.
    """

    #: Short name used on the command line and in reports: "torch", "gguf", "sim".
    name: str = ""
    #: Where it runs, as shown in the table's backend column: "CPU", "CUDA", ...
    device: str = "CPU"
    model_name: str = ""
    context_length: int = 0
    vocab_size: int = 0
    #: What weights actually run, e.g. "float32 (dequantized from GGUF)".
    weights: str = ""
    #: The most sequences the backend can hold at once, whatever the memory; None: no fixed limit.
    #: A class attribute, so the CLI can refuse a larger -c before loading anything.
    sequence_limit: ClassVar[int | None] = None
    #: The keyword options `load` takes beyond the model; `load_backend` passes these and no others, and the
    #: CLI warns about a flag whose option is not here (prefillbench.backends.check_options reads both).
    options: ClassVar[frozenset[str]] = frozenset()
    #: When nothing runs until the next arrival, the clock jumps there rather than sleeping (`--skip-idle`): a run
    #: at low load then takes the time its steps take, not its arrivals' span. Every step is still measured; what
    #: it leaves out is whatever idling does to the step after it (a cold cache, a clock ramping back up).
    #: Here, not on StepBackend alone, because the session sets it and records it for every backend; only a step
    #: backend's clock acts on it (StepBackend.wait_until): a serving engine keeps its own, and the options turn
    #: it off there.
    skip_idle: bool = False

    @classmethod
    def unusable_options(cls) -> dict[str, str]:
        """Declared options this installation cannot act on, each with why (e.g. GPU layers without a GPU build)."""
        return {}

    #: --prefix-cache and --prefix-block as this backend runs them; a backend with a prefix cache sets it at load
    #: (a serving engine's own cache too: its flags follow it, and the hit rate a workload implies is read from it).
    prefix: PrefixSettings = PrefixSettings()

    @property
    def caches_prefixes(self) -> bool:
        """Whether runs reuse cached prompt prefixes."""
        return self.prefix.on

    @property
    def prefix_block(self) -> int | None:
        """The cache's block in tokens (prompts share cached KV in whole blocks); None without a cache."""
        return self.prefix.block if self.prefix.on else None

    #: The most blocks it caches (None: no bound), for the hit rate a workload implies beside the measured one.
    prefix_capacity: int | None = None
    #: --kv-host-cache: GiB of host memory below the GPU's KV blocks (engine/host_tier.py); None: no host tier. Only
    #: a backend that prices the link's loads has one (the sim).
    kv_host_gib: float | None = None

    def logit_tolerance(self) -> LogitTolerance | None:
        """What `--verify` may accept between strategies on this backend; None: it computes no logits (asked of
        every backend, so that `--verify` is refused in one line where there are none to compare)."""
        return None

    @property
    def label(self) -> str:
        """The table's backend column."""
        return f"{self.name} {self.device}"

    def metadata(self) -> dict[str, Any]:
        return {"weights": self.weights}

    def close(self) -> None:
        pass


class StepBackend(Backend):
    """A backend the engine drives step by step: execute one step, own the KV cache, keep the clock."""

    #: (asked, allowed) concurrencies the engine clamped to (`note_clamp`); replaced, never appended to in place.
    clamped: list[tuple[int, int]] = []
    #: (asked, kind, limit) of the clamp lines said so far (`note_clamp`); replaced, never added to in place.
    said_clamps: frozenset[tuple[int, str, str]] = frozenset()
    #: Seconds the clock has jumped over so far (added to every reading of it; see `skip_idle`).
    idle_skipped: float = 0.0
    #: Speculative decoding methods whose drafts it verifies (prefillbench/speculation.py: a decode's drafts fed in
    #: the same pass, `StepResult.verified` filled); empty: none, and --spec is refused on it.
    spec_methods: ClassVar[tuple[str, ...]] = ()
    #: Whether its tokens are a model's own, so drafts may be looked up in them (n-gram); the sim's are not.
    real_tokens: ClassVar[bool] = True

    @abstractmethod
    def prepare(self, max_sequences: int, max_seq_len: int, max_step_tokens: int) -> None:
        """Size the KV cache and step buffers for a run; called before every run."""

    @abstractmethod
    def execute(self, step: Step, return_logits: bool = False) -> StepResult:
        """Run one forward pass over `step` and return each emitting sequence's greedy token."""

    @abstractmethod
    def release(self, seq_id: int) -> None:
        """Forget a finished sequence and free its KV cache."""

    def speculate(self, spec) -> None:
        """The run's speculative decoding (a SpecConfig, or None), before `prepare`: a backend that prices drafts or
        draws their acceptance (the sim) takes its settings here; BackendError where it cannot."""

    def truncate(self, seq_id: int, n_tokens: int) -> None:
        """Keep only the first `n_tokens` positions of `seq_id`'s KV (speculative decoding: the KV of rejected drafts
        dropped). A backend whose attention reads each sequence's cache only up to the positions a step feeds has
        nothing to do (the next step's tokens overwrite those slots); one whose cache attends to all it holds (llama.cpp)
        must remove them."""

    def reuse_prefix(self, seq_id: int, prompt: tuple[int, ...]) -> int:
        """Asked as a sequence is admitted, where `caches_prefixes`: how many leading tokens of its prompt the
        backend's prefix cache holds, now in the sequence's own KV, so its prompt resumes there. At most
        len(prompt) - 1: a prompt's last token is always computed, for its logits (vLLM's rule too)."""
        return 0

    def accept_handoff(self, seq_id: int, request) -> None:
        """A prompt prefilled elsewhere enters (a disaggregated deployment's decode instance, deploy/): its KV, in
        `request.handoff`, becomes sequence `seq_id`'s. A backend that holds no real KV (the sim) has nothing to do:
        its cost model reads the context from the decode's position."""

    def refreshed_prefixes(self) -> dict[int, int]:
        """Asked before every step, where `caches_prefixes`: the sequences admitted but not started whose prompt
        now finds more of itself cached than when it looked (a prompt sharing its prefix has computed it since):
        seq_id -> tokens cached. A cache is consulted when a prompt starts, as vLLM's scheduler does."""
        return {}

    #: Whether its sequences can share KV blocks as the engine's block cache decides (engine/block_cache.py): a
    #: backend that holds no real KV (the sim); one that does keeps its own prefix cache (a copy per sequence).
    shares_kv_blocks: bool = False
    #: Set by the engine before `prepare`: this run's KV memory holds the blocks as a cache, a prefix shared by
    #: several sequences counted once, so the sum of the sequences' lengths may exceed the cache, and the backend's
    #: own prefix cache is not consulted.
    kv_shared: bool = False

    #: --hicache-write-policy: when SGLang's HiCache writes a node to the host tier (engine/hicache.py); None: SGLang's
    #: default
    hicache_write_policy: str | None = None

    def host_tier(self, block_size: int) -> tuple[int, Any, Any] | None:
        """The run's host tier as the engine builds it: its blocks of `block_size` tokens, a load's seconds (tokens)
        and a recompute's (start, tokens); None: no host tier."""
        return None

    def with_kv_host_cache(self, gib: float) -> "StepBackend":
        """This backend with a host tier of `gib` GiB (0: none), for one configuration of a grid."""
        if gib:
            raise BackendError(f"the {self.name} backend has no host tier to size (--kv-host-cache is the sim's)")
        return self

    #: --kv-cache-tokens: the KV cache shrunk to this many tokens (None: the backend's own), so that memory pressure,
    #: admission by free blocks and preemption can be studied where the cache would never fill (a CPU).
    kv_cache_tokens: int | None = None

    def kv_capacity_tokens(self, max_step_tokens: int) -> int | None:
        """Tokens of KV cache a run has beside a step of `max_step_tokens` (None: unbounded), --kv-cache-tokens
        included: the engine's KV memory (engine/memory.py) is this big."""
        own = self.own_kv_capacity_tokens(max_step_tokens)
        given = self.kv_cache_tokens
        return given if own is None else own if given is None else min(own, given)

    def own_kv_capacity_tokens(self, max_step_tokens: int) -> int | None:
        """The backend's own KV capacity in tokens; None: no bound of its own (a real backend sizes its cache to
        the run)."""
        return None

    @property
    def engine_max_num_seqs(self) -> int | None:
        """The engine's cap on running sequences (vLLM's max_num_seqs) where the backend stands for an engine with
        one (the sim); None: none beyond the run's concurrency."""
        return None

    def max_concurrency(self, max_seq_len: int, max_step_tokens: int) -> int | None:
        """How many sequences of `max_seq_len` fit in the KV cache; None: as many as asked."""
        return None

    def note_clamp(self, asked: int, allowed: int, limit: str = "") -> None:
        """Told when the engine runs fewer sequences at once than asked, because of `max_concurrency`: kept in
        `clamped` for the metadata, and said on stderr once per asked count (the room left beside a step
        depends on its budget, so a grid of budgets clamps to a few neighbouring counts: one line, not one each).
        `limit`: which limit binds, in words (engine.admission.binding_limit), said in the line; a line is said
        once per asked count, kind and limit (the words before its colon: "packed's step activations")."""
        if (asked, allowed) not in self.clamped:
            self.clamped = [*self.clamped, (asked, allowed)]
        key = (asked, self.clamp_kind(allowed), limit.split(":")[0])
        if key not in self.said_clamps:
            self.said_clamps = self.said_clamps | {key}
            self.say_clamp(asked, allowed, limit)

    def clamp_kind(self, allowed: int) -> str:
        """What bound a clamp to `allowed` (a backend with several limits says each once per asked count)."""
        return "kv"

    def say_clamp(self, asked: int, allowed: int, limit: str = "") -> None:
        """The clamp's line; a worker process replaces it to send the line to its parent instead."""
        print(f"prefillbench: {self.name}: only {allowed} of {asked} sequences fit in {self.room()}; "
              f"running {allowed} at a time" + (f" (binding: {limit})" if limit else ""), file=sys.stderr)

    def room(self) -> str:
        """Where the sequences in flight must fit, for `note_clamp`'s line and the engine's refusal."""
        return f"{self.label}'s KV cache"

    def clamp_note(self) -> str:
        """The clamps so far, for the metadata: "asked->allowed;..."."""
        return ";".join(f"{a}->{b}" for a, b in self.clamped)

    #: How many steps may be in flight at once (pipeline stages); the engine never puts a sequence in two.
    max_steps_in_flight: int = 1
    #: Data-parallel ranks (the sim's --dp): each an engine of its own on a backend of its own (`rank_backends`),
    #: stepping in lockstep (engine/lockstep.py); 1: one engine.
    data_parallel: int = 1
    #: The balancing rules its data-parallel runs used (engine/dp_balance.py), for the metadata.
    dp_balancing: frozenset[str] = frozenset()

    def rank_backends(self) -> list["StepBackend"]:
        """With `data_parallel` > 1: one backend per rank, each holding its own KV on a clock the engine keeps in
        lockstep (`join_step`)."""
        raise BackendError(f"the {self.name} backend runs one data-parallel rank")

    def join_step(self, end: float) -> None:
        """A data-parallel rank's clock joins the lockstep step's end (the slowest rank's), having run its own step
        or a dummy batch: it was not idle."""
        raise BackendError(f"the {self.name} backend runs one data-parallel rank")

    @property
    def schedules_ahead(self) -> bool:
        """Whether the engine this backend stands for chooses a step before the last one's tokens are in (vLLM V1's
        async scheduling, SGLang's overlap loop): a finished request's KV memory is then freed a step late. A real
        backend here runs one step after another: no."""
        return False

    def launch(self, step: Step, return_logits: bool = False) -> Launched:
        """Start `step`; return when the backend can take the next one.

        A backend that runs one step at a time finishes it here; a pipelined one
        (the sim's --pp) returns once its first stage is free, with the time the
        step's tokens come out of the last stage as `end`.
        """
        start = self.now()
        result = self.execute(step, return_logits=return_logits)
        return Launched(start, self.now(), result)

    @property
    def runs_decodes(self) -> bool:
        """Whether `run_decodes` can run decode steps in a row in this run (asked once a run, after `prepare`).
        A real backend must run every pass: no."""
        return False

    def run_decodes(self, step: Step, max_steps: int, until: float) -> DecodeRun | None:
        """Execute the decode-only `step`, then the same sequences' next decodes, each fed the token the one before
        made, up to `max_steps` steps in all; stop after the first step that ends at or after `until` (the clock).
        None: not this time (the engine then launches `step` alone). The engine asks only when `runs_decodes` and
        nothing can change the strategy's next step meanwhile (see Strategy.steady_decodes): no sequence joins,
        leaves or advances its prompt."""
        return None

    def wait_until(self, t: float, *, stalled: bool = False, idle: bool = False) -> None:
        """Let the run's clock reach `t`: sleep on a real backend, move the virtual clock on the sim.

        `stalled`: sequences were ready but the backend could take no more steps
        (the sim charges that idle time to its pipeline bubbles). `idle`: no step is in flight, so with
        `skip_idle` the clock may jump to `t`; a wait for a step in flight is always real.
        """
        delay = t - self.now()
        if delay <= 0:
            return
        if idle and self.skip_idle:
            self.idle_skipped += delay
        else:
            time.sleep(delay)

    def end_run(self) -> None:
        """Told when a run's last token is out."""

    def synchronize(self) -> None:
        """Wait until the device has finished all queued work."""

    def now(self) -> float:
        """Seconds on the run's clock, read only after the device is idle."""
        self.synchronize()
        return time.perf_counter() + self.idle_skipped


class ServingBackend(Backend):
    """A serving engine measured from outside: it takes whole requests, schedules its own steps and streams tokens
    back, so what is measured is its scheduler (the engine's `run` hands it the requests: `serve`)."""

    @abstractmethod
    def serve(self, strategy_name: str, budget: int | None, requests: list[Request], concurrency: int,
              on_tokens: Callable[[int], None] | None = None,
              watch: Callable[[StreamRun, list[Streamed], deque], bool] | None = None) -> StreamRun:
        """Submit `requests` (at their arrival times, or `concurrency` in flight) to the engine configured for
        (strategy, budget; None: the engine's own) and report when each token arrived: the stream run, every
        request in it, with the engine's own clock over the run where it could be read (`engine_clock`).
        `on_tokens`: called as each request finishes, with its tokens; `watch`: asked as requests finish whether
        the run's outcome is already known (True ends it, `stopped`)."""

    @property
    def reports_scheduling(self) -> bool:
        """Whether the engine tells when each prompt started (a token stream alone tells when tokens came)."""
        return False

    @property
    def as_served(self) -> bool:
        """Whether it runs one configuration, its own, whatever the case asks (a server prefillbench did not
        launch): its rows say so."""
        return False

    def self_description(self) -> dict[str, Any]:
        """What the engine says of itself (its version, its settings), for the metadata; {}: nothing."""
        return {}

    def stop(self) -> None:
        """Stop the engine it launched, if any (the next `serve` launches one anew)."""

    def close(self) -> None:
        self.stop()


def check_cache_room(step: Step, max_len: int) -> None:
    """Every prefill chunk, pads included, must fit in the positions prepared for its sequence."""
    for c in step.prefills:
        if c.end + c.pad > max_len:
            raise BackendError(f"sequence {c.seq_id} needs {c.end + c.pad} cache positions, prepared for {max_len}")


class SlotTable:
    """Maps live sequence ids onto a fixed number of cache slots.

    Backends with a static cache (tensor rows, llama.cpp sequence ids) need
    small dense indices; sequence ids keep growing in a closed-loop run.
    """

    def __init__(self, n_slots: int) -> None:
        self.n_slots = n_slots
        self._slot: dict[int, int] = {}
        self._free = list(range(n_slots - 1, -1, -1))

    def __len__(self) -> int:
        """Sequences holding a slot."""
        return len(self._slot)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._slot

    def slot(self, seq_id: int) -> int:
        """The slot of `seq_id`, taking a free one on first sight."""
        slot = self._slot.get(seq_id)
        if slot is None:
            if not self._free:
                raise BackendError(f"no free cache slot for sequence {seq_id} ({self.n_slots} slots)")
            slot = self._slot[seq_id] = self._free.pop()
        return slot

    def release(self, seq_id: int) -> int | None:
        slot = self._slot.pop(seq_id, None)
        if slot is not None:
            self._free.append(slot)
        return slot

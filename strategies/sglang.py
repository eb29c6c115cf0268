"""SGLang's scheduler (SGLang 0.5.23, `srt/managers/scheduler.py`), as two strategies: `sglang`, the default launch
(`--chunked-prefill-size` the budget), and `sglang-mixed` (`--enable-mixed-chunk`). The rules, with file and function,
are in ../shared/notes/sglang-and-kv-memory.md §1 and docs/servers.md; the budget both share is sglang_budget.py.

One scheduler iteration (`get_next_batch_to_run`), synchronous (`event_loop_normal`; the overlap loop, SGLang's GPU
default, is the engine's async property: a finished request's memory seen a step late):
- **Prefill first.** If a prefill batch can be formed it runs, alone (`sglang`) or with every running decode
  (`sglang-mixed`, when their next tokens fit in memory; else they sit the step out). Only then, with no prompt to
  start, a decode batch of every running request.
- **One prompt in progress** (`chunked_req`): it is served first, with what the batch's budget allows (at least
  progress); every other admitted prompt finishes in its batch or becomes the one in progress.
- **Admission** (`_get_new_batch_prefill_raw`, PrefillAdder): FCFS over the waiting queue (radix cache off; where
  the engine's memory is SGLang's radix cache, LPM and the tree's hits and evictions as sglang_radix.py reads them;
  with another prefix cache, LPM by its cached prefix), each admitted if its prompt plus its expected output fits the
  free tokens less every running request's expected output at `new_token_ratio`; the first that does not fit stops
  admission (head of line) and, with others running, marks the batch full: no prefill is tried again until a
  request leaves (finishes, is retracted, or a prompt in progress is set aside).
- **Retraction** (`update_running_batch`, `ScheduleBatch.retract_decode`): a decode batch whose next tokens do not
  fit retracts the requests with the fewest outputs (ties: the longest prompt) until the rest fit; each one's KV is
  freed, it goes to the waiting queue's tail, its output so far recomputed with its prompt.
- **`new_token_ratio`** (`NewTokenRatioTracker`): 0.7, less 0.7*0.86/600 each decode batch without retraction, down
  to 0.098; after a retraction, set to what the remaining requests have made of their outputs (plus 20 steps each);
  back to 0.7 when the scheduler is idle.

Speculative decoding (--spec; SGLang 0.5.23, srt/arg_groups/speculative_hook.py `_handle_eagle_family`,
`_handle_ngram`, launched as --speculative-algorithm, K steps, topk 1, K + 1 draft tokens): a decode batch feeds every
running request's drafts; --enable-mixed-chunk is turned off for NGRAM and STANDALONE (a draft model), so every prefill
batch stalls every decode, and stays on for EAGLE, EAGLE3 and NEXTN (mtp), whose mixed steps decode one plain token
(`supports_mixed_chunk`); --max-running-requests is 48 where none is given; the decode memory check keeps
2 x (K + 1) tokens a request past its committed KV (`ScheduleBatch._new_tokens_required_next_decode_spec_v2`,
`get_alloc_reserve_per_decode`), so a batch retracts sooner. (SGLang's over-allocation is kept across steps; here a
request holds what it computed, so the check asks a little more than SGLang's.)

Settings (-s sglang:ignore-eos=1:max-prefill=N:max-running=N): `ignore-eos` 1 says every request is sent with
ignore_eos (prefillbench's own client does; real traffic does not): running requests are then charged their whole
remaining output, and with the radix cache off a prompt is admitted only if its own simulation of every request's
future finds memory enough (`add_one_req_ignore_eos`); `max-prefill`, --max-prefill-tokens (16384); `max-running`,
--max-running-requests (else the engine's cap where the backend stands for one, else the run's concurrency).
"""
from __future__ import annotations

from prefillbench.sequence import Sequence
from prefillbench.step import Preemption, Step

from .base import Strategy, cut_drafts, decode_tokens, prefill_chunk
from .sglang_budget import CONTINUE, MAX_PREFILL_TOKENS, NO_TOKEN, OTHER, PrefillBudget
from .sglang_radix import RadixRules

#: environ.py: SGLANG_INIT_NEW_TOKEN_RATIO, _MIN_NEW_TOKEN_RATIO_FACTOR, _NEW_TOKEN_RATIO_DECAY_STEPS,
#: _RETRACT_DECODE_STEPS (schedule_conservativeness 1.0)
INIT_RATIO = 0.7
MIN_RATIO = INIT_RATIO * 0.14
RATIO_DECAY = (INIT_RATIO - MIN_RATIO) / 600
RETRACT_DECODE_STEPS = 20
#: WAITING_QUEUE_PREFIX_MATCH_MAX (schedule_policy.py): past this many waiting, LPM falls back to FCFS
LPM_MAX_WAITING = 128
#: --spec's method as SGLang's --speculative-algorithm (srt/speculative/spec_info.py SpeculativeAlgorithm; mtp is
#: NEXTN, a reserved alias of EAGLE; a draft model is STANDALONE)
SGLANG_ALGORITHMS = {"ngram": "NGRAM", "eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "EAGLE", "draft": "STANDALONE"}
#: SpeculativeAlgorithm.supports_mixed_chunk(): the algorithms --enable-mixed-chunk stays on with (their running
#: requests decode one plain token in a mixed step); every other one turns it off (arg_groups/speculative_hook.py
#: _handle_eagle_family, _handle_ngram)
MIXED_CHUNK_ALGORITHMS = ("EAGLE", "EAGLE3")
#: --max-running-requests where none is given and speculation is on (_handle_eagle_family, _handle_ngram)
SPEC_MAX_RUNNING = 48


class Sglang(RadixRules, Strategy):
    name = "sglang"
    # SGLang 0.5.23's --load-balance-method auto is round_robin outside P/D (srt/arg_groups/serving_hook.py
    # handle_load_balance_method; data_parallel_controller.py round_robin_scheduler)
    dp_balance = "round-robin"
    uses_chunk_size = True
    kv_policy = "paged"
    kv_block_size = 1  # page_size 1 (arg_groups/overrides.py `_page_size_default`)
    # with a prefix cache on, the engine's memory is SGLang's radix cache (engine/radix_cache.py; sglang_radix.py)
    reads_radix_cache = True
    ratio_decay, min_ratio = RATIO_DECAY, MIN_RATIO
    native_cadence = True  # a deferred round forms no prefill batch (cadence.py)
    # With nothing waiting, a decode batch that fits is followed by the same batch, the ratio one decay lower
    # (`ran_decodes`): the engine may run such batches in a row (Loop.decode_run).
    steady_while_none_waits = True
    mixed = False  # --enable-mixed-chunk
    ignore_eos: int = 0
    max_prefill_tokens: int = MAX_PREFILL_TOKENS
    max_running_requests: int = 0  # 0: the engine's, else the run's
    settings = {"ignore-eos": ("ignore_eos", "1: requests sent with ignore_eos, as prefillbench's client sends them"),
                "max-prefill": ("max_prefill_tokens", "SGLang's --max-prefill-tokens (16384)"),
                "max-running": ("max_running_requests", "SGLang's --max-running-requests")}

    def __init__(self, chunk_size: int = 256) -> None:
        super().__init__(chunk_size)
        self.reset()

    def check_settings(self) -> None:
        if self.ignore_eos not in (0, 1):
            raise ValueError(f"{self.name}:ignore-eos= is 1 (requests sent with ignore_eos) or 0")
        if self.max_prefill_tokens < 1:
            raise ValueError(f"{self.name}:max-prefill= must be at least 1")

    def reset(self) -> None:
        self.ratio = INIT_RATIO
        self.batch_is_full = False
        self.chunked: int | None = None  # chunked_req: the one prompt in progress
        self._last_ids: set[int] = set()  # the sequences of the last step: one that left made the batch shrink
        self._last_chunked = False
        self._emptied = False  # the last step was a prefill batch that left the running batch empty
        self.prefix_cache = False
        self.radix_reset()

    def attach(self, memory, engine_max_num_seqs: int | None = None, prefix_cache: bool = False) -> None:
        super().attach(memory, engine_max_num_seqs, prefix_cache)
        self.prefix_cache = prefix_cache
        self.radix = getattr(memory, "radix", None)  # SGLang's radix cache, where the engine's memory is one

    def idle(self) -> None:
        super().idle()
        # Scheduler.on_idle: fully idle, the ratio goes back to its start
        self.ratio = INIT_RATIO
        self.batch_is_full = False

    def next_step(self, waiting, running):
        if self.radix is not None:  # the chunk in progress into the tree, the running batch's order, the queue
            self.radix_sync(waiting, running)
        live = {s.seq_id for s in waiting}
        live.update(s.seq_id for s in running)
        # what the last batch's filtering does to the flag: a request that left, or the prompt in progress taken
        # out of the merged batch, shrinks it; an empty running batch resets it
        # The flag is the running batch's own (ScheduleBatch.batch_is_full). A prefill batch that left the running
        # batch empty (nothing was running, or mixed chunk took every decode into it) becomes the running batch at
        # the next merge (get_next_batch_to_run: `if running_batch.is_empty(): running_batch = last_batch`), and a
        # new batch's flag is ScheduleBatch's default, False: a NO_TOKEN met beside it does not outlive it.
        if not running or self._last_chunked or self._emptied or not self._last_ids <= live:
            self.batch_is_full = False
        chunked = next((s for s in waiting if s.seq_id == self.chunked), None)
        # a cadence (cadence.py) that defers this round: `_should_defer_prefill`, no prefill batch is formed
        step = None if self.deferred else self._prefill(waiting, running, chunked)
        if step is None:
            step = self._decode(running)
        self._last_ids = {c.seq_id for c in step.prefills}
        self._last_ids.update(d.seq_id for d in step.decodes)
        self._last_chunked = self.chunked is not None
        self._emptied = bool(step.prefills) and (bool(step.decodes) or not running)
        return step

    # ---- _get_new_batch_prefill_raw -------------------------------------------------------------------------
    def _prefill(self, waiting, running, chunked: Sequence | None) -> Step | None:
        new = [s for s in waiting if s is not chunked]
        if (self.batch_is_full or not new) and chunked is None:
            return None
        cap = (self.max_running_requests or (SPEC_MAX_RUNNING if self.speculation is not None else 0)
               or self.engine_max_num_seqs or len(waiting) + len(running))
        allocatable = cap - len(running)
        if allocatable <= 0 and chunked is None:
            self.batch_is_full = True
            return None
        if self.radix is not None:  # the radix cache's own rules (sglang_radix.py)
            size = self.chunk_size if self.budget_part is None else self.step_budget(
                ([chunked] if chunked is not None else []) + new, running if self.mixes and running else (),
                counts_decodes=self.mixes and bool(running))
            return self.radix_prefill(waiting, running, chunked, allocatable, size)
        if self.prefix_cache and len(new) <= LPM_MAX_WAITING:  # LPM: the longest cached prefix first (stable)
            new = sorted(new, key=lambda s: -s.n_cached)
        memory = self.memory
        free = memory.free_tokens if memory is not None else float("inf")
        mixed = self.mixes and bool(running)
        # chunked_prefill_size; or a budget part's (budget.py: slo), priced for the prompt in progress then the
        # queue's, beside the decodes a mixed batch carries (which the chunk's size counts)
        size = self.chunk_size if self.budget_part is None else self.step_budget(
            ([chunked] if chunked is not None else []) + new, running if mixed else (), counts_decodes=mixed)
        budget = PrefillBudget(free, running, self.ratio, self.max_prefill_tokens, size,
                               len(running) if mixed else 0, bool(self.ignore_eos))
        chunks = []
        self.chunked = None
        if chunked is not None:
            n, truncated = budget.add_chunked(chunked)
            if n > free:  # SGLang's allocation would fail past this: not reached by its own rules
                n = int(free)
            if n > 0:
                chunks.append(prefill_chunk(chunked, n))
                if truncated:
                    self.chunked = chunked.seq_id
        simulate_future = bool(self.ignore_eos) and not self.prefix_cache
        for seq in new:
            if budget.state() == OTHER:
                break
            if len(budget.admitted) >= allocatable:
                self.batch_is_full = True
                break
            n, verdict = budget.add_one(seq, simulate_future)
            if n:
                chunks.append(prefill_chunk(seq, n))
                if n < len(seq.prompt) - seq.n_prefilled:
                    self.chunked = seq.seq_id
            if verdict != CONTINUE:
                if verdict == NO_TOKEN:
                    self.batch_is_full = bool(budget.admitted) or bool(running)
                break
        if not chunks:
            return None
        decodes = ()
        if mixed:  # check_decode_mem after the prompts' KV: the decodes sit the step out where it fails
            taken = sum(len(c.tokens) for c in chunks)
            if self._decode_need(running) <= free - taken:
                # a mixed step degrades its running requests to a plain one-token decode (_handle_eagle_family);
                # without speculation they carry no drafts (a call per decode per step saved)
                decodes = decode_tokens(running)
                if self.speculation is not None:
                    decodes = tuple([cut_drafts(d, 0) for d in decodes])
        return Step(prefills=tuple(chunks), decodes=decodes, policy_values=(("new_token_ratio", self.ratio),))

    # ---- update_running_batch ----------------------------------------------------------------------------------
    def _decode(self, running) -> Step:
        if self.radix is not None:
            return self.radix_decode(running)
        memory = self.memory
        free = memory.free_tokens if memory is not None else float("inf")
        keep = list(running)
        retracted: list[Preemption] = []
        if self._decode_need(keep) > free:  # check_decode_mem: a token each, or spec's reserve
            # retract_decode: fewest outputs first, ties the longest prompt (sorted descending, popped from the end)
            order = sorted(range(len(keep)), key=lambda i: (len(keep[i].generated), -keep[i].request_prompt_len),
                           reverse=True)
            victims = set()
            while len(keep) - len(victims) > 1 and (
                    not retracted or self._decode_need([s for s in keep if s.seq_id not in victims]) > free):
                victim = keep[order.pop()]
                victims.add(victim.seq_id)
                free += memory.held_blocks(victim.seq_id) * memory.block_size
                retracted.append(Preemption(victim.seq_id, to_head=False))
            keep = [s for s in keep if s.seq_id not in victims]
            outputs = sum(len(s.generated) for s in keep)
            asked = sum(s.n_gen for s in keep)
            self.ratio = min(1.0, (outputs + RETRACT_DECODE_STEPS * len(keep)) / (asked + 1))
            self.batch_is_full = False
        else:
            self.ratio = max(self.ratio - RATIO_DECAY, MIN_RATIO)
        return Step(decodes=decode_tokens(keep), preempted=tuple(retracted),
                    policy_values=(("new_token_ratio", self.ratio),))

    def ran_decodes(self, extra: int) -> list:
        """`extra` more decode batches without retraction (the engine's decode run fits their memory): one decay each,
        as `_decode` takes it, each batch's ratio recorded as it chose it."""
        ratio, values = self.ratio, []
        for _ in range(extra):
            ratio = max(ratio - RATIO_DECAY, MIN_RATIO)
            values.append((("new_token_ratio", ratio),))
        self.ratio = ratio
        return values

    # ---- speculative decoding (--spec) --------------------------------------------------------------------------
    @property
    def algorithm(self) -> str | None:
        """--speculative-algorithm as the run launches SGLang (None: off)."""
        return None if self.speculation is None else SGLANG_ALGORITHMS[self.speculation.method]

    @property
    def mixes(self) -> bool:
        """--enable-mixed-chunk as SGLang resolves it: off with every algorithm but EAGLE and EAGLE3."""
        return self.mixed and (self.algorithm is None or self.algorithm in MIXED_CHUNK_ALGORITHMS)

    def speculation_warnings(self) -> list[str]:
        lines = []
        if self.mixed and not self.mixes:
            lines.append(f"{self.name}: mixed chunked prefill is disabled with {self.algorithm} speculative decoding "
                         "(SGLang 0.5.23, arg_groups/speculative_hook.py): every prefill batch runs without decodes")
        if self.speculation is not None and not self.max_running_requests:
            lines.append(f"{self.name}: max running requests is reset to {SPEC_MAX_RUNNING} for speculative decoding "
                         "(SGLang 0.5.23; -s {0}:max-running=N overrides it)".format(self.name))
        return lines

    def _decode_need(self, seqs) -> float:
        """KV tokens the next decode batch of `seqs` allocates (ScheduleBatch.new_tokens_required_next_decode, one-token
        pages): a token each; with speculation, each request's KV is kept `2 * alloc_len` past its committed tokens
        (allocation_sizing.get_alloc_reserve_per_decode; alloc_len = max(steps * topk, num_draft_tokens) = K + 1 as
        the run launches SGLang: topk 1, K steps, K + 1 draft tokens), so it retracts sooner. What a request holds is
        the engine's blocks, which rejected drafts leave (SGLang keeps its over-allocation: it asks less)."""
        if self.speculation is None:
            return len(seqs)
        reserve = 2 * (self.speculation.k + 1)
        memory = self.memory
        if memory is None:
            return 0
        held = memory.held_blocks
        return sum([max(0, s.n_tokens - 1 + reserve - held(s.seq_id) * memory.block_size) for s in seqs])

    def max_step_tokens(self, prompt_len: int, concurrency: int) -> int:
        # a prefill batch holds at most the budget (and, mixed, the decodes); a decode batch one token a request
        return max(1, min(prompt_len * concurrency + concurrency, self.chunk_size + concurrency))


class SglangMixed(Sglang):
    """--enable-mixed-chunk: the running decodes ride in every prefill batch, the prompt budget less their number."""

    name = "sglang-mixed"
    mixed = True


__all__ = ["Sglang", "SglangMixed"]

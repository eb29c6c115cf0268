"""SGLang 0.5.23's own HiCache (UnifiedRadixCache.init_hicache over its default tree core, with its host pool and
HybridCacheController) driven in-process on this CPU by a list of cache operations, one answer per operation: the
reference engine/hicache.py is compared with (tests/test_hicache_reference.py). Run by the python of `make sglang`'s
environment, from the repository root:

    ~/.cache/prefillbench/sglang-0.5.23/bin/python -m benchmarks.engine.sglang_hicache --runs runs.json

Input: a JSON list of runs, each {"capacity": GPU tokens, "ratio": --hicache-ratio, "policy": --hicache-write-policy,
"ops": [[op, arg, ...], ...]} and optionally "core": the tree core (SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND: "rust",
the default, or "python"). Operations, each named for the scheduler call it stands for:
- ["insert", tokens, inserted_len]: a request's checkpoint (`checkpoint_into_tree`): slots for every token allocated
  (`alloc_token_slots`: the tree evicted as the free ones fall short; answers "no room" where they cannot be, nothing
  inserted), the key inserted with `prev_prefix_len` 0 and the request's `cache_inserted_len`; the tokens the tree
  held on the GPU already are freed by the insert itself.
- ["match", tokens]: `match_prefix`; answers the GPU prefix and the host hit, and keeps the match (numbered).
- ["lock", i] / ["unlock", i]: `inc_lock_ref` / `dec_lock_ref` on match i's last GPU node.
- ["load", i]: `init_load_back` on match i (its best node and host hit); answers the tokens loaded.
- ["evict", n]: `evict` of n GPU tokens; answers the tokens freed.
- ["events"]: `check_hicache_events` (writes' and loads' acks).
Each operation's line: [its answer (None where it has none), [free GPU slots, evictable, protected, free host
slots] after it]; a run's first line is its host pool's free slots. The tree core is SGLang's default (the Rust
core, which has no Python view of its nodes): the tree is read through these answers.

Stand-ins, each for what needs CUDA; SGLang's tree, policy and controller code runs as it is:
- `pool_host.common._cuda_host_register`: the host pool's buffer is not pinned (cudaHostRegister);
- `HostKVCache.backup_from_device_all_layer_physical` / `load_to_device_per_layer_physical`: the copy kernels
  (sgl_kernel's transfer_kv_*) do nothing: no rule reads the KV bytes, only the indices the controller hands out.
The controller's streams and events are torch's CPU ones, so a copy is complete when it is submitted: every ack is
ready at the next `check_hicache_events`.

It imports nothing of prefillbench (SGLang's environment has none).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from array import array
from types import SimpleNamespace

from benchmarks.engine.sglang_reference import sglang_missing
from benchmarks.lib import cli


def _stand_ins() -> None:
    from sglang.srt.mem_cache.pool_host import base as host_base
    from sglang.srt.mem_cache.pool_host import common as host_common

    host_common._cuda_host_register = lambda *args, **kwargs: None
    host_base.HostKVCache.backup_from_device_all_layer_physical = lambda self, *args, **kwargs: None
    host_base.HostKVCache.load_to_device_per_layer_physical = lambda self, *args, **kwargs: None


class Driver:
    """One run's cache: a UnifiedRadixCache over an MHA pool on the CPU (one-token pages), HiCache attached."""

    def __init__(self, capacity: int, core: str | None = None) -> None:
        import torch
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        kv = MHATokenToKVPool(capacity, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=8, layer_num=1,
                              device="cpu", enable_memory_saver=False)
        self.alloc = TokenToKVPoolAllocator(capacity, torch.bfloat16, "cpu", kv, False)
        params = CacheInitParams(disable=False, req_to_token_pool=ReqToTokenPool(4, 1 << 12, "cpu", False),
                                 token_to_kv_pool_allocator=self.alloc, page_size=1,
                                 tree_components=(ComponentType.FULL,), tree_core_backend=core)
        self.cache = UnifiedRadixCache(params)
        self.cache.init_hicache(SimpleNamespace(file_storage_path=None), params)
        self.host = self.cache.cache_controller.mem_pool_host
        self.matches: list = []

    def key(self, tokens):
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return RadixKey(array("q", tokens))

    def state(self) -> list:
        c = self.cache
        return [self.alloc.available_size(), c.evictable_size(), c.protected_size(), self.host.available_size()]

    def run(self, op: list):
        from sglang.srt.mem_cache.base_prefix_cache import (EvictParams, InitLoadBackParams, InsertParams,
                                                            MatchPrefixParams)

        import torch

        c, name = self.cache, op[0]
        answer = None
        if name == "insert":
            tokens, inserted = op[1], op[2]
            short = len(tokens) - self.alloc.available_size()
            if short > 0:  # alloc_token_slots: evict_for_alloc, then the slots
                c.evict(EvictParams(num_tokens=short))
            value = self.alloc.alloc(len(tokens))
            if value is None:  # locked everywhere: the scheduler would not have asked; nothing inserted
                answer = "no room"
            else:
                c.insert(InsertParams(key=self.key(tokens), value=value.to(dtype=torch.int64), prev_prefix_len=0,
                                      inserted_len=inserted))
        elif name == "match":
            r = c.match_prefix(MatchPrefixParams(key=self.key(op[1])))
            self.matches.append(r)
            answer = [r.device_prefix_len, r.host_hit_length]
        elif name == "lock":
            m = self.matches[op[1]]
            m_lock = c.inc_lock_ref(m.last_device_node)
            self.locks = getattr(self, "locks", {})
            self.locks.setdefault(op[1], []).append(m_lock.to_dec_params())
        elif name == "unlock":
            c.dec_lock_ref(self.matches[op[1]].last_device_node, self.locks[op[1]].pop())
        elif name == "load":
            m = self.matches[op[1]]
            req = SimpleNamespace(rid=f"load{op[1]}", last_node=m.last_device_node, swa_host_hit_length=0,
                                  mamba_host_hit_length=0, kv=SimpleNamespace(mamba_pool_idx=None))
            loaded, _ = c.init_load_back(InitLoadBackParams(best_match_node=m.best_match_node,
                                                            host_hit_length=m.host_hit_length, req=req))
            answer = loaded
        elif name == "evict":
            answer = c.evict(EvictParams(num_tokens=op[1])).num_tokens_evicted
        elif name == "events":
            c.ready_to_load_host_cache()
            c.check_hicache_events()
        else:
            raise ValueError(f"no operation {name!r}")
        return [answer, self.state()]


def run_all(runs: list) -> list:
    from sglang.test.test_utils import published_topology

    answers = []
    for run in runs:
        # the server arguments a launch with --enable-hierarchical-cache publishes
        with published_topology(page_size=1, attention_backend="torch_native", device="cpu",
                                disable_overlap_schedule=True, enable_hierarchical_cache=True,
                                hicache_write_policy=run["policy"], hicache_ratio=run["ratio"]):
            driver = Driver(run["capacity"], run.get("core"))
            out = [driver.host.available_size()]
            for op in run["ops"]:
                out.append(driver.run(op))
            answers.append(out)
    return answers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", default=None, help="the runs' JSON file (default: standard input)")


def main(args: argparse.Namespace) -> int:
    if sglang_missing():
        return 2
    os.environ.pop("SGLANG_USE_CPU_ENGINE", None)  # else mem_cache/allocation.py imports sgl_kernel's CPU kernels
    logging.disable(logging.WARNING)
    try:
        with open(args.runs) if args.runs else sys.stdin as f:
            runs = json.load(f)
        for run in runs:
            missing = [k for k in ("capacity", "ratio", "policy", "ops") if k not in run]
            if missing:
                raise ValueError(f"a run lacks {', '.join(missing)}")
    except (OSError, ValueError, TypeError) as e:
        print(f"error: not a list of runs ({e}); see --help for their form", file=sys.stderr)
        return 2
    from sglang.test.test_utils import maybe_stub_sgl_kernel

    maybe_stub_sgl_kernel()
    _stand_ins()
    print(json.dumps(run_all(runs)))
    return 0


if __name__ == "__main__":
    cli.run(__name__)

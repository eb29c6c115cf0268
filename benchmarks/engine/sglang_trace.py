"""The trace and configuration that benchmarks/engine/sglang_steps.py hands SGLang's own scheduler (sglang_reference.py
reads them as JSON) and its presets are made of; sglang_sessions.py makes session traces of them.
"""
from __future__ import annotations

from dataclasses import dataclass

#: The token the reference's model "samples" every time (sglang_reference.NEXT_TOKEN), never an EOS
NEXT_TOKEN = 7


@dataclass(frozen=True)
class TraceRequest:
    id: int
    prompt_len: int
    output_len: int  # max_new_tokens: every request stops exactly there
    arrival_step: int  # received at the top of this scheduler iteration
    ignore_eos: bool
    tokens: tuple[int, ...] | None = None  # the prompt's tokens (None: 3, 4, ...)
    #: a session's later turn: the request it follows, and the iterations after that one finished it arrives
    follows: int | None = None
    think: int = 0


@dataclass(frozen=True)
class Config:
    chunked_prefill_size: int
    max_prefill_tokens: int
    kv_capacity_tokens: int
    max_running_requests: int
    enable_mixed_chunk: bool
    #: --prefill-decode-interval and --prefill-decode-interval-min-bs (0: off): the decode-rounds cadence
    prefill_decode_interval: int = 0
    prefill_decode_interval_min_bs: int = 0
    #: the radix cache on (SGLang's default launch, --schedule-policy lpm); off: --disable-radix-cache
    radix_cache: bool = False
    #: HiCache below it (--enable-hierarchical-cache --hicache-ratio R --hicache-write-policy P); 0: none
    hicache_ratio: float = 0.0
    hicache_write_policy: str = "write_through"

"""SGLang's prefill budget (SGLang 0.5.23, `srt/managers/schedule_policy.py` `PrefillAdder`, with
`srt/mem_cache/prefill_budget.py` `PrefillBudget`), one-token pages: the rules both SGLang strategies (the default
prefill-first launch and --enable-mixed-chunk) admit and chunk prompts by.

A batch's budget starts from the KV tokens free (`allocator.available_size()`, plus the radix cache's evictable
tokens where it runs: strategies/sglang_radix.py; else 0) and charges:
- every running request its expected future output: `min(max_new_tokens - len(output_ids), CLIP)` times
  `new_token_ratio` (1.0 for an ignore_eos request: `_get_running_request_total_token_offset`);
- the running decodes a mixed batch carries, one token each (`num_mixed_decode_tokens`);
- each request admitted to the batch its extend tokens plus a page, and (unless it was chunked) its own
  `min(max_new_tokens, CLIP)` (`_update_prefill_budget`).
`budget_state()` is NO_TOKEN once the total or current remainder is spent, OTHER once the prompt-token caps
(`max_prefill_tokens`, `chunked_prefill_size`) are, else CONTINUE. Nothing here knows of torch or HTTP.
"""
from __future__ import annotations

import math

from prefillbench.sequence import Sequence

#: SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION (schedule_policy.py): the most future tokens charged for one request
CLIP = 4096
#: --max-prefill-tokens's default (arg_groups/fields/schedule.py)
MAX_PREFILL_TOKENS = 16384
#: page_size: SGLang's default (1) where the attention backend forces none
PAGE = 1
#: IGNORE_EOS_RESERVE_TOKENS (schedule_policy.py): headroom per request in add_one_req_ignore_eos's simulation
IGNORE_EOS_RESERVE = 1

CONTINUE, NO_TOKEN, OTHER = "continue", "no_token", "other"


def future_tokens(seq: Sequence) -> int:
    """Output tokens it may still make, clipped (`max_new_tokens - len(output_ids)`)."""
    return min(max(seq.n_gen - len(seq.generated), 0), CLIP)


class PrefillBudget:
    """One batch's budget as SGLang's PrefillAdder keeps it (page_size 1)."""

    __slots__ = ("available", "total_offset", "current_offset", "rem_input", "rem_chunk", "admitted", "running",
                 "ratio", "ignore_eos", "states", "evictable")

    def __init__(self, available: float, running: list[Sequence], ratio: float, max_prefill_tokens: int,
                 chunked_prefill_size: int, mixed_decodes: int, ignore_eos: bool, evictable=None) -> None:
        self.available = available
        #: the radix cache's evictable tokens, read live (`PrefillBudget._available_and_evictable`: a prefix locked
        #: for a candidate leaves them); None: no cache (0)
        self.evictable = evictable
        self.running = running
        self.ratio = ratio
        self.ignore_eos = ignore_eos
        per_request = 1.0 if ignore_eos else ratio
        self.total_offset = mixed_decodes + sum([future_tokens(s) * per_request for s in running])
        self.current_offset = mixed_decodes
        self.rem_input = max_prefill_tokens - mixed_decodes
        self.rem_chunk = chunked_prefill_size - mixed_decodes
        self.admitted: list[Sequence] = []  # can_run_list
        self.states: list[tuple[float, int]] | None = None  # add_one_req_ignore_eos's req_states, once built

    @property
    def rem_total(self) -> float:
        if self.evictable is not None:
            return self.available + self.evictable() - self.total_offset
        return self.available - self.total_offset

    @property
    def cur_rem(self) -> float:
        if self.evictable is not None:
            return self.available + self.evictable() - self.current_offset
        return self.available - self.current_offset

    def state(self) -> str:
        """budget_state(): the verdict for the next candidate."""
        if self.rem_total <= 0 or self.cur_rem <= 0:
            return NO_TOKEN
        if self.rem_input <= 0 or self.rem_chunk <= 0:
            return OTHER
        return CONTINUE

    def _reserve(self, seq: Sequence, extend: int, max_new_reserved: int) -> None:
        self.total_offset += extend + PAGE + max_new_reserved
        self.current_offset += extend + PAGE
        self.rem_input -= extend
        self.rem_chunk -= extend
        self.admitted.append(seq)

    def add_chunked(self, seq: Sequence) -> tuple[int, bool]:
        """add_chunked_req: the request part-way through its prompt, first in the batch, always making progress
        (`PrefillBudget.available_chunk_tokens`); its tokens this step and whether more are left."""
        total = self.rem_total
        rem = min(self.rem_chunk, int(total)) if total < math.inf else self.rem_chunk
        if rem <= 0:
            rem = self.rem_chunk
        extend = len(seq.prompt) - seq.n_prefilled
        truncated = extend > rem
        n = min(extend, rem)
        self._reserve(seq, n, 0 if truncated else min(seq.n_gen, CLIP))
        return n, truncated

    def add_one(self, seq: Sequence, simulate_future: bool, prefix: int | None = None) -> tuple[int, str]:
        """add_one_req (or, `simulate_future`, add_one_req_ignore_eos: ignore_eos with the radix cache off): the
        prompt tokens it takes this step (0: not admitted) and the budget's verdict after it. `prefix`: the tokens
        the radix cache holds of it (its prompt starts there); None: from where it stands."""
        extend = len(seq.prompt) - (seq.n_prefilled if prefix is None else prefix)
        if simulate_future:
            if not self._future_fits(seq, extend):
                return 0, NO_TOKEN
        elif not extend + future_tokens(seq) + PAGE < self.rem_total:  # PrefillBudget.check_prefill
            return 0, NO_TOKEN
        if extend > self.rem_chunk:  # chunked to what the batch has left; it reserves no output
            n = self.rem_chunk // PAGE * PAGE
            if n <= 0:
                return 0, OTHER
            self._reserve(seq, n, 0)
            return n, self.state()
        self._reserve(seq, extend, min(seq.n_gen, CLIP))
        return extend, self.state()

    def _future_fits(self, seq: Sequence, extend: int) -> bool:
        """add_one_req_ignore_eos's simulation: with every request (running, admitted, this one) making its tokens
        left, shortest first, each one's finish freeing what it holds, memory never runs out."""
        paged = extend + PAGE
        if paged > min(self.cur_rem, self.rem_total):
            return False
        per_request = 1.0 if self.ignore_eos else self.ratio

        def state(s: Sequence) -> tuple[float, int] | None:
            left = s.n_gen * per_request - len(s.generated)
            return (left, s.request_prompt_len + len(s.generated)) if left > 0 else None

        states = self.states
        if states is None:
            # the batch's first candidate: it, the running requests and those admitted so far, sorted (stable)
            states = self.states = [st for st in map(state, (seq, *self.running, *self.admitted)) if st is not None]
            states.sort(key=lambda st: st[0])
        elif (new := state(seq)) is not None:
            # a later candidate joins the list kept since (add_req_state(insert_sort=True)), before the first state
            # with as many tokens left or more; with none, the scan stops on the last index and it goes in before
            # the last state, not after it, as SGLang's loop leaves `i` there
            i = 0
            for i in range(len(states)):
                if new[0] <= states[i][0]:
                    break
            states.insert(i, new)
        cur = self.cur_rem - paged
        freed = 0
        for i, (left, occupied) in enumerate(states):
            bs = len(states) - i
            if cur + freed - left * bs <= IGNORE_EOS_RESERVE * bs:
                return False
            freed += occupied
        return True


__all__ = ["CLIP", "CONTINUE", "MAX_PREFILL_TOKENS", "NO_TOKEN", "OTHER", "PrefillBudget", "future_tokens"]

"""Draft proposers for speculative decoding, and the rule that accepts drafts: what the engine runs after each step.

`NgramProposer` is vLLM's prompt lookup (vllm/v1/spec_decode/ngram_proposer.py, `NgramProposer.propose` and
`_find_longest_matched_ngram_and_propose_tokens`), transcribed: the longest n-gram (prompt_lookup_min ..
prompt_lookup_max tokens) that ends the sequence's tokens (prompt and output) and also occurs earlier, and the K
tokens that followed it. It needs only the tokens, so a real backend (torch, gguf) drafts exactly as vLLM would.
The methods that need a draft model (EAGLE heads, MTP layers, a small model) have no real drafter here: on the sim
`PlaceholderProposer` proposes K placeholder tokens and the sim's backend says which it accepts (a seeded
acceptance model), so the same engine code runs them.
"""
from __future__ import annotations

from prefillbench.sequence import Sequence
from prefillbench.speculation import REAL_METHODS, SpecConfig

#: The token a placeholder draft carries (no backend that verifies real tokens ever sees one).
PLACEHOLDER_TOKEN = 0


def longest_ngram_drafts(tokens: list[int] | tuple[int, ...], min_n: int, max_n: int, k: int,
                         max_model_len: int) -> list[int]:
    """vLLM's `_find_longest_matched_ngram_and_propose_tokens`, in plain Python (vLLM runs it under numba): KMP over
    the reversed tokens finds the longest prefix of them (a suffix of the tokens, at most max_n long) that recurs;
    among equally long matches the one found last in the reversed scan wins, which is the earliest in the tokens
    (vLLM: `if prev_lps >= longest_ngram`). The up-to-k tokens after it are the drafts; none when the match is shorter
    than min_n, the context shorter than min_n, or the model's length reached."""
    total = len(tokens)
    if total < min_n:
        return []
    k = min(k, max_model_len - total)
    if k <= 0:
        return []
    rev = tokens[::-1]
    lps = [0] * max_n
    longest = position = 0
    prev = 0
    i = 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:  # never match longer than max_n
                prev = lps[max_n - 1]
            i += 1
        elif prev:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    return list(tokens[start:start + min(k, total - start)])


class NgramProposer:
    """vLLM's n-gram (prompt lookup) drafter over a sequence's prompt and output tokens."""

    def __init__(self, spec: SpecConfig, max_model_len: int) -> None:
        self.min_n, self.max_n, self.k, self.max_model_len = spec.lookup_min, spec.lookup_max, spec.k, max_model_len

    def propose(self, seq: Sequence, k: int) -> list[int]:
        """Up to `k` drafts for `seq`'s next step (k: the config's K, or what its batch size allows)."""
        tokens = list(seq.prompt) + seq.generated[seq.earlier:]
        return longest_ngram_drafts(tokens, self.min_n, self.max_n, min(k, self.k), self.max_model_len)


class PlaceholderProposer:
    """K placeholder drafts every step: a method whose drafter the sim prices and whose acceptance it draws."""

    def __init__(self, spec: SpecConfig) -> None:
        self.k = spec.k

    def propose(self, seq: Sequence, k: int) -> list[int]:
        return [PLACEHOLDER_TOKEN] * k


def proposer_for(spec: SpecConfig, real_tokens: bool, max_model_len: int) -> NgramProposer | PlaceholderProposer:
    """The drafter a run uses: n-gram lookup over real tokens where the method is ngram and the backend's tokens are
    real; placeholders otherwise (the sim)."""
    if spec.method in REAL_METHODS and real_tokens:
        return NgramProposer(spec, max_model_len)
    return PlaceholderProposer(spec)


def accepted_tokens(drafts: tuple[int, ...], verified: tuple[int, ...]) -> list[int]:
    """Greedy verification: the longest prefix of `drafts` equal to the target's own tokens, then the target's token
    after it (the correction, or the bonus token when every draft held), so 1 .. len(drafts) + 1 tokens (vLLM's
    RejectionSampler with greedy sampling)."""
    n = 0
    for draft, target in zip(drafts, verified):
        if draft != target:
            break
        n += 1
    return list(verified[:n + 1])

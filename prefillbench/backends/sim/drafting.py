"""Speculative decoding on the sim: which drafts the target accepts, and what the drafter costs.

The sim has no real tokens, so acceptance comes from the workload: `--spec METHOD:K:accept=P`, every draft accepted
with probability P given the ones before it were, so a K-draft step accepts i tokens with the (truncated) geometric
law P^i (1 - P) for i < K and P^K for i = K. Published rates to give it (PUBLISHED). Each draw is a hash of (sequence, absolute position) with a fixed seed, not a stream: the same draft position of the
same request is accepted or not under every strategy and budget, so configurations compared on one trace meet the
same luck.

The drafter's own cost, priced by the same cost model as the target (spec sheets or measured curves):
- ngram: nothing on the GPU (a prompt lookup on the host, inside the engine's per-step host time);
- eagle, eagle3, mtp: per draft token, a forward of one layer of the target's width and kind (an MoE layer for an
  MoE target, as DeepSeek-V3's MTP module is) with its attention over the context and the LM head, for every
  sequence that drafts: K of them after each step (an EAGLE-3 head's smaller vocabulary is priced at the target's);
- draft: a draft model's own forward per draft token, Llama-3.2-1B (the usual draft of Llama 3.1; used for any
  target), K of them after each step.
Each runs on the rows of the sequences the step left decoding; the draft's KV memory is not charged.
"""
from __future__ import annotations

from dataclasses import replace

from prefillbench.backends.sim.specs import ModelSpec

ACCEPT_SEED = 0x5EED_0067
_MASK = (1 << 64) - 1

#: Published per-token acceptance rates, for --spec's accept= (docs/speculative-decoding.md uses them).
PUBLISHED: dict[str, tuple[float, str]] = {
    "deepseek-v3-mtp": (0.875, "DeepSeek-V3 technical report (arXiv 2412.19437) §5.4.3: 'the acceptance rate of the "
                               "second token prediction ranges between 85% and 90%' (MTP, one module): the middle"),
}

#: The draft model `draft` prices: Llama-3.2-1B (https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json)
DRAFT_MODEL = ModelSpec("llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256, head_dim=64, max_context=131072,
                        tied_embeddings=True, source="https://huggingface.co/meta-llama/Llama-3.2-1B config.json")


def _unit(seq_id: int, position: int) -> float:
    """A uniform draw in [0, 1) fixed by (sequence, position): splitmix64 of the pair and the seed."""
    z = (ACCEPT_SEED + 0x9E3779B97F4A7C15 * (seq_id * 1_000_003 + position + 1)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


class Acceptance:
    """Per-position conditional acceptance rates; `accepted` says how many of a decode's drafts the target keeps."""

    def __init__(self, rates: tuple[float, ...], label: str) -> None:
        if not rates or not all(0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"acceptance rates must be in [0, 1], got {rates}")
        self.rates, self.label = rates, label

    def accepted(self, seq_id: int, position: int, n_drafts: int) -> int:
        """Drafts kept of `n_drafts` fed after the token at `position`: draft j (at position + j) is kept with its
        position's rate, given the ones before it were."""
        rates, last = self.rates, self.rates[-1]
        for j in range(n_drafts):
            if _unit(seq_id, position + 1 + j) >= (rates[j] if j < len(rates) else last):
                return j
        return n_drafts

    def mean_accepted(self, k: int) -> float:
        """Expected drafts kept of k (sum over i of the chance the first i are all kept)."""
        total, kept = 0.0, 1.0
        for j in range(k):
            kept *= self.rates[j] if j < len(self.rates) else self.rates[-1]
            total += kept
        return total


def acceptance_for(spec) -> Acceptance:
    """The run's acceptance, --spec's fixed rate. ValueError (one line) where there is none (ngram)."""
    if spec.accept is None:
        raise ValueError(f"--spec {spec.label}: the sim has no real tokens to look drafts up in; give its acceptance "
                         "with a method the sim prices, e.g. eagle:3:accept=0.7")
    return Acceptance((spec.accept,), f"accept={spec.accept:g} a token")


def draft_layer(model: ModelSpec) -> ModelSpec:
    """One layer of the target's width and kind, full attention: an EAGLE head or an MTP module."""
    moe = model.n_experts > 0
    return replace(model, name=f"{model.name} draft layer", n_layers=1, windows=(),
                   dense_layers=() if moe else model.dense_layers[:1], approximations=())


def draft_model_for(method: str, model: ModelSpec) -> ModelSpec | None:
    """The model whose forward prices one draft token (None: ngram, free on the GPU)."""
    if method == "ngram":
        return None
    if method == "draft":
        return DRAFT_MODEL
    return draft_layer(model)


class SimDrafting:
    """One sim run's speculative decoding: its acceptance and its drafter's price (a cost model of the draft's
    forward, on the target's GPU, parallelism and pricing, without engine overheads: the drafter runs inside the
    step the engine already pays for)."""

    def __init__(self, spec, model: ModelSpec, cost) -> None:
        from prefillbench.backends.sim.cost import CostModel

        self.spec = spec
        self.acceptance = acceptance_for(spec)
        draft = draft_model_for(spec.method, model)
        self.drafter = None if draft is None else CostModel(draft, cost.gpu, cost.tp, 1, cost.ep, cost.pricing, None)

    def k_after(self, n_scheduled: int) -> int:
        spec = self.spec
        return spec.k_for_batch(n_scheduled) if spec.k_by_batch else spec.k

    def draft_seconds(self, rows: int, contexts: int, k: int) -> float:
        """K draft forwards of `rows` sequences whose contexts sum to `contexts` (each one token longer a forward)."""
        if self.drafter is None or not rows or not k:
            return 0.0
        price = self.drafter.fast_seconds
        return sum(price([], rows, contexts + j * rows, rows) for j in range(k))


def execute_verify(sim, step):
    """SimBackend.execute for a run with speculative decoding: a decode with drafts is priced as its 1 + K queries
    (attention as a short chunk over its context, a logit row at each) and answered with `verified` as the acceptance
    draws (the kept drafts, then a token that differs from the next draft); every sequence that emits then drafts K
    tokens for its next step at the drafter's price."""
    from prefillbench.backends.sim.placeholders import placeholder_token
    from prefillbench.step import StepResult

    held, span, drafting = sim._seq_tokens, sim._token_span, sim.drafting
    accepted = drafting.acceptance.accepted
    tokens: dict[int, int] = {}
    verified: dict[int, tuple[int, ...]] = {}
    n_emit = n_plain = ctx = 0
    verify = []
    for seq_id, _, position, drafts in step.decodes:
        end = position + 1 + len(drafts)
        sim._held += end - held.get(seq_id, 0)
        held[seq_id] = end
        if drafts:
            kept = accepted(seq_id, position, len(drafts))
            answer = drafts[:kept] + tuple(placeholder_token(seq_id, position + 1 + j, span)
                                           for j in range(kept, len(drafts) + 1))
            verified[seq_id] = answer
            tokens[seq_id] = answer[0]
            verify.append((position, 1 + len(drafts)))
            n_emit += 1 + len(drafts)
        else:
            tokens[seq_id] = placeholder_token(seq_id, position + 1, span)
            n_plain += 1
            ctx += position + 1
            n_emit += 1
    chunks, emitting = sim.hold_prefills(step, tokens)
    n_emit += emitting
    if sim._trace is None:
        seconds = sim.cost.fast_seconds(chunks, n_plain, ctx, n_emit, None, sim._idle, verify)
    else:
        cost = sim.step_cost(step, sim._idle)
        sim.trace_step(step, sim.clock, cost)
        seconds = cost.seconds
    # the drafter, after the target's pass, for every sequence that got a token (vLLM's propose_draft_token_ids)
    rows = len(tokens)
    contexts = sum(held[i] for i in tokens)
    seconds += drafting.draft_seconds(rows, contexts, drafting.k_after(len(step.prefills) + len(step.decodes)))
    return StepResult(tokens, verified=verified), seconds

"""vLLM's own steps with n-gram speculative decoding against `vllm-v1` with the same drafts, step for step.

  python -m benchmarks.server.vllm_spec_steps --rounds 20 --budget 64 --k 3 --seed 3

vllm_steps.py's comparison (the same pauses, arrival alignment and iteration log), with vLLM launched with
`--speculative-config '{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4,
"prompt_lookup_min": 2}'` on a seeded trace of prompts that repeat themselves (a phrase of a few tokens over and
over, a few tokens changed), so the prompt lookup finds drafts. A decode's scheduled tokens are its token and its
drafts, and vLLM's iteration log counts them all as generation tokens (`compute_iteration_details`).

The engine here replays vLLM's drafts exactly: an n-gram proposer is a function of a request's tokens, and vLLM
returns them (`return_token_ids`). The sim's steps are prefillbench's engine with `vllm-v1 · spec ngram:K` on a
backend whose tokens are vLLM's (`ReplayBackend`: the sim's clock, and as the target's greedy token after each fed
position the token vLLM generated there), so the engine's own NgramProposer (engine/drafts.py) proposes, the
engine's acceptance keeps, and vllm-v1 charges the budget. vLLM's last verify step of a request may carry drafts
past its max_tokens (neither its proposer nor its scheduler knows the output length) and counts their acceptance:
the tokens past the output are asked of vLLM afterwards (each request again, K more tokens, greedy; their first
tokens must equal the run's). Printed: vllm_steps' comparison, and vLLM's vllm:spec_decode_num_drafts /
num_draft_tokens / num_accepted_tokens beside the engine's counts.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from prefillbench.backends.sim.backend import SimBackend
from prefillbench.errors import BackendError
from prefillbench.sequence import Request
from prefillbench.step import StepResult

from benchmarks.lib import cli
from benchmarks.server.vllm_steps import Comparison, Round, Vllm, _stream, drive, sim_counts, sim_runs

#: vLLM's speculative-decoding counters (/metrics)
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total")
LOOKUP_MIN, LOOKUP_MAX = 2, 4


def spec_config(k: int) -> str:
    return json.dumps({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": LOOKUP_MAX,
                       "prompt_lookup_min": LOOKUP_MIN})


def repetitive_prompt(rng: random.Random, length: int) -> tuple[int, ...]:
    """A phrase of 3..12 tokens over and over to `length`, one token in 8 changed (an edit, a quoted line)."""
    phrase = [rng.randrange(3, 1000) for _ in range(rng.randint(3, 12))]
    out = [phrase[i % len(phrase)] for i in range(length)]
    for i in range(length):
        if rng.random() < 0.125:
            out[i] = rng.randrange(3, 1000)
    return tuple(out)


def make_trace(seed: int, rounds: int, max_prompt: int = 200, max_gen: int = 64) -> list[Round]:
    """Seeded rounds of 1-4 requests with repetitive prompts (16..max_prompt tokens, 4..max_gen generated), 3..24
    steps apart."""
    rng = random.Random(seed)
    return [Round([Request(repetitive_prompt(rng, rng.randint(16, max_prompt)), rng.randint(4, max_gen))
                   for _ in range(rng.randint(1, 4))], rng.randint(3, 24)) for _ in range(rounds)]


class ReplayBackend(SimBackend):
    """The sim's clock with vLLM's tokens: the target's greedy token after each fed position is the token vLLM
    generated there (`outputs`, by sequence id: the engine numbers requests in arrival order, the trace's)."""

    spec_methods = ("ngram",)
    real_tokens = True  # its tokens are a model's (vLLM's): the n-gram proposer looks drafts up in them

    def __init__(self, *args, outputs: list[tuple[int, list[int]]], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.outputs = outputs  # (prompt length, generated tokens and those past the output) per sequence

    @classmethod
    def replaying(cls, outputs: list[tuple[int, list[int]]]) -> "ReplayBackend":
        base = SimBackend.load(sim_pricing="spec")
        return cls(base.model, base.spec_gpu, pricing="spec", outputs=outputs)

    def speculate(self, spec) -> None:
        self.drafting = None  # priced as plain steps: only the step boundaries matter here

    def _token(self, seq_id: int, position: int) -> int:
        """vLLM's token after the one at `position` (-1 past what vLLM was asked for: no draft equals it)."""
        prompt_len, tokens = self.outputs[seq_id]
        i = position + 1 - prompt_len
        return tokens[i] if 0 <= i < len(tokens) else -1

    def execute(self, step, return_logits: bool = False) -> StepResult:
        plain = step.__class__(step.prefills, tuple(d._replace(drafts=()) for d in step.decodes), step.preempted)
        super().execute(plain, return_logits)  # the clock, one step on
        tokens = {c.seq_id: self._token(c.seq_id, c.end - 1) for c in step.prefills if c.is_last}
        verified = {}
        for d in step.decodes:
            tokens[d.seq_id] = self._token(d.seq_id, d.position)
            if d.drafts:
                verified[d.seq_id] = tuple(self._token(d.seq_id, d.position + j) for j in range(len(d.drafts) + 1))
        return StepResult(tokens, verified=verified)


async def extended(url: str, requests: list[Request], more: int) -> list[list[int]]:
    """Each request again with `more` tokens past its output, greedy, all at once: the tokens vLLM's last verify
    steps compared drafts with."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        outs = [[] for _ in requests]
        await asyncio.gather(*(_stream(session, url, Request(r.prompt, r.n_gen + more), ids)
                               for r, ids in zip(requests, outs)))
    return outs


@dataclass
class SpecComparison:
    steps: Comparison
    vllm: dict[str, float]  # vLLM's counters
    sim: dict[str, int]  # the engine's: drafts (verify steps), draft tokens, accepted
    tails_agree: bool  # the extension runs' first tokens equal the trace's

    @property
    def equal(self) -> bool:
        return (not self.steps.differing() and self.tails_agree
                and [self.vllm[k] for k in SPEC_COUNTERS] == [self.sim[k] for k in SPEC_COUNTERS])

    def summary(self, starts: list[int]) -> str:
        names = {SPEC_COUNTERS[0]: "drafts", SPEC_COUNTERS[1]: "draft tokens", SPEC_COUNTERS[2]: "accepted"}
        counts = "; ".join(f"{names[k]}: vLLM {self.vllm[k]:.0f}, engine {self.sim[k]}" for k in SPEC_COUNTERS)
        rate = (self.sim[SPEC_COUNTERS[2]] / self.sim[SPEC_COUNTERS[1]]) if self.sim[SPEC_COUNTERS[1]] else 0.0
        return (self.steps.summary(starts) + f"\n{counts} (acceptance {rate:.1%})"
                + ("" if self.tails_agree else "\nthe extension runs' tokens differ from the trace's: tails unknown"))


def compare(trace: list[Round], budget: int, max_num_seqs: int, k: int = 3, model: Path | None = None,
            workdir: Path | None = None, strategy: str | None = None) -> tuple[SpecComparison, list[int]]:
    """The trace on a real vLLM with n-gram drafts and on the engine replaying its tokens."""
    folder = Path(workdir or tempfile.mkdtemp(prefix="vllm-spec-steps-"))
    requests = [r for rnd in trace for r in rnd.requests]
    generated: list[list[int]] = []
    with Vllm(folder, model, budget, max_num_seqs, extra_args=("--speculative-config", spec_config(k))) as server:
        starts = asyncio.run(drive(server, trace, generated))
        server.settled_steps()
        steps = server.steps()
        counters = server.counters(SPEC_COUNTERS)
        longer = asyncio.run(extended(server.url, requests, k))
    tails_agree = all(more[:len(got)] == got for more, got in zip(longer, generated))
    outputs = [(len(r.prompt), more if tails_agree else got) for r, more, got in zip(requests, longer, generated)]
    chosen = strategy or f"vllm-v1 · spec ngram:{k}:min={LOOKUP_MIN}:max={LOOKUP_MAX}"
    record = sim_runs([r.requests for r in trace], starts, budget, max_num_seqs, chosen,
                      backend_factory=lambda: ReplayBackend.replaying(outputs))
    made = [list(r.tokens) for r in record.requests]
    if made != generated:
        raise BackendError("the engine's tokens are not vLLM's: the replay is broken")
    sim = {SPEC_COUNTERS[0]: sum(r.verify_steps for r in record.requests),
           SPEC_COUNTERS[1]: sum(r.drafted for r in record.requests),
           SPEC_COUNTERS[2]: sum(r.accepted for r in record.requests)}
    return SpecComparison(Comparison(steps, sim_counts(record)), counters, sim, tails_agree), starts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=20, help="rounds of arrivals")
    parser.add_argument("--budget", type=int, default=64, help="--max-num-batched-tokens, and the strategy's")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--model", default=None, help="a Hugging Face folder (default: a tiny random Llama)")
    parser.add_argument("--workdir", default=None, help="where the log and the tiny model go (default: a temp dir)")
    parser.add_argument("--strategy", default=None,
                        help="the engine's scheduler (default: vllm-v1 · spec ngram:K:min=2:max=4; another: the contrast)")


def main(args: argparse.Namespace) -> int:
    trace = make_trace(args.seed, args.rounds)
    try:
        result, starts = compare(trace, args.budget, args.max_num_seqs, args.k,
                                 Path(args.model) if args.model else None,
                                 Path(args.workdir) if args.workdir else None, args.strategy)
    except BackendError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{sum(len(r.requests) for r in trace)} requests in {len(trace)} rounds, budget {args.budget}, "
          f"max-num-seqs {args.max_num_seqs}, ngram K={args.k} (prompt lookup {LOOKUP_MIN}..{LOOKUP_MAX}), "
          f"seed {args.seed}")
    print(result.summary(starts))
    return 0 if result.equal else 1


if __name__ == "__main__":
    cli.run(__name__)

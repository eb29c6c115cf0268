"""The scheduling policy interface: what goes into the next forward pass."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence as Seq

from prefillbench.sequence import Sequence
from prefillbench.step import DecodeToken, PrefillChunk, Step


class Strategy(ABC):
    name: str = ""
    #: Whether `chunk_size` changes what this strategy does (it is reported only then).
    uses_chunk_size: bool = False
    #: Whether the next step depends only on which sequences wait and run and how far each prompt is. Then, after a
    #: decode-only step that changed none of that (no arrival, no finish, no prompt chunk), the next step is the same
    #: sequences' decodes, and the engine may have a backend run such steps in a row without asking again (the sim:
    #: most steps of a lightly loaded run). A strategy whose choice reads positions, time or a count of its calls
    #: must leave it False.
    steady_decodes: bool = False
    #: Whether it is steady as above only while no prompt waits, its state moving by one fixed rule each decode step
    #: it chooses (SGLang's new_token_ratio decays once a decode batch): the engine then runs decodes in a row only
    #: while nothing waits, and hands the steps it ran without asking to `ran_decodes`.
    steady_while_none_waits: bool = False
    #: Whether `chunk_size` was asked for, or is DEFAULT_BUDGET standing in for none (make_strategy): a serving
    #: engine given none runs at its own default budget, not at ours.
    budget_given: bool = True
    #: How its engine holds KV memory: "reserve", each sequence's whole length from admission (Orca's,
    #: FasterTransformer's; the engine admits only what fits that way), or "paged", blocks as tokens are computed,
    #: the strategy admitting by free blocks and preempting when a running sequence cannot grow (vLLM, SGLang).
    kv_policy: str = "reserve"
    #: Tokens a block of its engine's KV memory holds (vLLM's 16; SGLang's pages are one token).
    kv_block_size: int = 1
    #: The engine's KV memory (engine/memory.py: free blocks, blocks each sequence holds), to read; set by attach.
    memory = None
    #: Whether, with a prefix cache on, it reads the engine's memory as its engine's block cache (vllm-v1: vLLM's
    #: prefix caching, engine/block_cache.py), the memory deciding hits; else the backend's own cache decides them.
    reads_block_cache: bool = False
    #: Whether, likewise, it reads the engine's memory as SGLang's radix cache (engine/radix_cache.py: the SGLang
    #: strategies), its tree deciding hits and evictions.
    reads_radix_cache: bool = False
    #: The engine's cap on running sequences (vLLM's max_num_seqs) where the backend stands for an engine; None: none.
    engine_max_num_seqs: int | None = None
    #: Speculative decoding's settings for the run (prefillbench/speculation.py; None: off), set by make_strategy:
    #: the engine drafts by it, and an engine's rules for drafts (the budget they take, mixing turned off) read it.
    speculation = None
    #: Whether its engine drafts K tokens on a request's last steps too (vLLM's drafter knows no max_tokens: the
    #: verify step computes drafts past the output, and their acceptances are counted); else at most what is left.
    drafts_past_output: bool = False

    #: Settings -s may give after the name ('vllm-v1:threshold=512'): each one's attribute and what it is.
    settings: dict[str, tuple[str, str]] = {}
    #: Whether it chooses each step by the step's price against a target time (slo-budget): the run must hand it
    #: both through `price_with` before it starts (bench/slo_pricing.py makes them from the run's SLO and cost model).
    needs_price: bool = False

    def price_with(self, price, target_s: float) -> None:
        """The run's price of a step (a plain callable: its prompt chunks as (start, tokens, is_last) and its decodes'
        contexts -> seconds) and the step time to keep within. Called before the run by the bench layer; a strategy
        whose steps do not depend on their price (every fixed budget) ignores it."""
        if self.budget_part is not None:
            self.budget_part.price_with(price, target_s)

    #: The two parts a scheduler is composed of beside these rules (compose.py), set by make_strategy: the budget
    #: (budget.py; None: fixed, `chunk_size`) and the cadence (cadence.py; None: prompts on every step).
    budget_part = None
    cadence = None
    #: Whether the rules follow a cadence themselves (their engine's deferral, reading `deferred`); else they are
    #: offered no waiting prompt on a step the cadence defers (compose.paced).
    native_cadence: bool = False
    #: Whether the cadence defers prompts on the step being chosen (set by compose.paced before each step).
    deferred: bool = False

    def step_budget(self, order, running, counts_decodes: bool = True) -> int:
        """This step's token budget in the rules' own units: `chunk_size` where it is fixed; else the budget part's
        for these prompts (`order`, as the rules take them) beside these decodes (`running`, whose decodes the step
        carries), plus one a decode where the rules charge decodes to the budget (`counts_decodes`)."""
        part = self.budget_part
        if part is None:
            return self.chunk_size
        contexts = tuple([len(s.prompt) + len(s.generated) - s.earlier for s in running])
        return part.tokens(order, contexts, counts_decodes)

    #: What -s gave after the name, as given (configure): the spec names the configuration a server is launched with.
    given_settings: dict[str, int] = {}

    @property
    def spec(self) -> str:
        """The strategy as -s names it, its settings and parts included ('vllm-v1:threshold=512 · budget slo')."""
        rules = self.name + "".join(f":{k}={v}" for k, v in self.given_settings.items())
        if self.budget_part is None and self.cadence is None:
            return rules
        from .compose import Composition
        return Composition(rules, self.budget_part.spec if self.budget_part is not None else "fixed",
                           self.cadence.spec if self.cadence is not None else "every").spec

    def configure(self, given: dict[str, int]) -> None:
        """Set what -s gave after the name; ValueError naming the settings it takes where one is not among them."""
        self.given_settings = dict(given)
        for key, value in given.items():
            if key not in self.settings:
                takes = ", ".join(f"{k} ({what})" for k, (_, what) in self.settings.items()) or "none"
                raise ValueError(f"{self.name} has no setting {key!r}; it takes {takes}")
            setattr(self, self.settings[key][0], value)
        self.check_settings()

    def check_settings(self) -> None:
        """Refuse settings that contradict each other (ValueError)."""

    def __init__(self, chunk_size: int = 256) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk size must be at least 1, got {chunk_size}")
        self.chunk_size = chunk_size

    @abstractmethod
    def next_step(self, waiting: Seq[Sequence], running: Seq[Sequence]) -> Step:
        """Build the next step.

        `waiting` holds sequences whose prompt is not fully processed, oldest
        first; `running` holds sequences that are decoding, oldest first. The
        result must not be empty while either list is non-empty. The lists are
        the engine's own, kept between steps: read them, copy what you keep.
        """

    def max_step_tokens(self, prompt_len: int, concurrency: int) -> int:
        """An upper bound on `Step.n_tokens`, so a backend can size its buffers."""
        return prompt_len * concurrency + concurrency

    def reset(self) -> None:
        """Forget what an earlier run left behind; the engine calls it as a run starts."""

    def attach(self, memory, engine_max_num_seqs: int | None = None, prefix_cache: bool = False) -> None:
        """The run's KV memory and engine cap, to read (never to change: the engine carries a step's preemptions
        and allocations out), and whether a prefix cache runs (SGLang orders by it); the engine calls it after
        reset."""
        self.memory = memory
        self.engine_max_num_seqs = engine_max_num_seqs
        if self.cadence is not None:  # a run starts on a fresh count (reset is each rules' own)
            self.cadence.reset()

    def speculation_warnings(self) -> list[str]:
        """What its engine would warn on stderr about the run's speculative decoding (vLLM's budget advice), for the
        command to print once; none where its engine has no rule for drafts."""
        return []

    def ran_decodes(self, extra: int) -> list | None:
        """The engine ran `extra` more steps of the decode-only step this strategy just chose (a decode run, for a
        `steady_while_none_waits` strategy): move the state as choosing each of them would have, and give each one's
        policy values in order (Step.policy_values), or None where its steps carry none."""
        return None

    #: How its engine sends requests to data-parallel ranks (prefillbench/engine/dp_balance.py): vLLM's least
    #: loaded, which prefillbench takes where no engine says otherwise.
    dp_balance: str = "least-loaded"

    def dummy_step(self) -> None:
        """Its data-parallel rank had no work while the others stepped: the rank ran a dummy batch (vLLM's
        execute_dummy_batch), which its cadence counts as a step (cadence.py); nothing is chosen."""
        if self.cadence is not None:
            self.cadence.dummy_step()

    def idle(self) -> None:
        """Nothing is in flight and nothing waits: an engine's scheduler may forget what load taught it (SGLang's
        new_token_ratio goes back to its start). The engine calls it as it waits for the next arrival."""
        if self.cadence is not None:
            self.cadence.idle()


def prefill_chunk(seq: Sequence, max_tokens: int | None = None, pad_to: int | None = None) -> PrefillChunk:
    """The next piece of `seq`'s prompt, at most `max_tokens` long."""
    start = seq.n_prefilled
    end = len(seq.prompt) if max_tokens is None else min(len(seq.prompt), start + max_tokens)
    tokens = seq.prompt[start:end]
    pad = 0 if pad_to is None else pad_to - len(tokens)
    return PrefillChunk(seq.seq_id, tuple(tokens), start, end == len(seq.prompt), pad)


def whole_prompts(seqs: Seq[Sequence], pad: bool = False) -> tuple[PrefillChunk, ...]:
    """The rest of every prompt in `seqs`, in one step; `pad`: padded to the longest (a rectangular batch)."""
    longest = max((s.prompt_len - s.n_prefilled for s in seqs), default=0) if pad else None
    return tuple(prefill_chunk(s, pad_to=longest) for s in seqs)


_new_tuple = tuple.__new__


def decode_tokens(running: Seq[Sequence]) -> tuple[DecodeToken, ...]:
    # Once per decoding sequence per step: Sequence.position is inlined, and tuple.__new__ builds each DecodeToken
    # without the NamedTuple's Python-level __new__ (a third of this function's time on the sim).
    # Each carries the sequence's full drafts (speculative decoding; the engine's proposer fills `drafts` after each
    # step): a strategy that charges them to a budget may cut them (`cut_drafts`). Without speculation they are none:
    # no tuple built (tuple([]) is the empty tuple itself, so the tokens are what they were).
    return tuple([_new_tuple(DecodeToken, (s.seq_id, s.generated[-1], len(s.prompt) + len(s.generated) - s.earlier - 1,
                                           tuple(s.drafts) if s.drafts else ()))
                  for s in running])


def cut_drafts(decode: DecodeToken, n: int) -> DecodeToken:
    """`decode` with only its first `n` drafts (vLLM's spec_token_ids[:n] where the budget left is short)."""
    return decode if len(decode.drafts) <= n else decode._replace(drafts=decode.drafts[:max(n, 0)])

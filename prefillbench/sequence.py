"""A request as the scheduler sees it while it is in flight."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Handoff:
    """A prompt prefilled elsewhere (a disaggregated deployment's prefill instance) whose KV was moved here: the
    first token it produced and when (seconds after the run starts, as `arrival_s`), when the request itself
    arrived and first ran there, and the KV itself where a backend moves real state (gguf's sequence state)."""

    first_token: int
    first_token_s: float
    arrival_s: float
    first_scheduled_s: float
    instance: int = 0  # the prefill instance that computed it
    state: bytes | None = None


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    n_gen: int
    arrival_s: float | None = None  # seconds after the run starts; None: closed loop (arrives when admitted)
    #: Teacher forcing (for --verify): feed these tokens back instead of the model's own choices.
    forced_tokens: tuple[int, ...] | None = None
    #: A multi-turn session's id and this request's turn in it: turn t > 0 arrives `think_s` after turn t - 1's
    #: last token (a closed loop per session); turn 0 arrives at `arrival_s`.
    session: int | None = None
    turn: int = 0
    think_s: float = 0.0
    #: Its prompt's KV came from a prefill instance: `arrival_s` is when the KV arrived here (decode only).
    handoff: Handoff | None = None
    #: A name for the request's kind (a trace's `class` column, a `mix:` workload's class): TTFT is reported per class.
    length_class: str | None = None

    @property
    def follows(self) -> bool:
        """A session's later turn: it arrives after the turn before it, not at a time of its own."""
        return self.session is not None and self.turn > 0


class SessionTurns:
    """A run's requests as they may be sent: those with a time of their own (`first`, in their order), and every
    multi-turn session's later turns, each held until the turn before it finishes and then due its think time after
    that turn's last token (a closed loop per session). The engine's admission and a serving client both keep one."""

    __slots__ = ("first", "held")

    def __init__(self, requests: list[Request]) -> None:
        self.first = [r for r in requests if not r.follows]
        self.held = {(r.session, r.turn): r for r in requests if r.follows}

    def after(self, session: int | None, turn: int, last_token_s: float) -> Request | None:
        """The turn after (session, turn), now due: `last_token_s` is that turn's last token (or its failure) in
        seconds from the run's start; None where no turn follows."""
        follow = self.held.pop((session, turn + 1), None) if session is not None else None
        return None if follow is None else replace(follow, arrival_s=last_token_s + follow.think_s)

    def __bool__(self) -> bool:
        """Turns are still held (their turn before has not finished)."""
        return bool(self.held)


def queue_by_arrival(pending: deque[Request], request: Request) -> None:
    """`request` into `pending` (ordered by arrival), after every request that arrives no later."""
    i = len(pending)
    while i and pending[i - 1].arrival_s > request.arrival_s:
        i -= 1
    pending.insert(i, request)


@dataclass(slots=True)
class Sequence:
    seq_id: int
    prompt: tuple[int, ...]
    n_gen: int
    arrival: float
    n_prefilled: int = 0
    generated: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    first_scheduled: float | None = None  # start of the first step that carried it
    forced_tokens: tuple[int, ...] | None = None
    n_cached: int = 0  # leading prompt tokens found in the backend's prefix cache: never computed (n_prefilled starts here)
    session: int | None = None  # a multi-turn session's id, and the turn
    turn: int = 0
    kv_arrival: float | None = None  # a handed-off prompt: when its KV arrived (the clock's); None: prefilled here
    #: Generated tokens now at the end of `prompt`: a preempted sequence recomputes its output so far as prompt
    #: (vLLM's and SGLang's recompute), and `generated` keeps every token it made, so positions subtract these.
    earlier: int = 0
    preemptions: int = 0  # times its KV was freed and it went back to waiting (preempted or retracted)
    retractions: int = 0  # of those, the times it went to the queue's tail (SGLang's retraction), not its head
    recomputed: int = 0  # tokens whose KV was computed, freed by a preemption, and must be computed again
    found_again: int = 0  # of the tokens a preemption freed, those found again in the block cache on resuming
    length_class: str | None = None  # the request's class (Request.length_class), carried to its record
    #: Speculative decoding: the draft tokens proposed for its next step (the engine's proposer fills it after each
    #: step; a strategy may feed fewer), and the counts so far: draft tokens fed, of those accepted, verify steps
    #: (decode steps that carried at least one draft).
    drafts: list[int] = field(default_factory=list)
    n_drafted: int = 0
    n_accepted: int = 0
    n_verify_steps: int = 0
    n_decode_steps: int = 0  # decode steps it was in, counted only with speculation on (else one token each)

    @classmethod
    def admit(cls, seq_id: int, request: "Request", arrival: float, start: float = 0.0) -> "Sequence":
        """`arrival`: when the request may enter (the clock's); `start`: the run's start, which a handoff's times
        count from. A handed-off prompt enters prefilled, with its first token, decoding."""
        h = request.handoff
        if h is None:
            return cls(seq_id, request.prompt, request.n_gen, arrival, forced_tokens=request.forced_tokens,
                       session=request.session, turn=request.turn, length_class=request.length_class)
        return cls(seq_id, request.prompt, request.n_gen, start + h.arrival_s, len(request.prompt),
                   [h.first_token], [start + h.first_token_s], start + h.first_scheduled_s,
                   request.forced_tokens, session=request.session, turn=request.turn, kv_arrival=arrival,
                   length_class=request.length_class)

    def append_token(self, token: int, time: float) -> bool:
        """Record the next token, which is fed back on the next step; a forced token replaces the model's.
        Returns whether the sequence is finished (one call instead of two per token: the engine's hot loop)."""
        if self.forced_tokens is not None:
            token = self.forced_tokens[len(self.generated)]
        self.generated.append(token)
        self.token_times.append(time)
        return self.finished

    def preempt(self, to_head: bool = True) -> None:
        """Its KV is gone (preempted or retracted): it goes back to waiting with its output so far as prompt, every
        token computed again (the prefix cache, where on, may find some). Its first token's time stays its TTFT."""
        computed = self.n_prefilled + (max(len(self.generated) - self.earlier - 1, 0) if self.prefill_done else 0)
        self.recomputed += computed
        self.preemptions += 1
        self.retractions += not to_head
        self.prompt = self.prompt + tuple(self.generated[self.earlier:])
        self.earlier = len(self.generated)
        self.n_prefilled = self.n_cached = 0

    @property
    def request_prompt_len(self) -> int:
        """The request's own prompt, without output moved there by a preemption."""
        return len(self.prompt) - self.earlier

    @property
    def n_tokens(self) -> int:
        """Tokens in the sequence: prompt and output (vLLM's Request.num_tokens)."""
        return len(self.prompt) + len(self.generated) - self.earlier

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def prefill_done(self) -> bool:
        return self.n_prefilled >= len(self.prompt)

    @property
    def finished(self) -> bool:
        # prefill_done, written out, and second: append_token asks this once per token, and it is the
        # generated count that is short until the last one
        return len(self.generated) >= self.n_gen and self.n_prefilled >= len(self.prompt)

    @property
    def position(self) -> int:
        """Position of the next token to feed: the newest generated one."""
        return len(self.prompt) + len(self.generated) - self.earlier - 1


def tokens_of(seq: Sequence) -> tuple[int, ...]:
    """A sequence's tokens as SGLang's `origin_input_ids + output_ids` (a retracted one's prompt holds its output):
    what a prefix cache keys its KV by. Here, below the strategies and the engine, since both read it."""
    return seq.prompt + tuple(seq.generated[seq.earlier:])

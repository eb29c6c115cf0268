"""Multi-turn sessions as a workload: N sessions of T turns, every prompt the session's history plus a new message.

`--workload sessions:n=8,turns=4,system=512,message=128,answer=64,think=1` describes them: a system prompt of
`system` tokens shared by every session, each turn's new message drawn uniformly from [message/2, 3 message/2]
tokens (seeded), `answer` tokens generated a turn, `think` seconds between a turn's last token and the next
turn's arrival (a closed loop within a session), and the sessions' first turns arriving open loop (`--arrival
poisson --rate R`, R sessions a second). Turn t's prompt is the system prompt, then every earlier message and
answer of the session, then its own message: what a chat client resends. The answers in the history are seeded
tokens of the answer's length, not the model's own output, so every strategy and backend sees the same prompts
(the cost of a prompt is its length and what is cached, not which tokens). `history=0` makes agent-like calls
instead: each call the shared context and its own message, no history (one long shared context, many short
calls).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefillbench.sequence import Request

PREFIX = "sessions:"
#: Each knob and its default.
KNOBS = {"n": 8, "turns": 4, "system": 512, "message": 128, "answer": 64, "think": 1.0, "history": 1}


@dataclass(frozen=True)
class SessionSpec:
    n: int = 8  # sessions
    turns: int = 4  # turns a session
    system: int = 512  # shared system prompt, tokens
    message: int = 128  # a new message's mean length, tokens
    answer: int = 64  # tokens generated a turn
    think: float = 1.0  # seconds from a turn's last token to the next turn
    history: bool = True  # False: agent-like calls, each the shared context and its own message

    def __post_init__(self) -> None:
        for name in ("n", "turns", "answer"):
            if getattr(self, name) < 1:
                raise ValueError(f"sessions: {name} must be at least 1, got {getattr(self, name)}")
        if self.system < 0 or self.message < 1:
            raise ValueError(f"sessions: system must be 0 or more and message at least 1 token, got "
                             f"{self.system} and {self.message}")
        if not self.think >= 0:
            raise ValueError(f"sessions: think must be 0 or more seconds, got {self.think:g}")

    @classmethod
    def parse(cls, text: str) -> "SessionSpec":
        """`sessions:n=8,turns=4,...` (any subset of KNOBS; the rest their defaults)."""
        values: dict[str, object] = {}
        body = text[len(PREFIX):] if text.startswith(PREFIX) else text
        for part in filter(None, body.split(",")):
            key, eq, value = part.partition("=")
            if key not in KNOBS or not eq:
                raise ValueError(f"--workload {text}: {part!r} is not one of {', '.join(k + '=' for k in KNOBS)}")
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"--workload {text}: {key} is not a number: {value!r}") from None
            if key != "think" and not number.is_integer():
                raise ValueError(f"--workload {text}: {key} must be a whole number, got {value}")
            values[key] = bool(number) if key == "history" else (number if key == "think" else int(number))
        return cls(**values)  # type: ignore[arg-type]

    @property
    def name(self) -> str:
        kind = "sessions" if self.history else "calls"
        return f"{kind} {self.n}x{self.turns} sys{self.system}+msg{self.message}+ans{self.answer} think{self.think:g}s"

    def _message_sizes(self, seed: int) -> np.ndarray:
        """Each turn's new message length, [session, turn]: a stream of its own, the same whatever the vocabulary
        the tokens are drawn from."""
        return np.random.default_rng([seed, 5]).integers(max(1, self.message // 2), self.message * 3 // 2 + 1,
                                                         size=(self.n, self.turns))

    def lengths(self, seed: int) -> list[tuple[int, int]]:
        """(prompt, generation) of every request, session by session, turn by turn, as `requests` makes them."""
        out = []
        for sizes in self._message_sizes(seed).tolist():
            history = 0
            for size in sizes:
                out.append((self.system + history + size, self.answer))
                if self.history:
                    history += size + self.answer
        return out

    def requests(self, vocab_size: int, seed: int, arrivals: list[float]) -> list[Request]:
        """Every turn of every session; first turns at `arrivals` (one a session), the others after them."""
        if len(arrivals) != self.n:
            raise ValueError(f"{len(arrivals)} arrival times for {self.n} sessions")
        low = min(100, vocab_size // 4)
        rng = np.random.default_rng([seed, 4])

        def tokens(n: int) -> tuple[int, ...]:
            return tuple(rng.integers(low, vocab_size, size=n).tolist())

        sizes = self._message_sizes(seed)
        system = tokens(self.system)
        out = []
        for s in range(self.n):
            history: tuple[int, ...] = ()
            for t in range(self.turns):
                message = tokens(int(sizes[s, t]))
                prompt = system + history + message
                out.append(Request(prompt, self.answer, arrivals[s] if t == 0 else None, session=s, turn=t,
                                   think_s=self.think))
                if self.history:
                    history += message + tokens(self.answer)
        return out

"""A stream's events read into tokens: the server-sent events (`data: {json}` lines) an engine streams, parsed and
read by its API into a request's record (client_records.Streamed). Off the hot path: the client keeps each read's
bytes with its arrival (client_http.py), and an EventReader is fed the answer's body after the run (or, for a watch
that must see tokens during the run, as the watcher catches up).

Where the engine sends its own clock per token (llama-server's `timings_per_token`), both clocks are kept, and an
event that carries several tokens is split by the server's clock rather than counted as one long gap and a zero one
(vLLM's `bench serve` counts it as one: vllm#27485). Prompt progress events (llama-server's `return_progress`) give
when a request's prompt started, the scheduling delay's end.
"""
from __future__ import annotations

import json
import json.scanner
import math
from typing import TYPE_CHECKING, Any

from prefillbench.sequence import Request

if TYPE_CHECKING:
    from prefillbench.backends.server.client_records import Streamed


class Api:
    """How to ask one engine for a stream and read its events; `cache`: the engine's prefix cache is on (its
    reported cached tokens are kept), or off (any it reports fails the request: the run meant every prompt whole)."""

    path = ""

    def __init__(self, cache: bool = False) -> None:
        self.cache = cache

    def cached(self, n: int, s: Streamed) -> None:
        """The engine said `n` of the request's prompt tokens came from its cache."""
        if self.cache:
            s.cached_tokens = n
        elif n:
            s.error = f"{n} prompt tokens came from the server's prompt cache"

    def body(self, request: Request, model: str) -> dict[str, Any]:
        raise NotImplementedError

    def read(self, event: dict[str, Any], arrived: float, s: Streamed) -> bool:
        """Take one event into `s`; True when it is the last."""
        raise NotImplementedError


class LlamaApi(Api):
    """llama-server's native /completion: token ids in, token ids out, its clock and prompt progress."""

    path = "/completion"

    def body(self, request: Request, model: str) -> dict[str, Any]:
        return {"prompt": list(request.prompt), "n_predict": request.n_gen, "ignore_eos": True, "stream": True,
                "cache_prompt": self.cache, "timings_per_token": True, "return_progress": True, "temperature": 0.0,
                "return_tokens": True}

    def read(self, event: dict[str, Any], arrived: float, s: Streamed) -> bool:
        progress = event.get("prompt_progress")
        if progress is not None:
            # Every progress event dates the prompt's start from above: its arrival less the engine's time since that
            # start (time_ms, the same origin as the token timings). The least is the best bound: the 0% event is
            # sent just before the prompt's first batch, which on a machine with no core to spare keeps the client
            # from reading it until the batch is done (18 ms late at c=4 on 2 cores, CI); the batch's own event
            # comes with its elapsed time and is not late.
            start = arrived - progress.get("time_ms", 0.0) / 1e3
            s.first_scheduled = start if s.first_scheduled is None else min(s.first_scheduled, start)
        tokens = event.get("tokens") or []
        predicted = event.get("tokens_predicted")
        if predicted is not None:
            # Prompt progress events carry a placeholder token ([0]) with tokens_predicted 0: only the count of
            # tokens generated says which of an event's tokens are new.
            new = predicted - len(s.tokens)
            tokens = tokens[-new:] if new > 0 else []
        timings = event.get("timings") or {}
        if tokens:
            # The server's time of the last of them: prompt done plus generation so far, ms from the slot's start.
            server_now = timings.get("prompt_ms", 0.0) + timings.get("predicted_ms", 0.0) if timings else None
            previous = s.server_token_times[-1] if s.server_token_times else None
            k = len(tokens)
            for i in range(k):
                if server_now is not None and previous is not None and k > 1:
                    server_i = previous + (i + 1) / k * (server_now - previous)
                    s.token_times.append(arrived - (server_now - server_i) / 1e3)
                    s.server_token_times.append(server_i)
                else:
                    s.token_times.append(arrived)
                    if server_now is not None:
                        s.server_token_times.append(server_now)
            s.tokens.extend(int(t) for t in tokens)
        if event.get("stop"):
            self.cached(int(timings.get("cache_n", 0)), s)
            return True
        return False


class OpenAIApi(Api):
    """/v1/completions as vLLM, SGLang and TGI serve it: token ids in, a stream of chunks out, then a usage event
    (`"choices": []`, asked for with `include_usage`), then `[DONE]`.

    Tokens are counted per chunk exactly where the engine says which it carries (vLLM's `return_token_ids`: each
    chunk's `token_ids` are its delta), else one a chunk with text; the usage event's `completion_tokens` is the
    check, and tokens it counts beyond the chunks' are the last chunk's. A chunk carrying k > 1 tokens (an engine
    that ran several steps between two sends, a detokenizer holding text back) is split evenly between the previous
    event's arrival and its own: its tokens were made in that interval, and the client has no clock finer than its
    events (no engine sends its own here, as llama-server does). Stamped all at its arrival, it would count as one
    long gap and k-1 gaps of zero (vllm#27485); split, the median and the sum of the gaps are both right for tokens
    made at an even pace."""

    path = "/v1/completions"

    def body(self, request: Request, model: str) -> dict[str, Any]:
        return {"model": model, "prompt": list(request.prompt), "max_tokens": request.n_gen, "ignore_eos": True,
                "stream": True, "temperature": 0.0, "stream_options": {"include_usage": True},
                "return_token_ids": True}

    def read(self, event: dict[str, Any], arrived: float, s: Streamed) -> bool:
        for choice in event.get("choices") or []:
            ids = choice.get("token_ids")
            if ids is not None:
                tokens = list(map(int, ids))
            elif choice.get("text") is not None and (choice.get("text") or not choice.get("finish_reason")):
                tokens = [-1]
            else:
                tokens = []
            if tokens:
                _stamp(s, tokens, arrived)
        usage = event.get("usage")
        if usage and not event.get("choices"):
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:  # vLLM with --enable-prompt-tokens-details
                self.cached(int(details["cached_tokens"]), s)
            told = int(usage.get("completion_tokens", len(s.tokens)))
            if told > len(s.tokens):
                # chunks that carried several tokens without saying which: the rest are the last chunk's, spread
                # with its own over its interval
                s.tokens.extend([-1] * (told - len(s.tokens)))
                del s.token_times[len(s.token_times) - s.chunk_tokens:]
                start, end = (s.chunk_start, s.last_event_at) if s.chunk_tokens else (None, arrived)
                _spread(s, told - len(s.token_times), start, end)
            return True
        return False


def _stamp(s: Streamed, tokens: list[int], arrived: float) -> None:
    """A chunk's tokens, spread over (the previous token event, `arrived`]. The first chunk's all at its arrival:
    before it the prompt ran, and nothing tells when its tokens' steps did."""
    s.tokens.extend(tokens)
    if len(tokens) == 1:  # most chunks: one token, at the chunk's arrival
        s.token_times.append(arrived)
    else:
        _spread(s, len(tokens), s.last_event_at, arrived)
    s.chunk_start, s.chunk_tokens, s.last_event_at = s.last_event_at, len(tokens), arrived


def _spread(s: Streamed, k: int, start: float | None, end: float) -> None:
    s.token_times.extend(end if start is None else start + (i + 1) / k * (end - start) for i in range(k))


APIS: dict[str, type[Api]] = {"llama": LlamaApi, "openai": OpenAIApi}
#: json.loads less its per-call work (an encoding guessed from bytes, a decoder looked up, two Python frames and two
#: whitespace matches): the C scanner json's decoder calls, on an event's text already stripped (scan_once raises
#: StopIteration where no JSON value starts, and stops at the first value's end: the rest must be nothing)
_scan = json.scanner.make_scanner(json.JSONDecoder())


class EventReader:
    """One stream's bytes, fed as chunks with their arrival times (in order), read into its Streamed event by event.
    A line split between two chunks is read at the arrival of the chunk that completes it, when the client could
    first have read it. A request that fails here (a malformed event, the server's error, an event of another shape)
    keeps its reason; the rest of its stream is not read."""

    __slots__ = ("api", "s", "carry", "finished", "ended", "last_arrived")

    def __init__(self, api: Api, s: Streamed) -> None:
        self.api, self.s = api, s
        self.carry = b""
        self.last_arrived = 0.0
        self.finished = False  # the API's last event came
        self.ended = False  # nothing more is read: [DONE], or a failure

    def feed(self, data: bytes, arrived: float) -> None:
        if self.ended:
            return
        self.last_arrived = arrived
        if self.carry:
            data = self.carry + data
        lines = data.split(b"\n")
        self.carry = lines.pop()
        for line in lines:
            # only `data:` lines are events (SSE: blank lines end them, `:` lines are comments, `event:` names them)
            if line[:5] == b"data:" and self._line(line, arrived):
                self.ended = True
                return

    def date_by_server(self, first: int) -> None:
        """The tokens from `first` on came in one read, so share its arrival (the client was busy, or the network
        coalesced them): where the engine sends its own clock with each (llama-server), each is dated back from the
        last by that clock, as one event's several tokens are (LlamaApi.read), never before the token before it."""
        times, server = self.s.token_times, self.s.server_token_times
        if len(times) - first < 2 or len(server) != len(times):
            return
        last, last_server = times[-1], server[-1]
        floor = times[first - 1] if first else -math.inf
        for i in range(first, len(times) - 1):
            times[i] = floor = max(last - (last_server - server[i]) / 1e3, floor)

    def _line(self, line: bytes, arrived: float) -> bool:
        """One `data:` line of the stream; True where reading ends."""
        data = line[5:].strip()
        if data == b"[DONE]":
            return True
        s = self.s
        try:
            text = data.decode()
            event, end = _scan(text, 0)
            if end != len(text):
                raise ValueError("extra data")
        except (ValueError, StopIteration):
            s.error = "a malformed event in the stream"
            return True
        if not isinstance(event, dict):
            s.error = "an event in the stream that is not a JSON object"
            return True
        if "error" in event:
            s.error = f"the server's error: {str(event['error'])[:200]}"
            return True
        s.events += 1
        try:
            self.finished = self.api.read(event, arrived, s) or self.finished
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
            # a field of another shape than the API's (a server of another version): this request failed, the run
            # goes on and counts it
            s.error = f"an event the client could not read ({type(e).__name__}: {str(e)[:120]})"
            return True
        return False

    def close(self) -> None:
        """The stream is over: its last line (one with no newline after it) read, and the request's outcome checked:
        a stream that ended before the API's last event, or with fewer tokens than asked, failed."""
        s = self.s
        failed_before = s.error  # the connection's own failure (a dropped stream) is the reason kept
        if self.carry[:5] == b"data:" and not self.ended:
            self.ended = self._line(self.carry, self.last_arrived)
        self.carry = b""
        if failed_before is not None:
            s.error = failed_before
            return
        if s.error is None and not self.finished:
            s.error = "the stream ended before its last event"
        if s.error is None and len(s.tokens) < s.request.n_gen:
            s.error = f"{len(s.tokens)} of {s.request.n_gen} tokens"


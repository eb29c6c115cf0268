"""A server's run: the engine hands the requests to a backend that schedules its own steps (a serving engine) and
records when each token arrived, as it does for its own steps. There are no step records: the engine's steps are
its own; the figures (TTFT, TBT, goodput, capacity) come from the token times alone.

A request's latencies start at its scheduled time (MLPerf loadgen's rule: a client that sent it late cannot hide
the delay), or with the client's `latency_from` "sent", when it went out (vLLM's bench serve's)."""
from __future__ import annotations

from collections.abc import Callable

from strategies import Strategy

from prefillbench.backends.base import ServingBackend
from prefillbench.backends.server.client_records import clock
from prefillbench.engine.records import Progress, RequestRecord, RunRecord
from prefillbench.sequence import Request, Sequence


def serve(backend: ServingBackend, strategy: Strategy, requests: list[Request], concurrency: int,
          on_tokens: Callable[[int], None] | None, stop: Callable[[Progress], bool] | None) -> RunRecord:
    # no budget where the configuration has none (tune's baseline of vLLM, SGLang or TGI: the engine's own default)
    budget = strategy.chunk_size if strategy.uses_chunk_size and strategy.budget_given else None
    finished: list[RequestRecord] = []
    seen = 0

    def watch(run, live, pending) -> bool:
        """capacity's certain-failure rule on what the client knows so far (the token lists shared, not copied)."""
        nonlocal seen
        for s in run.done[seen:]:
            if s.error is None:
                finished.append(_record(s, run.latency_from))
        seen = len(run.done)
        return stop(Progress(run.start, clock(), finished, _live(live), pending))

    # the spec, settings included: they are launch flags (vllm-v1:threshold=N is --long-prefill-token-threshold N)
    run = backend.serve(strategy.spec, budget, requests, concurrency, on_tokens, watch if stop is not None else None)
    records = [_record(s, run.latency_from) for s in run.done]
    return RunRecord(run.start, run.end, [r for r in records if r.error is None], [], stopped=run.stopped,
                     failed=[r for r in records if r.error is not None],
                     engine_clock=run.engine_clock, engine_kv=run.engine_kv,
                     arrival_lags=[s.lag for s in run.done if not s.queued],
                     client_cpu_s=run.cpu_s, client_workers=run.workers)


def _record(s, latency_from: str = "scheduled") -> RequestRecord:
    origin = s.sent if latency_from == "sent" and s.sent is not None else s.scheduled
    return RequestRecord(len(s.request.prompt), origin, s.token_times, s.tokens, [], s.first_scheduled,
                         error=s.error, server_token_times=s.server_token_times or None,
                         cached_tokens=s.cached_tokens if s.error is None else None, session=s.request.session,
                         turn=s.request.turn, length_class=s.request.length_class)


def _live(live) -> list[Sequence]:
    out = []
    for i, s in enumerate(live):
        seq = Sequence(i, s.request.prompt, s.request.n_gen, s.scheduled, first_scheduled=s.first_scheduled)
        seq.token_times = s.token_times
        out.append(seq)
    return out

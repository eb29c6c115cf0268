"""Prefill apart from decode (DistServe, Splitwise, Mooncake, vLLM's and SGLang's P/D): P prefill instances run
the prompts, each prompt's KV crosses a link (links.py) to one of D decode instances, which decode.

It is engine loops and a transfer, not a second engine: every instance is the same `engine.run` on a backend of
its own. On the sim (virtual time) the deployment runs in two passes, exact for what it models: the prefill
instances first (a prompt's work there does not depend on decode), each prompt ending in its first token; then
each decode instance, its requests arriving when their KV does (Request.handoff: admitted prefilled, holding the
first token), and admitted as its KV cache allows (engine.admission's cap): a request whose KV has arrived
waits there for room, its KV held by the prefill instance meanwhile (that memory is not charged to the prefill
instance: DistServe's decode instances pull, and the sim's prefill pools rarely fill).

Requests go to prefill instances round-robin in arrival order, and to decode instances round-robin in the order
their KV arrives (a controller's simplest dispatch; DistServe's picks the least loaded, which needs the pools
simulated together). The record is one run: times from the deployment's start, every step tagged with its
instance (prefill instances 0..P-1, then decode P..P+D-1), every request with where it decoded and when its KV
arrived, so the row's metrics, the stall attribution (per instance) and the transfer times come from it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends.base import Backend, BackendError
from prefillbench.deploy.links import LINKS, TRANSFERS, link, transfer_seconds
from prefillbench.engine import RequestRecord, RunRecord, StepRecord
from prefillbench.sequence import Handoff, Request


@dataclass(frozen=True)
class Disaggregation:
    """`--disaggregate P:D`: P prefill and D decode instances, each pool's tensor parallelism, the link and how
    the KV crosses it."""

    prefill: int
    decode: int
    prefill_tp: int = 1
    decode_tp: int = 1
    link: str = "nvlink"
    transfer: str = "whole"

    @classmethod
    def parse(cls, text: str, prefill_tp: int = 1, decode_tp: int = 1, link: str = "nvlink",
              transfer: str = "whole") -> "Disaggregation":
        p, sep, d = text.partition(":")
        try:
            spec = cls(int(p), int(d), prefill_tp, decode_tp, link, transfer)
        except ValueError:
            raise ValueError(f"--disaggregate takes P:D, prefill and decode instances (e.g. 1:1), not {text!r}") from None
        if not sep:
            raise ValueError(f"--disaggregate takes P:D, prefill and decode instances (e.g. 1:1), not {text!r}")
        spec.validate()
        return spec

    def validate(self) -> None:
        if self.prefill < 1 or self.decode < 1:
            raise ValueError(f"--disaggregate needs at least one instance of each pool, got {self.prefill}:{self.decode}")
        if self.prefill_tp < 1 or self.decode_tp < 1:
            raise ValueError("a pool's tensor parallelism must be at least 1")
        if self.link not in LINKS:
            raise ValueError(f"unknown KV link {self.link!r}: one of {', '.join(LINKS)}")
        if self.transfer not in TRANSFERS:
            raise ValueError(f"unknown KV transfer {self.transfer!r}: one of {', '.join(TRANSFERS)}")

    @property
    def gpus(self) -> int:
        return self.prefill * self.prefill_tp + self.decode * self.decode_tp

    @property
    def label(self) -> str:
        """'P:D 1:1', or with the pools' TP where any is above 1: 'P:D 2xTP2:4xTP1'."""
        if self.prefill_tp == self.decode_tp == 1:
            return f"P:D {self.prefill}:{self.decode}"
        return f"P:D {self.prefill}xTP{self.prefill_tp}:{self.decode}xTP{self.decode_tp}"


class SimDeployment:
    """A disaggregated deployment of sim instances: the pools, built once from one sim backend, and `run`."""

    def __init__(self, lead: Backend, spec: Disaggregation) -> None:
        if not hasattr(lead, "instance"):
            raise ValueError(f"--disaggregate runs on the sim and on gguf, not on the {lead.name} backend")
        if getattr(lead, "pp", 1) > 1:
            raise ValueError("--disaggregate with --pp: a pool's instances are tensor parallel only")
        self.spec = spec
        self.lead = lead
        self.prefill = [lead.instance(spec.prefill_tp) for _ in range(spec.prefill)]
        self.decode = [lead.instance(spec.decode_tp) for _ in range(spec.decode)]
        self.link = link(spec.link, lead.gpu.name)
        self.kv_bytes_per_token = lead.model.kv_bytes_per_token
        self.layers = lead.model.n_layers

    def metadata(self) -> dict:
        s = self.spec
        return {"deployment": s.label, "deployment_gpus": s.gpus, "kv_link": s.link, "kv_transfer": s.transfer,
                "kv_link_source": self.link.source, "deployment_dispatch": "round-robin: prefill by arrival, "
                "decode by KV arrival"}

    def transfer_s(self, prompt_len: int, last: StepRecord, first_scheduled: float) -> float:
        """The KV's transfer after the prompt's last step `last` (its chunk: at most the step's prompt tokens)."""
        s = self.spec
        chunk = min(prompt_len, sum(n for _, n in last.prefill_chunks) or prompt_len)
        return transfer_seconds(self.kv_bytes_per_token * prompt_len, self.link, min(s.prefill_tp, s.decode_tp),
                                self.layers, s.transfer, last.seconds, chunk / prompt_len, last.end - first_scheduled)

    def run(self, strategy: str, chunk_size: int | None, requests: list[Request], concurrency: int,
            on_tokens: Callable[[int], None] | None = None, keep_logits: bool = False) -> RunRecord:
        """Every request through a prefill instance, its KV's transfer and a decode instance; one record (the sim
        computes no logits: `keep_logits` is refused by its instances)."""
        if keep_logits:
            raise BackendError("the sim backend has no logits: it never runs the model")
        check_requests(requests)
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
        P = len(self.prefill)
        steps: list[StepRecord] = []
        handed: dict[int, Request] = {}
        done: dict[int, RequestRecord] = {}
        end = 0.0
        for k, backend in enumerate(self.prefill):
            mine = order[k::P]
            first = [prompt_part(requests[i]) for i in mine]
            run = engine.run(backend, make_strategy(strategy, chunk_size), first, concurrency, on_tokens=on_tokens)
            t0 = run.start
            last_step = {s.end: s for s in run.steps}  # a prompt's last step, by when it ended
            steps += [_shifted(s, t0, k) for s in run.steps]
            end = max(end, run.end - t0)
            for i, rec in zip(mine, run.requests):
                first_s = rec.token_times[0] - t0
                if requests[i].n_gen <= 1:
                    done[i] = _shifted_request(rec, t0, k)
                    continue
                kv_s = first_s + self.transfer_s(rec.prompt_len, last_step[rec.token_times[0]], rec.first_scheduled)
                handed[i] = replace(requests[i], arrival_s=kv_s, handoff=Handoff(
                    rec.tokens[0], first_s, rec.arrival - t0, rec.first_scheduled - t0, k))
        by_kv = sorted(handed, key=lambda i: handed[i].arrival_s)
        D = len(self.decode)
        for j, backend in enumerate(self.decode):
            mine = by_kv[j::D]
            if not mine:
                continue
            run = engine.run(backend, make_strategy(strategy, chunk_size), [handed[i] for i in mine], concurrency,
                             on_tokens=on_tokens)
            t0 = run.start
            steps += [_shifted(s, t0, P + j) for s in run.steps]
            end = max(end, run.end - t0)
            # the decode run's records are in its admission order: by KV arrival, as `mine` is
            for i, rec in zip(mine, run.requests):
                done[i] = _shifted_request(rec, t0, P + j)
        steps.sort(key=lambda s: s.start)
        return RunRecord(0.0, end, [done[i] for i in range(len(requests)) if i in done], steps)


def check_requests(requests: list[Request]) -> None:
    """What a deployment runs: an open loop (a closed loop's next request waits on a decode, across the pools) of
    independent requests (a session's next turn waits on its decode too)."""
    if any(r.arrival_s is None for r in requests):
        raise ValueError("--disaggregate runs an open loop: give --arrival poisson (or gamma) and --rate, "
                         "or a workload with arrival times")
    if any(r.session is not None for r in requests):
        raise ValueError("--disaggregate runs no multi-turn sessions (a turn's next waits on its decode)")


def prompt_part(request: Request) -> Request:
    """What a prefill instance runs of a request: its prompt, ending in its first token (forced, if it is)."""
    forced = request.forced_tokens
    return replace(request, n_gen=1, forced_tokens=None if forced is None else forced[:1])


def _shifted(step: StepRecord, t0: float, instance: int) -> StepRecord:
    return replace(step, start=step.start - t0, end=step.end - t0, instance=instance)


def _shifted_request(rec: RequestRecord, t0: float, instance: int) -> RequestRecord:
    return replace(rec, arrival=rec.arrival - t0, token_times=[t - t0 for t in rec.token_times],
                   first_scheduled=None if rec.first_scheduled is None else rec.first_scheduled - t0,
                   kv_arrival=None if rec.kv_arrival is None else rec.kv_arrival - t0, instance=instance)

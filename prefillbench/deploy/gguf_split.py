"""Prefill apart from decode for real, on llama.cpp: a prefill instance in a process of its own and a decode
instance here, each a llama.cpp context on one thread (this machine's two cores, one each), each prompt's KV
moved between them with llama.cpp's sequence state copy (backends/gguf_state.py) through a pipe.

Both are `engine.run` on a GGUFBackend. The prefill process runs the prompts (each ending in its first token; its
backend's handoff_sink exports the prompt's state inside its last step, sent as the step comes out); the decode instance's
run takes each prompt as it comes (engine.admission's Feed: arrived when received, admitted prefilled with its
first token), imports its state between its steps, and decodes. Both clocks are perf_counter's, one monotonic clock
for every process of the machine, and both runs start at one agreed instant, so the record is one timeline: steps
tagged 0 (prefill) and 1 (decode), every request with its arrival and first step from the prefill process and its
tokens after the first from here. The transfer per request (export, pipe, wait for the decode loop's next pass,
import) is the KV's arrival here less the first token's time there.

P:D 1:1 only: two cores hold two one-thread instances.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from time import perf_counter

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends.base import Backend, BackendError
from prefillbench.deploy.disaggregated import check_requests, prompt_part
from prefillbench.engine import RunRecord
from prefillbench.sequence import Handoff, Request

#: Seconds between agreeing on the start and starting: both processes are ready and waiting by then.
START_LEAD_S = 0.2
#: Seconds to wait for the prefill process to load its model, or to hand back its record after the decodes end.
CHILD_TIMEOUT_S = 120.0


def _wait_until(start: float) -> None:
    """Sleep until perf_counter reaches `start` (both processes start their runs at that instant)."""
    while perf_counter() < start:
        time.sleep(min(start - perf_counter(), 0.01))


def _load(options: dict):
    from prefillbench.backends.gguf import GGUFBackend

    return GGUFBackend.load(**options)


def _prefill_process(conn, options: dict) -> None:
    """The prefill instance: load the model, then run what the parent sends until it says close."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent takes Ctrl-C, and ends this process
    try:
        backend = _load(options)
    except Exception as e:  # noqa: BLE001 - whatever it is, the parent says it in one line
        conn.send(("error", f"the prefill process could not load the model: {e}"))
        return
    conn.send(("ready",))
    # Each prompt's state is exported inside its last step (the step pays for the copy) and sent once the step
    # has come out: its first token's time is the step's end, and the transfer starts there.
    exported: list[tuple[int, int, bytes]] = []
    backend.handoff_sink = lambda seq_id, token, state: exported.append((seq_id, token, state))
    step_launch = backend.launch

    def launch(step, return_logits=False):
        launched = step_launch(step, return_logits)
        for seq_id, token, state in exported:
            conn.send(("kv", seq_id, token, state, perf_counter()))
        exported.clear()
        return launched

    backend.launch = launch
    while True:
        message = conn.recv()
        if message[0] == "close":
            backend.close()
            return
        _, requests, strategy, chunk, concurrency, start, keep_logits = message
        try:
            _wait_until(start)
            run = engine.run(backend, make_strategy(strategy, chunk), requests, concurrency, keep_logits=keep_logits)
            conn.send(("done", run, backend.metadata()))
        except Exception as e:  # noqa: BLE001
            conn.send(("error", f"the prefill instance failed: {e}"))


class PipeFeed:
    """The decode run's feed (engine.admission.Feed): the prefill process's handed-off prompts as they come."""

    def __init__(self, conn, requests: list[Request], process) -> None:
        self.conn, self.requests, self.process = conn, requests, process
        self.left = sum(r.n_gen > 1 for r in requests)  # a one-token request ends on the prefill instance
        self.order: list[int] = []  # the requests in the order they came (the decode run's admission order)
        self.prefill_run: RunRecord | None = None
        self.prefill_meta: dict = {}

    def poll(self, start: float) -> list[Request]:
        came = []
        while self.conn.poll():
            message = self._recv()
            if message[0] == "kv":
                _, seq_id, token, state, sent = message
                req = self.requests[seq_id]
                if req.n_gen <= 1:
                    continue
                now = perf_counter()
                if req.forced_tokens is not None:  # teacher forcing (--verify): the prefill run fed its forced token
                    token = req.forced_tokens[0]
                came.append(replace(req, arrival_s=now - start, handoff=Handoff(
                    token, sent - start, req.arrival_s, sent - start, 0, state)))
                self.order.append(seq_id)
                self.left -= 1
        return came

    def wait(self, timeout: float | None) -> None:
        if not self.conn.poll(CHILD_TIMEOUT_S if timeout is None else timeout) and timeout is None:
            raise BackendError(f"the prefill process sent nothing for {CHILD_TIMEOUT_S:g} s")

    def _recv(self):
        try:
            message = self.conn.recv()
        except EOFError:
            raise BackendError(f"the prefill process ended (exit code {self.process.exitcode})") from None
        if message[0] == "error":
            raise BackendError(message[1])
        if message[0] == "done":
            self.prefill_run, self.prefill_meta = message[1], message[2]
        return message

    def finish(self) -> RunRecord:
        """The prefill run's record, once the prefill process has sent it."""
        while self.prefill_run is None:
            if not self.conn.poll(CHILD_TIMEOUT_S):
                raise BackendError(f"the prefill process did not end its run within {CHILD_TIMEOUT_S:g} s")
            self._recv()
        return self.prefill_run


class GGUFDeployment:
    """P:D 1:1 on llama.cpp: the prefill process and the decode instance, started once and reused by every run."""

    def __init__(self, lead: Backend, spec) -> None:
        if (spec.prefill, spec.decode) != (1, 1):
            raise ValueError(f"--disaggregate {spec.prefill}:{spec.decode} on gguf: 1:1 only (one thread an instance "
                             "on two cores)")
        if spec.prefill_tp != 1 or spec.decode_tp != 1 or spec.link != "nvlink" or spec.transfer != "whole":
            raise ValueError("--prefill-tp, --decode-tp, --kv-link and --kv-transfer are the sim's: on gguf the KV "
                             "moves through a pipe, whole")
        if lead.prefix.on:
            raise ValueError("--disaggregate on gguf runs without the prefix cache: give --prefix-cache off")
        self.spec = spec
        self.options = dict(model=str(lead.path), threads=1, n_ubatch=lead.n_ubatch_request, kv_type=lead.kv_type,
                            flash_attn=lead.flash_attn, n_gpu_layers=lead.n_gpu_layers)
        self.decode = _load(self.options)
        self.reference = self.decode  # one engine like the instances (one thread), for --verify
        context = mp.get_context("spawn")  # a fresh interpreter: no llama.cpp threads forked mid-use
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_prefill_process, args=(child, self.options), daemon=True,
                                       name="prefillbench-prefill")
        self.process.start()
        child.close()
        if not self.conn.poll(CHILD_TIMEOUT_S):
            self.close()
            raise BackendError(f"the prefill process was not ready within {CHILD_TIMEOUT_S:g} s")
        message = self.conn.recv()
        if message[0] != "ready":
            self.close()
            raise BackendError(message[1])
        self.prefill_meta: dict = {}

    def metadata(self) -> dict:
        return {"deployment": self.spec.label, "kv_link": "pipe between two processes",
                "kv_transfer": "whole (llama.cpp sequence state)", "deployment_threads": "1 prefill + 1 decode",
                **{f"prefill_{k}": v for k, v in self.prefill_meta.items() if k.startswith("handoff")},
                **{f"decode_{k}": v for k, v in self.decode.metadata().items() if k.startswith("handoff")}}

    def run(self, strategy: str, chunk_size: int | None, requests: list[Request], concurrency: int,
            on_tokens: Callable[[int], None] | None = None, keep_logits: bool = False) -> RunRecord:
        """The requests through both instances; `keep_logits`: every emitted position's, the first token's from the
        prefill instance and the rest from the decode instance (--verify)."""
        check_requests(requests)
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
        ordered = [requests[i] for i in order]  # the prefill run admits them so: its seq_id is the position here
        first = [prompt_part(r) for r in ordered]
        start = perf_counter() + START_LEAD_S
        try:
            self.conn.send(("run", first, strategy, chunk_size, concurrency, start, keep_logits))
        except OSError:  # a broken pipe: the process is gone
            raise BackendError(f"the prefill process ended (exit code {self.process.exitcode})") from None
        feed = PipeFeed(self.conn, ordered, self.process)
        _wait_until(start)
        decoding = [r for r in ordered if r.n_gen > 1]
        decoded = (engine.run(self.decode, make_strategy(strategy, chunk_size), decoding, concurrency,
                              keep_logits=keep_logits, on_tokens=on_tokens, feed=feed) if decoding else None)
        prefilled = feed.finish()
        self.prefill_meta = feed.prefill_meta
        return _merged(prefilled, decoded, feed.order, order)

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(("close",))
            except (BrokenPipeError, OSError):
                pass
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.conn.close()
        self.decode.close()


def _merged(prefilled: RunRecord, decoded: RunRecord | None, fed: list[int], order: list[int]) -> RunRecord:
    """One record: the prefill run's first tokens, arrivals and first steps, the decode run's later tokens, in the
    requests' own order; steps tagged by instance (0 prefill, 1 decode)."""
    records = dict(enumerate(prefilled.requests))  # by position in the prefill run's admission order: by arrival
    if decoded is not None:
        for k, rec in zip(fed, decoded.requests):
            head = prefilled.requests[k]
            records[k] = replace(rec, arrival=head.arrival, first_scheduled=head.first_scheduled,
                                 token_times=[head.token_times[0], *rec.token_times[1:]], instance=1,
                                 logits=[*head.logits, *rec.logits])
    steps = prefilled.steps + [replace(s, instance=1) for s in (decoded.steps if decoded else [])]
    steps.sort(key=lambda s: s.start)
    start = min(prefilled.start, decoded.start if decoded else math.inf)
    end = max(prefilled.end, decoded.end if decoded else -math.inf)
    # order[k]: the request at position k; sorting the positions by it gives the requests' own order
    return RunRecord(start, end, [records[k] for k in sorted(records, key=order.__getitem__)], steps)

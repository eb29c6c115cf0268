"""llama-server's own steps against the `llama-server` strategy on the sim, step for step, on one seeded trace.

  python -m benchmarks.server.llama_steps --requests 40 --slots 6 --budget 32 --seed 0

llama.cpp's server (built by `make server`) is launched on the shipped model with prefillbench's preset flags
(`--slot-prompt-similarity 0`, `--cache-ram 0`, `-np` slots, `-b` the budget) and its debug log on (`-v`). Its
main loop is one thread: tasks are taken into slots (`processing task`, with the slot's id) between two
`update_slots` calls, and each `update_slots` logs, in slot order, each decoding slot (`slot decode token`) and
each slot whose prompt goes into the batch (`main/do_checkpoint ..., pos_max` = the tokens of it already in the
cache, less one) before its `llama_decode` (`decode: n_batch (effective)`). So the log alone gives every step's
prompt chunks (start, length: up to where the same prompt's next chunk starts, or its end, `task.n_tokens`), its
decodes, and the step at which each request was first in a slot: arrival alignment is exact without pausing
anything; the client just sends a seeded open-loop trace.

The sim then gets the same requests (prompt and generation lengths from the log, in the order they took slots)
arriving at the same step boundaries (as benchmarks.server.vllm_steps places them) and prefillbench's engine runs
them on `--backend sim` with the strategy at the same budget and `-c` = the slots. Steps are compared as the ordered
prompt chunks (start, length) and the number of decodes: the chunks' order is the slot order, which is where
llama-server differs from `sarathi-serve`.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from prefillbench.backends.server.process import ServerProcess, free_port
from prefillbench.errors import BackendError
from prefillbench.sequence import Request

from benchmarks.lib import cli
from benchmarks.server.vllm_steps import sim_runs

LAUNCH = re.compile(r"launch_slot_: id +(\d+) \| task (\d+) \| processing task")
NEW_PROMPT = re.compile(r"id +(\d+) \| task (\d+) \| new prompt, .*task\.n_tokens = (\d+)")
DECODE_TOKEN = re.compile(r"id +(\d+) \| task (\d+) \| slot decode token")
CHUNK = re.compile(r"id +(\d+) \| task (\d+) \| main/do_checkpoint = \w+, pos_min = -?\d+, pos_max = (-?\d+)")
BATCH = re.compile(r"decode: n_batch \(effective\) = \d+, off = (\d+)")
RELEASE = re.compile(r"id +(\d+) \| task (\d+) \| stop processing: n_tokens = (\d+)")


@dataclass
class Layout:
    """One step: its prompt chunks (task, start) in batch order, with lengths filled in later, and its decodes."""

    chunks: list[list[int]] = field(default_factory=list)  # [task, start, length]
    decodes: list[int] = field(default_factory=list)

    def key(self) -> tuple:
        return tuple((start, length) for _, start, length in self.chunks), len(self.decodes)


@dataclass
class ServerRun:
    steps: list[Layout]
    tasks: list[int]  # in the order they took slots
    arrival_step: dict[int, int]
    prompt_len: dict[int, int]
    n_gen: dict[int, int]


def parse_log(log: str) -> ServerRun:
    steps, current = [], Layout()
    tasks, arrival, prompt_len, n_gen = [], {}, {}, {}
    for line in log.splitlines():
        for m in LAUNCH.finditer(line):
            task = int(m.group(2))
            tasks.append(task)
            arrival[task] = len(steps)
        for m in NEW_PROMPT.finditer(line):
            prompt_len[int(m.group(2))] = int(m.group(3))
        for m in DECODE_TOKEN.finditer(line):
            current.decodes.append(int(m.group(2)))
        for m in CHUNK.finditer(line):
            current.chunks.append([int(m.group(2)), int(m.group(3)) + 1, 0])
        for m in RELEASE.finditer(line):
            task = int(m.group(2))
            n_gen[task] = int(m.group(3)) - prompt_len[task] + 1  # the cache holds all but the last token
        for m in BATCH.finditer(line):
            if int(m.group(1)) != 0:
                raise BackendError("llama-server split a batch into several decodes (more decodes than -b)")
            steps.append(current)
            current = Layout()
    # a chunk runs up to where the same prompt's next chunk starts, or to the prompt's end
    next_start: dict[int, int] = {}
    for step in reversed(steps):
        for chunk in reversed(step.chunks):
            task, start, _ = chunk
            chunk[2] = next_start.get(task, prompt_len[task]) - start
            next_start[task] = start
    return ServerRun(steps, tasks, arrival, prompt_len, n_gen)


def make_trace(seed: int, n: int, rate: float, max_prompt: int = 200, max_gen: int = 40) -> list[tuple[float, Request]]:
    """Seeded open-loop arrivals (exponential gaps at `rate` per second), prompts 4..max_prompt, 1..max_gen out."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append((t, Request(tuple(rng.randrange(100, 20000) for _ in range(rng.randint(4, max_prompt))),
                               rng.randint(1, max_gen))))
    return out


async def _send(session, url: str, at: float, request: Request) -> int:
    await asyncio.sleep(at)
    body = {"prompt": list(request.prompt), "n_predict": request.n_gen, "ignore_eos": True, "cache_prompt": False,
            "temperature": 0.0}
    async with session.post(url + "/completion", json=body) as response:
        if response.status != 200:
            raise BackendError(f"llama-server answered HTTP {response.status}")
        return (await response.json())["tokens_predicted"]


async def _drive(url: str, trace: list[tuple[float, Request]]) -> list[int]:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        return await asyncio.gather(*[_send(session, url, t, r) for t, r in trace])


def run_server(trace, slots: int, budget: int, workdir: Path, threads: int = 1) -> ServerRun:
    from prefillbench.backends.server.build import llama_tool
    from prefillbench.models import default_model_path

    port = free_port()
    longest = max(len(r.prompt) + r.n_gen for _, r in trace)
    argv = [str(llama_tool("llama-server")), "-m", default_model_path(), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-c", str(slots * (longest + 16)), "-t", str(threads), "--poll", "0", "--no-webui",
            "--cache-ram", "0", "--slot-prompt-similarity", "0", "--no-warmup", "-b", str(budget), "-v"]
    server = ServerProcess(argv, f"http://127.0.0.1:{port}/health", log_dir=workdir)
    server.start()
    try:
        got = asyncio.run(_drive(f"http://127.0.0.1:{port}", trace))
    finally:
        server.stop()
    if got != [r.n_gen for _, r in trace]:
        raise BackendError(f"llama-server generated {got}, asked {[r.n_gen for _, r in trace]}")
    return parse_log(server.log_path.read_text(errors="replace"))


def sim_layouts(run: ServerRun, budget: int, slots: int, strategy: str = "llama-server") -> list[tuple]:
    """The server's requests, in the order they took slots, on the sim, each arriving at its step."""
    rounds: list[list[Request]] = []
    starts: list[int] = []
    for task in run.tasks:  # consecutive tasks that took slots before the same step arrive together
        request = Request(tuple(range(run.prompt_len[task])), run.n_gen[task])
        if starts and starts[-1] == run.arrival_step[task]:
            rounds[-1].append(request)
        else:
            rounds.append([request])
            starts.append(run.arrival_step[task])
    record = sim_runs(rounds, starts, budget, slots, strategy)
    return [(tuple(map(tuple, s.prefill_chunks)), len(s.decode_contexts)) for s in record.steps]


def differing(server: list[tuple], sim: list[tuple]) -> list[tuple[int, tuple | None, tuple | None]]:
    n = max(len(server), len(sim))
    pad = lambda steps: list(steps) + [None] * (n - len(steps))
    return [(i, a, b) for i, (a, b) in enumerate(zip(pad(server), pad(sim))) if a != b]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rate", type=float, default=6.0, help="arrivals per second")
    parser.add_argument("--slots", type=int, default=6, help="-np, and the sim's -c")
    parser.add_argument("--budget", type=int, default=32, help="-b, and the strategy's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategy", default="llama-server", help="the sim's strategy (sarathi-serve: the contrast)")
    parser.add_argument("--workdir", default=None)


def main(args: argparse.Namespace) -> int:
    trace = make_trace(args.seed, args.requests, args.rate)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="llama-steps-"))
    try:
        run = run_server(trace, args.slots, args.budget, workdir)
    except BackendError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    server = [s.key() for s in run.steps]
    sim = sim_layouts(run, args.budget, args.slots, args.strategy)
    bad = differing(server, sim)
    print(f"{args.requests} requests, -np {args.slots}, -b {args.budget}, seed {args.seed}, sim strategy {args.strategy}")
    print(f"steps compared: {max(len(server), len(sim))} (llama-server ran {len(server)}, the sim {len(sim)}); "
          f"steps equal: {max(len(server), len(sim)) - len(bad)}; steps with two or more prompt chunks: "
          f"{sum(1 for chunks, _ in server if len(chunks) > 1)}; most decodes in a step: "
          f"{max((d for _, d in server), default=0)}")
    for i, a, b in bad[:20]:
        print(f"  step {i}: llama-server {a}  sim {b}")
    return 0 if not bad else 1


if __name__ == "__main__":
    cli.run(__name__)

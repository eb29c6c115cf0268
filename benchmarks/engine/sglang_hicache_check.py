"""SGLang 0.5.23's own HiCache against prefillbench's (engine/hicache.py HiRadixCache), operation for operation, on
seeded random runs of cache operations, each write policy:

    python -m benchmarks.engine.sglang_hicache_check                 # 3 seeds x 3 write policies, 400 operations each
    python -m benchmarks.engine.sglang_hicache_check --seeds 1 2 --ops 1000

One side is SGLang's cache itself (benchmarks/engine/sglang_hicache.py, run by the python of `make sglang`'s
environment: UnifiedRadixCache with init_hicache, its host pool and cache controller, stand-ins only for the CUDA copy
kernels and pinned memory). The other replays the same operations on HiRadixCache. Compared after every operation:
its answer (a match's GPU prefix and host hit, the tokens a load brought back, the tokens an eviction freed, whether an
insert found room) and the free GPU slots, the evictable and protected tokens and the free host slots. A table of
runs and equal operations is printed; on a mismatch the first differing operation is named with both sides and the
exit is 1.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

from tabulate import tabulate

from prefillbench.engine.hicache import WRITE_POLICIES, HiRadixCache

from benchmarks.lib import cli

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "benchmarks.engine.sglang_hicache"
#: a GPU pool small enough that inserts evict, a host pool (SGLang's --hicache-ratio) small enough that writes do
CAPACITY, RATIO = 48, 1.5


def random_run(seed: int, n: int, policy: str) -> dict:
    """Inserts of token runs sharing prefixes (a few stems, branching), lookups, locks on what they matched (unlocked
    later), loads of a lookup's host hit, evictions, and the scheduler's event polls."""
    rng = random.Random(seed)
    stems = [tuple(rng.randint(1, 9) for _ in range(rng.randint(10, 24))) for _ in range(6)]
    ops, matches, locked = [], 0, []
    for _ in range(n):
        stem = rng.choice(stems)
        tokens = list(stem[:rng.randint(len(stem) // 2, len(stem))]) + [rng.randint(1, 9)
                                                                          for _ in range(rng.choice((0, 0, 3, 8)))]
        r = rng.random()
        if r < 0.3 and tokens:
            ops.append(["insert", tokens, rng.choice((0, 0, 0, rng.randint(0, len(tokens))))])
        elif r < 0.55:
            ops.append(["match", tokens])
            matches += 1
            if rng.random() < 0.3:
                ops.append(["lock", matches - 1])
                locked.append(matches - 1)
            elif rng.random() < 0.5:
                ops.append(["load", matches - 1])
        elif r < 0.65 and locked:
            ops.append(["unlock", locked.pop(rng.randrange(len(locked)))])
        elif r < 0.85:
            ops.append(["events"])
        else:
            ops.append(["evict", rng.randint(4, 24)])
    return {"capacity": CAPACITY, "ratio": RATIO, "policy": policy, "ops": ops}


def reference(runs: list[dict]) -> list:
    """SGLang's answers (benchmarks/engine/sglang_hicache.py in SGLang's environment)."""
    from prefillbench.backends.server import sglang_env

    sglang_env.install()
    done = subprocess.run([str(sglang_env.installed_python()), "-W", "ignore", "-m", REFERENCE],
                          input=json.dumps(runs), capture_output=True, text=True, timeout=900, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"SGLang's HiCache driver failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ours(run: dict, host_tokens: int, cache_class=HiRadixCache) -> list:
    """The same operations on HiRadixCache with SGLang's host pool size; its answers in the driver's form."""
    c = cache_class(run["capacity"], host_tokens, run["policy"])
    matches, out = [], [c.host_available]
    for op in run["ops"]:
        name, answer = op[0], None
        if name == "insert":
            tokens, inserted = op[1], op[2]
            c.evict_to_free(len(tokens))
            if c.available < len(tokens):
                answer = "no room"
            else:
                c.available -= len(tokens)
                c.available += c.insert(tokens, inserted)  # the slots of tokens the GPU held already, freed
        elif name == "match":
            matched, best = c.match_prefix(tuple(op[1]))
            node, host = best, 0
            while node is not c.root and node.evicted:
                host += len(node.key)
                node = node.parent
            matches.append((node, best, host))
            answer = [matched - host, host]
        elif name == "lock":
            c.inc_lock_ref(matches[op[1]][0])
        elif name == "unlock":
            c.dec_lock_ref(matches[op[1]][0])
        elif name == "load":
            last, best, host = matches[op[1]]
            answer = c.load_path(last, best, host) if host else 0
        elif name == "evict":
            answer = c.evict(op[1])
        else:
            c.events()
        out.append([answer, [c.available, c.evictable_size, c.protected_size, c.host_available]])
    return out


def compare(runs: list[dict], answers: list, cache_class=HiRadixCache) -> tuple[list[list], str | None]:
    """A table row per run, and the first mismatch in words (None: every operation equal)."""
    rows, first = [], None
    for i, (run, theirs) in enumerate(zip(runs, answers, strict=True)):
        mine = ours(run, theirs[0], cache_class)
        equal = 0
        for k, (a, b) in enumerate(zip(mine[1:], theirs[1:], strict=True)):
            if a != b:
                if first is None:
                    first = (f"run {i} ({run['policy']}), operation {k} {run['ops'][k]}:\n  SGLang: {b}\n  ours:   "
                             f"{a}\n  (answer, [free GPU, evictable, protected, free host])")
                break
            equal += 1
        names = [op[0] for op in run["ops"]]
        rows.append([i, run["policy"], len(run["ops"]), equal, names.count("load"),
                     sum(1 for op, (a, _) in zip(run["ops"], theirs[1:]) if op[0] == "load" and a),
                     names.count("evict")])
    return rows, first


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="one random run each, each policy")
    parser.add_argument("--ops", type=int, default=400, help="operations a run")


def main(args: argparse.Namespace) -> int:
    if args.ops < 1:
        print("error: --ops is at least 1", file=sys.stderr)
        return 2
    runs = [random_run(seed, args.ops, policy) for seed in args.seeds for policy in WRITE_POLICIES]
    answers = reference(runs)
    rows, first = compare(runs, answers)
    print(tabulate(rows, headers=["run", "write policy", "operations", "equal", "loads", "loads that loaded",
                                  "evictions"], tablefmt="github"))
    if first is not None:
        print(f"first mismatch: {first}")
        return 1
    print(f"every operation of {len(runs)} runs equal to SGLang 0.5.23's HiCache")
    return 0


if __name__ == "__main__":
    cli.run(__name__)

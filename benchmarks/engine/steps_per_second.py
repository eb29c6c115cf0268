"""The engine's steps per second on the sim: one engine against another (a git revision or a path), alternated.

Each contender is the engine's own modules (prefillbench/engine.py, or the prefillbench/engine/ package) as they
are at a git revision or under a path, loaded side by side in this process; everything else (strategies, the
sim, Sequence) is this checkout's, so only the engine differs. The workload is a capacity probe's: `--requests`
requests of Sarathi-Serve's Mistral-7B / A100 test (pp1730+tg415, ±90%) arriving as a Poisson process at
`--rate`, concurrency 0 (every arrival admitted), a `stop` that never stops (capacity's checks, and the shorter
decode runs they make). Each round runs every strategy under both engines, in alternating order, and times each
run in CPU seconds of this process (time.process_time). The first round is a warm-up that also checks the two
engines' records are equal.

    python -m benchmarks.engine.steps_per_second                          # HEAD against the working tree
    python -m benchmarks.engine.steps_per_second --old 9ba0047 --new . --rounds 7
    python -m benchmarks.engine.steps_per_second --old /tmp/engine_old.py --pp 2

It prints steps per CPU second per round, then per strategy the median of new/old (above 1: the new engine is
faster), its range over the rounds and a bootstrap 95% interval of that median.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.abc
import importlib.util
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from strategies import make_strategy

import prefillbench
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, make_requests

from benchmarks.lib import cli

ROOT = Path(__file__).resolve().parents[2]
ENGINE = "prefillbench.engine"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--old", default="HEAD", help="a git revision, or a path: engine.py, the engine/ package "
                        "or a checkout's root (default: HEAD)")
    parser.add_argument("--new", default=".", help="the same (default: the working tree)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=2.0, help="arrivals per second (Poisson)")
    parser.add_argument("-s", "--strategies", default="sarathi-serve,chunked")
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds, after the warm-up")
    parser.add_argument("--pp", type=int, default=1, help="the sim's pipeline stages (2 and up: steps in flight)")
    parser.add_argument("--no-stop", action="store_true", help="run without a stop callback")


# ---- loading an engine from elsewhere -------------------------------------------------------------------------------


def engine_sources(spec: str) -> dict[str, tuple[str, str, bool]]:
    """{module name: (source, file name, is a package)} of the engine at `spec`: a path, else a git revision."""
    path = Path(spec)
    if path.exists():
        if path.is_file():
            return {ENGINE: (path.read_text(), str(path), False)}
        if (path / "__init__.py").exists() and not (path / "prefillbench").exists():
            package = path  # the engine package itself
        elif (path / "prefillbench" / "engine").is_dir():
            package = path / "prefillbench" / "engine"
        else:
            file = path / "prefillbench" / "engine.py"
            return {ENGINE: (file.read_text(), str(file), False)}
        return {_module_name(Path("prefillbench", "engine", p.relative_to(package))): (p.read_text(), str(p),
                                                                                      p.name == "__init__.py")
                for p in sorted(package.rglob("*.py"))}
    listing = subprocess.run(["git", "ls-tree", "-r", "--name-only", spec, "--", "prefillbench/engine.py",
                              "prefillbench/engine"], cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    if not listing:
        sys.exit(f"no engine at {spec}")
    return {_module_name(Path(p)): (subprocess.run(["git", "show", f"{spec}:{p}"], cwd=ROOT, check=True,
                                                   capture_output=True, text=True).stdout,
                                    f"{spec}:{p}", p.endswith("__init__.py"))
            for p in listing if p.endswith(".py")}


def _module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class _Sources(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports the engine's modules from the given sources, ahead of every other finder."""

    def __init__(self, sources: dict[str, tuple[str, str, bool]]) -> None:
        self.sources = sources

    def find_spec(self, name, path=None, target=None):
        if name not in self.sources:
            return None
        _, origin, package = self.sources[name]
        return importlib.util.spec_from_loader(name, self, origin=origin, is_package=package)

    def create_module(self, spec):
        return None

    def exec_module(self, module: ModuleType) -> None:
        source, origin, _ = self.sources[module.__name__]
        exec(compile(source, origin, "exec"), module.__dict__)


def load_engine(sources: dict[str, tuple[str, str, bool]]) -> ModuleType:
    """The engine from `sources` (engine_sources) as a module of its own; sys.modules is left as it was, so several
    can live side by side."""
    ours = lambda name: name == ENGINE or name.startswith(ENGINE + ".")
    saved = {name: module for name, module in sys.modules.items() if ours(name)}
    saved_attribute = getattr(prefillbench, "engine", None)
    for name in saved:
        del sys.modules[name]
    finder = _Sources(sources)
    sys.meta_path.insert(0, finder)
    try:
        return importlib.import_module(ENGINE)
    finally:
        sys.meta_path.remove(finder)
        for name in [name for name in sys.modules if ours(name)]:
            del sys.modules[name]
        sys.modules.update(saved)
        if saved_attribute is None:
            prefillbench.__dict__.pop("engine", None)
        else:
            prefillbench.engine = saved_attribute


# ---- timing ---------------------------------------------------------------------------------------------------------


def fingerprint(record) -> str:
    """A digest of everything a run records, to check two engines agree (their record classes are not the same)."""
    text = repr((record.start, record.end, record.stopped,
                 [(r.prompt_len, r.arrival, r.token_times, r.tokens, r.first_scheduled) for r in record.requests],
                 [(s.start, s.end, s.prefill_chunks, s.n_pad, s.decode_contexts, s.chunk_emits) for s in record.steps]))
    return hashlib.sha1(text.encode()).hexdigest()


def bootstrap_median(values: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def main(args: argparse.Namespace) -> int:
    engines = {}
    for label, spec in (("old", args.old), ("new", args.new)):
        sources = engine_sources(spec)
        engines[label] = load_engine(sources)
        print(f"{label}: {spec}: {', '.join(sorted(sources))}")
    test = TestSpec(1730, 415, spread=0.9)
    vocab = SimBackend.load("mistral-7b", "a100").vocab_size
    times = ArrivalSpec("poisson", args.rate).times(args.requests, 42, test)
    requests = make_requests(test, args.requests, vocab, 42, times)
    stop = None if args.no_stop else (lambda progress: False)
    names = args.strategies.split(",")

    def one(label: str, name: str):
        backend = SimBackend.load("mistral-7b", "a100", pp=args.pp)
        backend.say_clamp = lambda asked, allowed, limit="": None  # the KV cache's cap (~130 in flight), once a run: said below
        strategy = make_strategy(name, args.chunk)
        c0 = time.process_time()
        record = engines[label].run(backend, strategy, requests, 0, stop=stop)
        return record, time.process_time() - c0

    speeds: dict[tuple[str, str], list[float]] = {(n, label): [] for n in names for label in engines}
    same = True
    print(f"{args.requests} requests at {args.rate}/s, pp {args.pp}, stop {'off' if args.no_stop else 'on'}; "
          f"steps per CPU second (the sim's KV cache caps the sequences in flight, as in a capacity probe):")
    for round_ in range(args.rounds + 1):
        order = ["old", "new"] if round_ % 2 else ["new", "old"]
        cells = []
        for name in names:
            prints = {}
            for label in order:
                record, cpu = one(label, name)
                if round_ == 0:
                    prints[label] = fingerprint(record)
                else:
                    speeds[name, label].append(len(record.steps) / cpu)
                cells.append(f"{name} {label} {len(record.steps) / cpu:8.0f} ({len(record.steps)} steps)")
            if round_ == 0 and prints["old"] != prints["new"]:
                same = False
                print(f"  {name}: the two engines' records differ")
        print(f"{'warm-up' if round_ == 0 else f'round {round_}':>8}: " + "; ".join(cells))
    print(f"records equal: {'yes' if same else 'NO'}")
    for name in names:
        ratios = [n / o for n, o in zip(speeds[name, "new"], speeds[name, "old"])]
        low, high = bootstrap_median(ratios)
        print(f"{name:>14}: new/old steps per second, median {statistics.median(ratios):.4f} "
              f"(min {min(ratios):.4f}, max {max(ratios):.4f}, bootstrap 95% of the median {low:.4f}-{high:.4f}; "
              f"old {statistics.median(speeds[name, 'old']):.0f}, new {statistics.median(speeds[name, 'new']):.0f} "
              f"steps/s)")
    return 0 if same else 1


if __name__ == "__main__":
    cli.run(__name__)

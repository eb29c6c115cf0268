"""benchmarks/ is a package: every benchmark imports, declares its flags, is listed in its README with its
command, and nothing in the repository points at a benchmark path that no longer exists."""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
import subprocess
from pathlib import Path

import pytest

import benchmarks
from benchmarks.lib import cli

ROOT = Path(__file__).resolve().parent.parent
#: Modules of the package that are no benchmark of their own: helpers, and the GPU check's parts.
# Parts of a benchmark, not benchmarks: the GPU table's pieces, and the script vllm_throttle_steps runs inside vLLM's
# own environment (its python, not the project's: it has no flags of ours to declare), and the session traces
# sglang_steps --radix compares on.
HELPERS = {"benchmarks.gpu.sections", "benchmarks.gpu.table", "benchmarks.engine.vllm_throttle_reference",
           "benchmarks.engine.sglang_sessions", "benchmarks.engine.sglang_trace"}


def all_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(benchmarks.__path__, "benchmarks.") if not m.ispkg)


def benchmark_modules() -> list[str]:
    return [m for m in all_modules() if not m.startswith("benchmarks.lib.") and m not in HELPERS]


def test_the_package_has_its_benchmarks():
    names = benchmark_modules()
    assert {"benchmarks.torch.steps", "benchmarks.cpu.decode_plan", "benchmarks.gguf.overhead",
            "benchmarks.runs.decomposition", "benchmarks.gpu.check"} <= set(names)
    assert len(names) >= 16


@pytest.mark.parametrize("name", all_modules())
def test_every_module_imports(name):
    importlib.import_module(name)


@pytest.mark.parametrize("name", benchmark_modules())
def test_every_benchmark_declares_its_flags_and_a_main(name):
    module = importlib.import_module(name)
    assert callable(module.main)
    parser = cli.parser_for(module)
    assert parser.prog == f"python -m {name}"
    assert parser.description, f"{name} has no docstring to describe it"
    assert "cli.run(__name__)" in Path(module.__file__).read_text(), f"{name} does not run through lib.cli"


def test_no_benchmark_edits_sys_path():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").rglob("*.py") if "sys.path" in p.read_text()]
    assert offenders == []


def test_the_readme_gives_every_benchmark_its_command():
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    listed = set(re.findall(r"python -m (benchmarks(?:\.\w+)+)", readme))
    assert set(benchmark_modules()) <= listed
    assert listed <= set(benchmark_modules()), "the README names a benchmark that does not exist"


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.split() if p.endswith((".md", ".py", ".sh", ".toml", ".c")) or p == "Makefile"]


def test_every_benchmark_path_and_module_the_repository_names_exists():
    path = re.compile(r"benchmarks/[\w/]+\.(?:py|sh)")
    module = re.compile(r"-m (benchmarks(?:\.\w+)+)")
    missing = set()
    for file in tracked_text_files():
        if not file.exists():
            continue
        text = file.read_text(errors="replace")
        missing |= {f"{file.relative_to(ROOT)}: {p}" for p in path.findall(text) if not (ROOT / p).exists()}
        missing |= {f"{file.relative_to(ROOT)}: {m}" for m in module.findall(text)
                    if importlib.util.find_spec(m) is None}
    assert sorted(missing) == []

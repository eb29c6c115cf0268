"""Imports run one way: the CLI down to commands, then bench and report, the engine, backends, strategies and
the step types. A module may import its own layer or any layer below it, never one above."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Lowest first. A module belongs to the longest prefix that names it.
LAYERS: list[tuple[str, ...]] = [
    ("prefillbench.errors", "prefillbench.step", "prefillbench.sequence", "prefillbench.speculation",
     "prefillbench.writers"),
    ("strategies",),
    ("prefillbench.backends", "prefillbench.models"),
    ("prefillbench.engine",),
    ("prefillbench.deploy",),
    ("prefillbench.bench", "prefillbench.meta"),
    ("prefillbench.report",),
    ("prefillbench.api",),
    ("prefillbench.commands",),
    ("prefillbench.cli", "prefillbench.__main__", "prefillbench"),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    return None if best is None else best[1]


def imported_modules(path: Path) -> set[str]:
    """Every project module `path` imports, lazy imports inside functions included."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)] if node.level > 1 else anchor
                base = ".".join([*anchor, base] if base else anchor)
            found |= {f"{base}.{a.name}" for a in node.names} | {base}
    return {m for m in found if layer_of(m) is not None}


SOURCES = sorted(p for d in ("prefillbench", "strategies") for p in (ROOT / d).rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_a_layer_above_its_own(path):
    own = layer_of(module_name(path))
    assert own is not None, f"{path} belongs to no layer: add it to LAYERS"
    above = {m for m in imported_modules(path) if layer_of(m) > own and m != "prefillbench"}
    assert not above, f"{module_name(path)} (layer {own}) imports {sorted(above)}"


def test_strategies_know_nothing_of_backends_or_torch():
    for path in (ROOT / "strategies").rglob("*.py"):
        text = ast.dump(ast.parse(path.read_text()))
        for name in ("torch", "llama_cpp", "prefillbench.backends"):
            assert f"'{name}'" not in text, f"{path.name} imports {name}"


SIM_CORE = ["cost", "pipeline", "specs", "presets", "configs", "calibration"]


@pytest.mark.parametrize("module", SIM_CORE)
def test_the_sim_core_knows_no_backend_class(module):
    path = ROOT / "prefillbench" / "backends" / "sim" / f"{module}.py"
    imports = imported_modules(path)
    assert not {m for m in imports if m.startswith("prefillbench.backends") and not m.startswith("prefillbench.backends.sim")
                or m == "prefillbench.backends.sim.backend"}

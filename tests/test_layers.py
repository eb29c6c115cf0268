"""The layers import one way: the sim's cost model, pipeline and calibration fit know no backend class."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SIM = Path(__file__).resolve().parent.parent / "prefillbench" / "sim"


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("module", ["cost", "pipeline", "specs", "calibration", "cli"])
def test_the_sim_core_does_not_import_the_backends(module):
    imports = imported_modules(SIM / f"{module}.py")
    assert not {m for m in imports if m.startswith(("prefillbench.backends", "prefillbench.cli", "prefillbench.calibrate"))}

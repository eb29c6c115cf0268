"""SGLang's scheduling code, installed by the project: the pinned SGLang in an environment of its own, importable on a
CPU, for the reference that drives its scheduler (benchmarks/engine/sglang_reference.py) and the preset's flags
checked against its own argument parser. No SGLang server runs here (docs/servers.md says why).

* The environment: `~/.cache/prefillbench/sglang-<version>/` (or $PREFILLBENCH_CACHE/...), a venv of its own:
  SGLang's wheel pins a CUDA torch (2.14.1), CUDA 13 kernels and older transformers than the project's, none of which
  its scheduling modules need. So: `pip install torch==2.13.0` (the CPU wheel where one is on disk, as the project's
  Makefile pins it), `pip install --no-deps sglang==<version>`, then only the pure-Python packages that
  `sglang.srt.managers.schedule_policy`, `schedule_batch`, `scheduler` and `server_args` import at module level
  (REQUIREMENTS; ../shared/notes/sglang-and-kv-memory.md section 5 traced them), with torch held at the CPU wheel.
* torchvision: no registry build loads against the CPU torch, and `sglang.srt.configs` imports it for a vision
  model's constants; sglang_stubs.py (copied into site-packages, installed by a .pth line) answers every
  `torchvision*` import with a stub, and a `torchvision-<version>.dist-info/METADATA` gives transformers' version
  check a version. No installed file is edited.
* `SGLANG_USE_CPU_ENGINE` stays unset: with it, `mem_cache/allocation.py` imports `sgl_kernel`'s CPU kernels, which
  are a source build (for Intel AMX) not on the registry.

A stamp file marks a finished install (checked by importing the scheduler once); a file lock serializes two jobs on
one cache. Usage: python -m prefillbench.backends.server.sglang_env [--check] (`make sglang`).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from prefillbench.backends.server.build import _locked, cache_root  # one cache, one lock, as llama-server's build
from prefillbench.errors import BackendError

VERSION = "0.5.23"
PACKAGE = f"sglang=={VERSION}"
TORCH = "torch==2.13.0"
#: What SGLang's scheduling modules and its server_args import at module level, and nothing else (the wheel's own
#: requirements are CUDA builds). Unpinned: the import does not care which release of each (pip warns that sglang
#: pins other versions of transformers, tokenizers and xgrammar; the modules read here import all the same).
#: The note's list less interegular, llguidance and outlines, which none of those imports loads (sys.modules after
#: CHECK, 2026-12-06).
REQUIREMENTS = ("triton", "transformers", "numpy", "msgspec", "pyzmq", "orjson", "psutil", "pybase64", "requests",
                "pillow", "starlette", "pydantic", "huggingface_hub", "tqdm", "ipython", "aiohttp", "openai",
                "partial_json_parser", "regex", "sentencepiece", "safetensors", "dill", "compressed-tensors", "gguf",
                "einops", "setproctitle", "uvicorn", "fastapi", "xgrammar", "datasets")
STUB_MODULE = "prefillbench_sglang_stubs"
#: The import that proves the install: what the reference drives (the environment's python, the stub on)
CHECK = ("from sglang.test.test_utils import maybe_stub_sgl_kernel; maybe_stub_sgl_kernel(); "
         "from sglang.srt.managers import schedule_policy, schedule_batch, scheduler; "
         "from sglang.srt.server_args import ServerArgs; import sglang; print(sglang.__version__)")
HOW = "`make sglang` installs SGLang's scheduling code for the project"


def env_dir() -> Path:
    return cache_root() / f"sglang-{VERSION}"


def python() -> Path:
    return env_dir() / "bin" / "python"


def _stamp() -> Path:
    return env_dir() / ".installed"


def installed() -> bool:
    return _stamp().is_file()


def installed_python() -> Path:
    """The environment's python; BackendError in one line where it is not installed."""
    if not installed():
        raise BackendError(f"SGLang {VERSION}'s environment is not installed: {HOW}")
    return python()


def _site_packages(folder: Path) -> Path:
    found = sorted((folder / "lib").glob("python3*/site-packages"))
    if not found:
        raise BackendError(f"no site-packages under {folder / 'lib'}")
    return found[0]


def _run(argv: list[str], what: str, timeout: float = 1800) -> str:
    print(f"sglang: {what}", file=sys.stderr, flush=True)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BackendError(f"{what} took over {timeout:.0f} s") from None
    if done.returncode != 0:
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-8:])
        raise BackendError(f"{what} failed (exit {done.returncode}): {tail}")
    return done.stdout


def _write_stub(folder: Path) -> None:
    """sglang_stubs.py as a module of the environment, a .pth line that installs it at start-up, and torchvision's
    metadata (only its version) for transformers' check."""
    from prefillbench.backends.server import sglang_stubs

    site = _site_packages(folder)
    shutil.copyfile(Path(sglang_stubs.__file__), site / f"{STUB_MODULE}.py")
    (site / f"{STUB_MODULE}.pth").write_text(f"import {STUB_MODULE}; {STUB_MODULE}.install()\n")
    meta = site / f"torchvision-{sglang_stubs.VERSION}.dist-info"
    meta.mkdir(exist_ok=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torchvision\nVersion: {sglang_stubs.VERSION}\n"
                                   "Summary: a stub (prefillbench's SGLang environment): no torchvision loads here\n")


def install() -> Path:
    """The environment, installed once (idempotent; concurrent callers wait on a lock); its python."""
    with _locked(cache_root()):  # cache_root()/.lock: one install at a time
        if not installed():
            started = time.monotonic()
            folder = env_dir()
            if folder.exists():
                shutil.rmtree(folder)  # a half-finished install (no stamp): start again
            _run([sys.executable, "-m", "venv", str(folder)], f"creating {folder}")
            constraints = folder / "constraints.txt"
            constraints.write_text(f"{TORCH}\n")  # nothing below may swap the CPU torch for a CUDA one
            pip = [str(python()), "-m", "pip", "install", "-q", "-c", str(constraints)]
            _run([*pip, TORCH], f"pip install {TORCH}")
            _run([*pip, "--no-deps", PACKAGE], f"pip install --no-deps {PACKAGE}")
            _run([*pip, *REQUIREMENTS], "pip install what its scheduling modules import")
            _write_stub(folder)
            version = _run([str(python()), "-c", CHECK], "importing its scheduler", timeout=600).strip().splitlines()
            if not version or version[-1] != VERSION:
                raise BackendError(f"the environment's sglang says {version[-1:]}, not {VERSION}")
            _stamp().write_text(json.dumps({"package": PACKAGE, "torch": TORCH,
                                            "seconds": round(time.monotonic() - started, 1)}))
    return python()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prefillbench.backends.server.sglang_env",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="say whether the environment is there; change nothing")
    args = parser.parse_args(argv)
    if args.check:
        print(f"sglang {VERSION}: {python() if installed() else 'not installed'}")
        return 0 if installed() else 1
    try:
        print(f"sglang {VERSION}: {install()}")
    except BackendError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

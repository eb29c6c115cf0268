"""Backend selection: one registry of backends, each declaring the options its `load` takes, and one entry point
that turns command-line choices into a loaded backend."""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

from prefillbench.backends.base import Backend, BackendError, SlotTable, StepBackend


@dataclass(frozen=True)
class BackendEntry:
    """Where a backend's class lives: imported only when asked for (torch and llama.cpp take seconds to import)."""

    module: str
    class_name: str

    def load_class(self) -> type[Backend]:
        return getattr(importlib.import_module(self.module), self.class_name)


BACKENDS: dict[str, BackendEntry] = {
    "torch": BackendEntry("prefillbench.backends.torch.backend", "TorchBackend"),
    "gguf": BackendEntry("prefillbench.backends.gguf", "GGUFBackend"),
    "sim": BackendEntry("prefillbench.backends.sim.backend", "SimBackend"),
    # Serving engines, measured from outside (backends/server): llama.cpp's own server, or any engine's command.
    "llama-server": BackendEntry("prefillbench.backends.server.backend", "LlamaServerBackend"),
    "server": BackendEntry("prefillbench.backends.server.backend", "ServerBackend"),
    # Not in the help: a model-free backend for testing the command path (failures on demand; see its module).
    "fake": BackendEntry("prefillbench.backends.fake", "FakeBackend"),
}
HIDDEN_BACKENDS = ("fake",)
#: The pip extra each model backend needs (pyproject.toml), and the top-level modules it brings: a backend whose
#: extra is missing says which to install, in one line.
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "torch": ("torch", ("torch", "transformers", "accelerate", "huggingface_hub")),
    "gguf": ("gguf", ("llama_cpp",)),
}
#: What --backend offers in its help.
BACKEND_CHOICES = ("auto", *(b for b in BACKENDS if b not in HIDDEN_BACKENDS))


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def resolve_backend_name(name: str) -> str:
    """auto: torch where CUDA is there to use, llama.cpp on a CPU."""
    if name != "auto":
        return name
    if cuda_available() or importlib.util.find_spec("llama_cpp") is None:
        return "torch"
    return "gguf"


def choose_backend(name: str, model: str | None, tp: int = 1) -> str:
    """The backend that `--backend name` runs for this model: auto resolved, never llama.cpp where it cannot."""
    if name == "auto" and ((model and not model.endswith(".gguf")) or tp > 1):
        return "torch"  # llama.cpp runs .gguf files only and has no tensor parallelism
    return resolve_backend_name(name)


def backend_class(name: str) -> type[Backend]:
    """The class of a resolved backend name, for what it says before anything loads (its sequence_limit, its options)."""
    entry = BACKENDS.get(name)
    if entry is None:
        raise BackendError(f"unknown backend {name!r}; choose from {', '.join(BACKEND_CHOICES)}")
    try:
        return entry.load_class()
    except ImportError as e:
        extra = EXTRAS.get(name)
        if extra is None or (e.name or "").split(".")[0] not in EXTRAS[name][1]:
            raise
        raise BackendError(f"--backend {name} needs the {extra[0]} extra ({e.name} is not installed): "
                           f"pip install 'prefillbench[{extra[0]}]'") from None


#: Options every step backend takes because the engine acts on them, not its loader: --kv-cache-tokens sizes the
#: engine's KV memory (StepBackend.kv_capacity_tokens). A serving engine keeps its own memory: named as ignored.
STEP_ENGINE_OPTIONS = frozenset({"kv_cache_tokens"})


def check_options(name: str, options: dict[str, Any]) -> dict[str, str]:
    """The options among `options` (by load keyword) that backend `name` will not use, each with why.

    Raises BackendError for those that change what runs and so cannot be dropped quietly: a --tp the launch does
    not match, --compile off torch, --pp off the sim. `name` is resolved (see choose_backend).
    """
    from prefillbench.backends.distributed import check_launch

    check_launch(options.get("tp") or 1, name)
    if options.get("compile_decode") and name != "torch":
        raise BackendError(f"--compile applies to --backend torch, not {name}")
    pp = options.get("pp") or 1
    if options.get("kernels", "auto") != "auto" and name != "torch":
        raise BackendError(f"--kernels {options['kernels']} applies to --backend torch, not {name}")
    if (options.get("dp") or 1) > 1 and name != "sim":
        raise BackendError(f"--dp {options['dp']} runs on the sim only (--backend sim)")
    if (options.get("ep") or 1) > 1 and name != "sim":
        raise BackendError(f"--ep {options['ep']} runs on the sim only (--backend sim)")
    if pp > 1 and name != "sim":
        raise BackendError(f"--pp {pp} runs on the sim only (--backend sim); see the README's \"Past one machine\"")
    cls = backend_class(name)
    engine_side = STEP_ENGINE_OPTIONS if issubclass(cls, StepBackend) else frozenset()
    unused = {k: "" for k in options if k not in cls.options and k not in engine_side}
    unusable = cls.unusable_options()
    return unused | {k: why for k, why in unusable.items() if k in options}


def load_backend(name: str, model: str | None, **options: Any) -> Backend:
    """Load backend `name` (or auto) with the options it declares; the rest of `options` is dropped
    (the CLI has warned about any a user gave: see check_options)."""
    from prefillbench.models import default_model_path

    name = choose_backend(name, model, options.get("tp") or 1)
    ignored = check_options(name, options)
    taken = {k: v for k, v in options.items() if k not in ignored}
    if name not in ("sim", "fake") and not options.get("url"):
        # a server at --url serves its own model: no default is named for it (its requests would name that one)
        model = model or default_model_path()
    cls = backend_class(name)
    kv_cache_tokens = taken.get("kv_cache_tokens")
    if kv_cache_tokens is not None and kv_cache_tokens < 1:
        raise BackendError(f"--kv-cache-tokens must be at least 1, got {kv_cache_tokens}")
    if not issubclass(cls, StepBackend):  # a serving engine launched with its own knob (vLLM's), or refused
        return cls.load(model, **taken)
    taken.pop("kv_cache_tokens", None)
    backend = cls.load(model, **taken)
    if kv_cache_tokens is not None:  # the engine's KV memory reads it (StepBackend.kv_capacity_tokens)
        backend.kv_cache_tokens = kv_cache_tokens
    return backend


__all__ = ["Backend", "BackendError", "SlotTable", "BACKENDS", "BACKEND_CHOICES", "HIDDEN_BACKENDS", "backend_class", "check_options",
           "choose_backend", "load_backend", "resolve_backend_name"]

"""Backend selection: one entry point that turns command-line choices into a loaded backend."""
from __future__ import annotations

import importlib.util
from typing import Any

from prefillbench.backends.base import Backend, BackendError, SlotTable

BACKEND_CHOICES = ("auto", "torch", "gguf", "sim")
#: Options the torch backend takes (see TorchBackend.__init__); others belong to other backends.
TORCH_OPTIONS = ("tune_linear", "cuda_graphs", "compile_decode", "decode_plan", "kernels")


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
    """The class of a resolved backend name, for what it says before anything loads (e.g. its sequence_limit)."""
    if name == "sim":
        from prefillbench.backends.sim.backend import SimBackend

        return SimBackend
    if name == "torch":
        from prefillbench.backends.torch.backend import TorchBackend

        return TorchBackend
    if name == "gguf":
        from prefillbench.backends.gguf import GGUFBackend

        return GGUFBackend
    raise BackendError(f"unknown backend {name!r}; choose from {', '.join(BACKEND_CHOICES)}")


def load_backend(name: str, model: str | None, *, device: str = "auto", dtype: str = "float32",
                 threads: int | None = None, **options: Any) -> Backend:
    from prefillbench.models import default_model_path

    from prefillbench.backends.distributed import check_launch

    tp, pp = options.get("tp") or 1, options.get("pp") or 1
    name = choose_backend(name, model, tp)
    check_launch(tp, name)
    if options.get("compile_decode") and name != "torch":
        raise BackendError(f"--compile applies to --backend torch, not {name}")
    if options.get("kernels", "auto") != "auto" and name != "torch":
        raise BackendError(f"--kernels {options['kernels']} applies to --backend torch, not {name}")
    if pp > 1 and name != "sim":
        raise BackendError(f"--pp {pp} runs on the sim only (--backend sim); see the README's \"Past one machine\"")
    if name == "sim":
        from prefillbench.backends.sim.backend import SimBackend

        return SimBackend.load(
            options.get("sim_model") or model,
            options.get("sim_gpu"),
            tp=tp,
            pp=pp,
            calibration=options.get("calibration"),
            trace=options.get("trace"),
        )
    model = model or default_model_path()
    if name == "torch":
        from prefillbench.backends.torch.backend import TorchBackend

        torch_options = {k: v for k, v in options.items() if k in TORCH_OPTIONS}
        return TorchBackend.load(model, device=device, dtype=dtype, threads=threads, tp=tp, **torch_options)
    if name == "gguf":
        from prefillbench.backends.gguf import GGUFBackend

        return GGUFBackend.load(model, device=device, threads=threads, **options)
    raise BackendError(f"unknown backend {name!r}; choose from {', '.join(BACKEND_CHOICES)}")


__all__ = ["Backend", "BackendError", "SlotTable", "BACKEND_CHOICES", "backend_class", "choose_backend", "load_backend",
           "resolve_backend_name"]

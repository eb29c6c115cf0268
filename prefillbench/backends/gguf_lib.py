"""llama.cpp through llama-cpp-python, as the gguf backend uses it: the library (None where it is not installed),
its log kept for our error messages, the logits' address, the file check and the labels of what was loaded."""
from __future__ import annotations

import ctypes
from collections import deque
from pathlib import Path

from prefillbench.errors import BackendError

try:
    import llama_cpp as llama
except ImportError:  # the torch backend keeps working without llama-cpp-python
    llama = None

GGUF_MAGIC = b"GGUF"
# ggml_log_level (ggml.h): 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continuation
_LOG_WARN, _LOG_ERROR = 3, 4
KV_TYPES = {"f16": 1, "f32": 0, "q8_0": 8}  # ggml_type values
FLASH_ATTN_CHOICES = ("on", "off", "auto")  # llama-bench's -fa values
FLASH_ATTN_TYPES = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type
DEFAULT_FLASH_ATTN = "auto"
log_lines: deque = deque(maxlen=32)
_log_callback = None  # keeps the ctypes callback alive while llama.cpp holds it
_backend_ready = False
_get_logits_addr = None  # llama_get_logits returning the address as an int (install_log binds it)


def install_log() -> None:
    """Silence llama.cpp's stderr logging but keep its warnings and errors for our messages."""
    global _log_callback, _backend_ready, _get_logits_addr
    if _log_callback is None:

        def _log(level: int, text: bytes, user_data) -> None:
            if level in (_LOG_WARN, _LOG_ERROR) and text:
                log_lines.append((level, text))

        _log_callback = llama.llama_log_callback(_log)
    llama.llama_log_set(_log_callback, ctypes.c_void_p(0))
    if not _backend_ready:
        llama.llama_backend_init()
        _backend_ready = True
    if _get_logits_addr is None:
        # The same C function with an address for its result: llama-cpp-python's binding returns a ctypes
        # POINTER(c_float), and turning that into an array cost a few microseconds a step.
        address = ctypes.cast(llama.llama_get_logits, ctypes.c_void_p).value
        _get_logits_addr = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(address)


def last_error(default: str = "no details from llama.cpp") -> str:
    """The most recent error line llama.cpp logged (else the latest warning), made readable."""
    for wanted in (_LOG_ERROR, _LOG_WARN):
        for level, text in reversed(log_lines):
            if level != wanted:
                continue
            line = text.decode("utf-8", "replace").strip().splitlines()[0] if text.strip() else ""
            if not line or line.endswith("failed to load model") or "failed to decode" in line:
                continue
            for marker in ("error loading model: ", "error loading model architecture: "):
                if marker in line:
                    line = line.split(marker, 1)[1]
            return line
    return default


def check_gguf_file(model: str) -> Path:
    path = Path(model)
    if not path.exists():
        raise BackendError(f"model file not found: {model}")
    if path.is_dir():
        raise BackendError(f"--backend gguf needs a .gguf file, and {model} is a folder (use --backend torch for checkpoints)")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise BackendError(f"cannot read {model}: {e.strerror}") from None
    if magic != GGUF_MAGIC:
        raise BackendError(f"{model} is not a GGUF file (it does not start with the GGUF magic bytes)")
    return path


def weights_label(desc: str) -> str:
    """'llama 135M Q4_1' -> 'Q4_1 (quantized, as stored)'."""
    ftype = desc.split(" ", 2)[-1] if desc.count(" ") >= 2 else desc
    if ftype.upper().startswith(("F32", "F16", "BF16", "ALL F32")):
        return f"{ftype} (as stored)"
    return f"{ftype} (quantized, as stored)"




def logits_address(ctx) -> int:
    """llama_get_logits(ctx) as an address (install_log binds it)."""
    return _get_logits_addr(ctx)


def llama_version() -> str:
    try:
        return llama.llama_version().decode()
    except Exception:
        return "unknown"


def ggml_version() -> str:
    try:
        from llama_cpp import _ggml

        lib = _ggml.libggml
        version, commit = lib.ggml_version, lib.ggml_commit
        version.restype = commit.restype = ctypes.c_char_p
        return f"{version().decode()} ({commit().decode()})"
    except Exception:
        return "unknown"

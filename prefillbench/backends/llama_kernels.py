"""Which llama.cpp kernels prefillbench lets run on this CPU, decided once for everything that loads llama.cpp: the
gguf backend, the llama-server it launches, and the llama-cpp-python and llama-bench references of the tests and
benchmarks, so the two sides of every comparison run the same kernels."""
from __future__ import annotations

import os
import sys
from typing import Any

from prefillbench.errors import BackendError

try:
    import llama_cpp as llama
except ImportError:  # the torch backend keeps working without llama-cpp-python
    llama = None

#: Where llama.cpp may put weights in its extra buffer types (AMX, the CPU repack): "1" on, "0" off; unset: off
#: where llama.cpp reports AMX_INT8, on elsewhere (see extra_buffers).
EXTRA_BUFFERS_VARIABLE = "PREFILLBENCH_LLAMA_REPACK"


def extra_buffers() -> tuple[bool, str]:
    """Whether llama.cpp may use its extra buffer types (the AMX kernels and the CPU repack), and why: for the gguf
    backend (`use_extra_bufts`) and the llama-server it launches (`--no-repack`) alike.

    llama.cpp's AMX matrix product segfaults on some AMX CPUs (ggml_backend_amx_mul_mat: llama.cpp#20824, open;
    llama.cpp 0c1e570 with the shipped Q4_1 model on an AMX Xeon VM, every run). It is chosen whenever the CPU has
    AMX-INT8, so there it is off by default, and $PREFILLBENCH_LLAMA_REPACK=1 turns it back on."""
    asked = os.environ.get(EXTRA_BUFFERS_VARIABLE)
    if asked in ("0", "1"):
        return asked == "1", f"${EXTRA_BUFFERS_VARIABLE}={asked}"
    if asked:
        raise BackendError(f"${EXTRA_BUFFERS_VARIABLE} must be 0 or 1, got {asked!r}")
    info = llama.llama_print_system_info().decode(errors="replace") if llama is not None else ""
    if "AMX_INT8 = 1" in info:
        return False, (f"off: this CPU has AMX, whose llama.cpp kernels can segfault (llama.cpp#20824); "
                       f"${EXTRA_BUFFERS_VARIABLE}=1 turns them on")
    return True, "on (llama.cpp's default)"


def reference_llama(*args: Any, **kwargs: Any):
    """llama-cpp-python's high-level `Llama` (a reference in tests and benchmarks), loaded with the extra buffer
    types this backend uses: `Llama()` takes no parameter for them, so its default model parameters are wrapped
    while it loads."""
    import llama_cpp.llama as high
    from llama_cpp import Llama

    on = extra_buffers()[0]
    default = high.llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = on
        return p

    high.llama_cpp.llama_model_default_params = params
    try:
        return Llama(*args, **kwargs)
    finally:
        high.llama_cpp.llama_model_default_params = default


_said = False


def say_extra_buffers(on: bool, why: str) -> None:
    """A line on stderr, once a process, where they are off."""
    global _said
    if not on and not _said:
        _said = True
        print(f"prefillbench: llama.cpp's extra buffer types (AMX, CPU repack) {why}", file=sys.stderr)

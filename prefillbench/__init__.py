"""prefillbench: how should an LLM engine schedule prefill against decode? Measure it."""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["generate", "__version__"]


def __getattr__(name: str):
    # Lazy, so that `import strategies` first (strategies -> prefillbench.step) does not
    # loop back through the API into a half-initialised strategies package.
    if name == "generate":
        from prefillbench.api import generate

        return generate
    raise AttributeError(f"module 'prefillbench' has no attribute {name!r}")

"""prefillbench: how should an LLM engine schedule prefill against decode? Measure it."""
from .api import generate

__version__ = "0.1.0"
__all__ = ["generate", "__version__"]

"""torchvision as SGLang's scheduling code meets it in the project's SGLang environment: a stub, installed at start-up
by a .pth line (`import ...; install()`) that sglang_env.py writes into that environment's site-packages, where this
file is copied.

Why: `sglang.srt.configs` imports `torchvision.transforms` for a vision model's constants, so importing SGLang's
scheduler (`sglang.srt.managers.schedule_policy`) imports torchvision; no registry torchvision loads against the CPU
torch the environment has (0.28.0 fails at import: `operator torchvision::nms does not exist`). Nothing the scheduler
does reads torchvision, so every `torchvision*` import is answered with a module whose attributes are MagicMocks
(../shared/notes/sglang-and-kv-memory.md, section 5). The environment's `torchvision-<version>.dist-info/METADATA`
(also written by sglang_env.py) lets transformers' version check read a version.

It imports nothing of prefillbench (it runs in SGLang's environment, which has none) and edits no installed file.
"""
import importlib.abc
import importlib.machinery
import sys
import types
from unittest.mock import MagicMock

VERSION = "0.28.0"


class _StubModule(types.ModuleType):
    """A module any of whose attributes is a MagicMock (a class, a function, a constant alike)."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `torchvision` and every submodule of it, before any other finder."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []  # a package: `import torchvision.transforms.functional` finds its parts here too
        module.__version__ = VERSION
        return module

    def exec_module(self, module):
        pass


def install() -> None:
    """Put the finder first (once). Called by the environment's .pth line, never on import: imported elsewhere (the
    project's own tests import every module), this file changes nothing."""
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())

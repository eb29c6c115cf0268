"""How every benchmark runs, as vLLM's do: a module declares its flags in `add_arguments(parser)` and runs in
`main(args)`; `run(__name__)` at its foot parses the command line and calls it."""
from __future__ import annotations

import argparse
import sys
from types import ModuleType


def parser_for(module: ModuleType) -> argparse.ArgumentParser:
    """The module's parser: its docstring's first line as the description, the rest as the epilog."""
    doc = (module.__doc__ or "").strip()
    first, _, rest = doc.partition("\n")
    # Run with -m, the module is __main__: its spec keeps the name it is run by.
    name = module.__spec__.name if module.__spec__ else module.__name__
    parser = argparse.ArgumentParser(prog=f"python -m {name}", description=first,
                                     epilog=rest.strip() or None, formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(parser)
    return parser


def run(name: str, argv: list[str] | None = None) -> None:
    """Parse the command line for module `name` and exit with what its main returns (None: 0)."""
    module = sys.modules[name]
    args = parser_for(module).parse_args(argv)
    sys.exit(module.main(args) or 0)

"""The error every layer raises for a problem the user can fix; the CLI prints it as one line and exits 2.

It lives below the backends and the sim, so both can raise it without importing each other.
"""
from __future__ import annotations


class BackendError(RuntimeError):
    """A problem the user can fix (bad model, too small a context, ...): one line, no traceback."""


class UsageError(ValueError):
    """Bad input on the command line (a flag's value, flags that do not go together): one line to stderr, exit 2."""

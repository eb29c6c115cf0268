"""Scheduling strategies, one module each, and the registry that names them."""
from __future__ import annotations

from .base import Strategy
from .chunked import Chunked
from .orca import Orca
from .packed import Packed
from .padded import Padded
from .sarathi_serve import SarathiServe
from .sequential import Sequential
from .static import Static

STRATEGIES: dict[str, type[Strategy]] = {
    s.name: s for s in (Sequential, Padded, Packed, Chunked, SarathiServe, Orca, Static)
}


def make_strategy(name: str, chunk_size: int = 256) -> Strategy:
    try:
        cls = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}") from None
    return cls(chunk_size)


__all__ = ["STRATEGIES", "Strategy", "make_strategy"]

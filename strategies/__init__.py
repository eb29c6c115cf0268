"""Scheduling strategies, one module each, and the registry that names them."""
from __future__ import annotations

from prefillbench.speculation import parse_spec

from .base import Strategy
from .budget import make_budget
from .cadence import make_cadence
from .compose import compose, parse, paced, rules_of
from .chunked import Chunked
from .llama_server import LlamaServer
from .orca import Orca
from .packed import Packed
from .padded import Padded
from .sarathi_serve import SarathiServe
from .sequential import Sequential
from .slo_budget import SloBudget
from .sglang import Sglang, SglangMixed
from .static import Static
from .vllm_v1 import VllmV1

STRATEGIES: dict[str, type[Strategy]] = {
    s.name: s for s in (Sequential, Padded, Packed, Chunked, SarathiServe, Orca, Static, VllmV1, Sglang, SglangMixed,
                        LlamaServer, SloBudget)
}


#: The token budget (chunk size) of a strategy that uses one and was given none.
DEFAULT_BUDGET = 256


def split_spec(spec: str) -> tuple[str, dict[str, int]]:
    """A strategy as -s names it: its name, then settings of its engine's scheduler after colons
    ('vllm-v1:threshold=512:partial=2'), each a whole number of at least 0. ValueError where a part is not one."""
    name, *parts = rules_of(spec).split(":")  # a budget's and a cadence's parts aside (compose.py)
    settings: dict[str, int] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or not key or not value.isdigit():
            raise ValueError(f"strategy {spec!r}: {part!r} is not a setting; write {name}:SETTING=N")
        settings[key] = int(value)
    return name, settings


def make_strategy(name: str, chunk_size: int | None = None, speculation=None) -> Strategy:
    """The strategy `name` (with its settings, split_spec) at token budget `chunk_size` (DEFAULT_BUDGET where None:
    those that ignore it), with speculative decoding's settings `speculation` (a SpecConfig; None: off)."""
    base, settings = split_spec(name)
    composition = parse(name)
    try:
        cls = STRATEGIES[base]
    except KeyError:
        raise ValueError(f"unknown strategy {base!r}; choose from {', '.join(STRATEGIES)}") from None
    cadence = make_cadence(composition.cadence)
    if cadence is not None:
        cls = paced(cls)
    strategy = cls(DEFAULT_BUDGET if chunk_size is None else chunk_size)
    strategy.budget_given = chunk_size is not None
    _compose(strategy, make_budget(composition.budget), cadence)
    strategy.speculation = speculation if speculation is not None else parse_spec(composition.speculation)
    strategy.configure(settings)
    return strategy


def _compose(strategy: Strategy, budget, cadence) -> None:
    """Give the rules their budget and cadence parts (compose.py). A priced budget takes no --chunk-size (its cap
    bounds a step's prompt tokens); a cadence counts steps, so the engine asks for every one (no decode runs)."""
    if budget is not None:
        if not getattr(strategy, "uses_chunk_size", False) and not strategy.needs_price:
            raise ValueError(f"{strategy.name} takes no token budget (it runs whole prompts): no --budget for it")
        strategy.budget_part = budget
        strategy.needs_price = budget.needs_price
        strategy.uses_chunk_size = False
        strategy.chunk_size = budget.cap
    if cadence is not None:
        strategy.cadence = cadence
        strategy.steady_decodes = strategy.steady_while_none_waits = False


def configurations(names: list[str], budgets: list[int]) -> list[tuple[str, int | None]]:
    """The grid every command measures: each strategy at each budget, one that ignores the budget once (None).
    An unknown name raises ValueError."""
    return [(name, budget) for name in names
            for budget in (budgets if make_strategy(name).uses_chunk_size else [None])]


def strategy_label(name: str, budget: int | None) -> str:
    """How a strategy and its budget are named everywhere: 'chunked (256)'; the name alone where it has none; a
    composed one with each part named, 'vllm-v1 · budget 512 · cadence interval:4' (compose.py)."""
    if "·" not in name:
        return f"{name} ({budget})" if budget else name
    return parse(name).label(budget)


__all__ = ["DEFAULT_BUDGET", "STRATEGIES", "Strategy", "compose", "configurations", "make_strategy", "split_spec", "strategy_label"]

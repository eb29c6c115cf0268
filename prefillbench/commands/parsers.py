"""The flags' value parsers: Typer callbacks that turn what was typed into values, or raise typer.BadParameter,
which names the flag in its one-line message.

List options arrive as one string per use of the flag (`-p 128,512 -p 1024`). Every list flag reads its values
alike: an empty item (`1,,2`, `,`) is a mistake, not a value to skip.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import typer

from prefillbench.bench.metrics import SLO
from prefillbench.report.compare import DEFAULT_METRICS, METRICS


def _items(texts: list[str] | None, what: str) -> list[str]:
    items = [v.strip() for text in texts or [] for v in text.split(",")]
    if not items or "" in items:
        raise typer.BadParameter(f"expected a comma-separated list of {what}, got {','.join(texts or [])!r}")
    return items


def _number_list(texts: list[str] | None, convert: type, what: str) -> list | None:
    """Comma lists and repeated flags, flattened: ["128,512", "1024"] -> [128, 512, 1024]; None when not given."""
    if not texts:
        return None
    try:
        return [convert(v) for v in _items(texts, what)]
    except ValueError:
        raise typer.BadParameter(f"expected a comma-separated list of {what}, got {','.join(texts)!r}") from None


def int_list(texts: list[str] | None) -> list[int] | None:
    return _number_list(texts, int, "integers")


def lengths(texts: list[str] | None) -> list[int] | None:
    """-p and -n: token counts, where 0 skips that kind of test (llama-bench's rule) and below 0 is a mistake."""
    values = int_list(texts)
    for v in values or []:
        if v < 0:
            raise typer.BadParameter(f"a length cannot be negative, got {v}")
    return values


def host_sizes(texts: list[str] | None) -> list[float] | None:
    """--kv-host-cache: GiB of host memory, 0 for no host tier; a list is one configuration per size."""
    values = _number_list(texts, float, "sizes in GiB")
    for v in values or []:
        if not (v >= 0 and v != float("inf")):
            raise typer.BadParameter(f"a host tier's size is 0 (none) or more GiB, got {v:g}")
    if values and len(set(values)) < len(values):
        raise typer.BadParameter(f"a size is listed twice: {','.join(texts)}")
    return values


def str_list(texts: list[str] | None) -> list[str] | None:
    return _items(texts, "names") if texts else None


def pp_tg_pairs(texts: list[str] | None) -> list[tuple[int, int]]:
    pairs = []
    for text in texts or []:
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            values = []
        if len(values) != 2 or min(values) < 1:
            raise typer.BadParameter(f"expected PP,TG with both above 0, got {text!r}")
        pairs.append((values[0], values[1]))
    return pairs


def budgets(texts: list[str] | None) -> list[int] | None:
    """tune's --chunk-size: values, comma lists and ranges LO:HI:xF or LO:HI:+D."""
    if not texts:
        return None
    try:
        return parse_budgets(texts)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def float_list(texts: list[str] | None) -> list[float] | None:
    return _number_list(texts, float, "numbers")


def slo_spec(text: str | None) -> SLO | None:
    if text is None or isinstance(text, SLO):
        return text
    try:
        return SLO.parse(text)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def percent(text: str | float) -> float:
    try:
        value = float(str(text).strip().rstrip("%"))
    except ValueError:
        raise typer.BadParameter(f"expected a percentage such as 10 or 10%, got {text!r}") from None
    if value < 0 or value != value:
        raise typer.BadParameter(f"expected a percentage of at least 0, got {text!r}")
    return value


def metric_list(texts: list[str] | None) -> list[str]:
    names = _items(texts, "metrics") if texts else []
    for n in names:
        if n not in METRICS:
            raise typer.BadParameter(f"unknown metric {n!r}; choose from {', '.join(METRICS)}")
    return list(dict.fromkeys(names)) or list(DEFAULT_METRICS)


def metrics_if_given(texts: list[str] | None) -> list[str] | None:
    return metric_list(texts) if texts else None


def choice(*values: str, hidden: tuple[str, ...] = ()) -> Callable[[Optional[str]], Optional[str]]:
    """A callback that takes one of `values` (or of `hidden`, not offered), and otherwise says which in one plain line."""

    def check(value: Optional[str]) -> Optional[str]:
        if value is not None and value not in values and value not in hidden:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(values)}")
        return value

    return check


def five_ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"expected P,N,C,R,CHUNK, got {text!r}") from None
    if len(values) != 5 or min(values) < 1:
        raise typer.BadParameter(f"expected five positive integers P,N,C,R,CHUNK, got {text!r}")
    return values


def parse_budgets(texts: list[str]) -> list[int]:
    """Token budgets: values, comma lists, and ranges LO:HI:xF (multiply) or LO:HI:+D (add): 64:4096:x2."""
    out: list[int] = []
    for text in texts:
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            if ":" not in part:
                out.append(_positive(part, part))
                continue
            pieces = part.split(":")
            if len(pieces) != 3 or pieces[2][:1] not in ("x", "+"):
                raise ValueError(f"bad budget range {part!r}: expected LO:HI:xFACTOR or LO:HI:+STEP, e.g. 64:4096:x2")
            lo, hi, step = _positive(pieces[0], part), _positive(pieces[1], part), pieces[2]
            amount = _positive(step[1:], part)
            if hi < lo or (step[0] == "x" and amount < 2):
                raise ValueError(f"bad budget range {part!r}: needs LO <= HI and a factor of at least 2")
            value = lo
            while value <= hi:
                out.append(value)
                value = value * amount if step[0] == "x" else value + amount
    if not out:
        raise ValueError("no token budget given")
    return list(dict.fromkeys(out))


def _positive(text: str, part: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"bad token budget {part!r}: {text!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"bad token budget {part!r}: must be at least 1")
    return value


def parse_slo_list(text: str) -> list[SLO]:
    """`tbt=50,100,200` (one key may take several values) -> one SLO per value, the other keys shared."""
    keys: list[tuple[str, list[str]]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "=" in part:
            key, _, value = part.partition("=")
            keys.append((key.strip(), [value.strip()]))
        elif keys:
            keys[-1][1].append(part)
        else:
            raise ValueError(f"bad SLO {text!r}: expected KEY=MS[,MS...] with KEY one of {', '.join(SLO.KEYS)}")
    listed = [k for k, values in keys if len(values) > 1]
    if len(listed) > 1:
        raise ValueError(f"only one SLO key may take a list of values, got lists for {' and '.join(listed)}")
    n = max((len(values) for _, values in keys), default=1)
    return [SLO.parse(",".join(f"{k}={values[min(i, len(values) - 1)]}" for k, values in keys)) for i in range(n)]

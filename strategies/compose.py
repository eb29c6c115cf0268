"""A scheduler is an engine's rules, a budget and a cadence: how the three are spelled, composed and named.

The rules (`-s`, a strategy of the registry with its settings: 'vllm-v1:threshold=512') keep their engine's admission,
memory, preemption or retraction and request order; the budget (`--budget`, budget.py) says how many tokens a step
may take; the cadence (`--cadence`, cadence.py) says on which steps prompts may run. One spelling carries all three
through every command, export and launch line (the spec):

    vllm-v1                                    the rules alone: a fixed budget (--chunk-size), prompts every step
    vllm-v1 · budget slo                       vLLM's rules, prefillbench's SLO budget
    sglang-mixed · cadence decode-rounds:4     SGLang's mixed chunk with its --prefill-decode-interval 4
    vllm-v1 · budget slo · cadence interval:4

and its label adds a fixed budget's size where there is one ('vllm-v1 · budget 512 · cadence interval:4'; the rules
alone keep their old label, 'vllm-v1 (512)').

Which engine ships which part: every engine a fixed budget; the slo budget none (prefillbench's own); interval:N vLLM
0.32 (vllm-v1's rules; a served vLLM applies it only with more than one data-parallel rank); decode-rounds:N SGLang
0.5.23 (sglang, sglang-mixed). Any other pairing runs on the sim, gguf and torch as prefillbench's own combination.
"""
from __future__ import annotations

from dataclasses import dataclass

from prefillbench.speculation import parse_spec, spec_label

from .budget import make_budget
from .cadence import make_cadence

#: Between the parts of a spec and a label.
SEP = " · "

#: The rules strategies whose engine ships each cadence (the others run it as prefillbench's own combination).
SHIPPED_CADENCES = {"interval": ("vllm-v1",), "decode-rounds": ("sglang", "sglang-mixed")}


@dataclass(frozen=True)
class Composition:
    """One scheduler: its rules (a registry name with settings), its budget's and its cadence's specs."""

    rules: str
    budget: str = "fixed"
    cadence: str = "every"
    #: Speculative decoding (--spec, prefillbench/speculation.py's text: 'ngram:3'), carried beside the parts so it
    #: reaches every command, row and launch line as they do; "off": none.
    speculation: str = "off"

    @property
    def spec(self) -> str:
        parts = [self.rules]
        if self.budget != "fixed":
            parts.append(f"budget {self.budget}")
        if self.cadence != "every":
            parts.append(f"cadence {self.cadence}")
        if self.speculation != "off":
            parts.append(f"spec {self.speculation}")
        return SEP.join(parts)

    def label(self, size: int | None) -> str:
        """How a row names it: the rules alone as before ('vllm-v1 (512)'), a composed one with each part named."""
        if self.speculation != "off":
            return SEP.join((Composition(self.rules, self.budget, self.cadence).label(size),
                             f"spec {self.speculation}"))
        if self.budget == "fixed" and self.cadence == "every":
            return f"{self.rules} ({size})" if size else self.rules
        budget = f"budget {size}" if self.budget == "fixed" and size else (
            "" if self.budget == "fixed" else f"budget {self.budget}")
        cadence = "" if self.cadence == "every" else f"cadence {self.cadence}"
        return SEP.join(p for p in (self.rules, budget, cadence) if p)


def normal_budget(spec: str) -> str:
    part = make_budget(spec)
    return "fixed" if part is None else part.spec


def normal_cadence(spec: str) -> str:
    part = make_cadence(spec)
    return "every" if part is None else part.spec


def parse(spec: str) -> Composition:
    """A spec as compose() writes it ('vllm-v1 · budget slo · cadence interval:4'), each part normalized
    (interval:1 is every step); ValueError naming what a part may be."""
    rules, *parts = [p.strip() for p in spec.split("·")]
    budget, cadence, speculation = "fixed", "every", "off"
    for part in parts:
        kind, _, value = part.partition(" ")
        if kind == "budget" and value:
            budget = normal_budget(value.strip())
        elif kind == "cadence" and value:
            cadence = normal_cadence(value.strip())
        elif kind == "spec" and value:
            speculation = spec_label(parse_spec(value.strip()))
        else:
            raise ValueError(f"strategy {spec!r}: {part!r} is not a part; write RULES · budget KIND · cadence KIND")
    return Composition(rules, budget, cadence, speculation)


def with_speculation(spec: str, speculation: str) -> str:
    """The scheduler `spec` with speculative decoding `speculation` (--spec's text; "off": none) as its spec part."""
    c = parse(spec)
    return Composition(c.rules, c.budget, c.cadence, spec_label(parse_spec(speculation))).spec


def compose(rules: str, budget: str = "fixed", cadence: str = "every") -> str:
    """The spec of `rules` with the budget and cadence given (as --budget and --cadence name them), parts normalized;
    a rules spec that already names a part keeps it unless this one is not the default."""
    given = parse(rules)
    budget = normal_budget(budget)
    cadence = normal_cadence(cadence)
    if given.rules.split(":")[0] == "slo-budget" and budget == "slo":
        budget = "fixed"  # slo-budget already is sarathi-serve's rules with the slo budget: one scheduler, once
    return Composition(given.rules, budget if budget != "fixed" else given.budget,
                       cadence if cadence != "every" else given.cadence, given.speculation).spec


def rules_of(spec: str) -> str:
    """The rules part of a spec, with their settings ('vllm-v1:threshold=512')."""
    return spec.split("·", 1)[0].strip()


def shipped(spec: str) -> str:
    """Which engine ships this combination, in words (for docs and notes)."""
    c = parse(spec)
    name = c.rules.split(":")[0]
    own = []
    if c.budget != "fixed":
        own.append(f"the {c.budget} budget")
    kind = c.cadence.split(":")[0]
    if c.cadence != "every" and name not in SHIPPED_CADENCES.get(kind, ()):
        own.append(f"the {kind} cadence under {name}'s rules")
    return "prefillbench's own: " + ", ".join(own) if own else "shipped by its engine"


_PACED: dict[type, type] = {}


def paced(cls: type) -> type:
    """The rules `cls` with a cadence: asked once a step whether prompts may run (`deferred` says it did not), told
    the step chosen. Rules that follow a cadence themselves (`native_cadence`: vllm-v1, sglang) read `deferred` and
    defer as their engine does; any other rules are offered no waiting prompt on a deferred step, so they run their
    decodes (prefillbench's own combination). The rules' name stays."""
    if cls not in _PACED:
        native = cls.native_cadence

        def next_step(self, waiting, running):
            self.deferred = not self.cadence.admits(running)
            step = cls.next_step(self, () if self.deferred and not native else waiting, running)
            self.cadence.after(step, waiting)
            return step

        _PACED[cls] = type(cls.__name__, (cls,), {"next_step": next_step, "__module__": cls.__module__,
                                                  "__doc__": cls.__doc__})
    return _PACED[cls]


__all__ = ["SEP", "SHIPPED_CADENCES", "Composition", "compose", "paced", "parse", "rules_of", "shipped"]

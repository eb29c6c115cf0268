"""docs/servers.md's "Past one machine" section, command by command: none of its engines can run here (no GPU, no
vLLM or SGLang), so what is checked is everything short of them. Every `--server-cmd` is the engine's preset with
parallelism flags added and fills into the command the page shows; every prefillbench command parses and passes
prefillbench's own checks (as far as loading a backend, which is not done); node 1's SGLang command carries what
prefillbench gives node 0; every engine flag the section uses has a source in a table of the page; and the `--url`
sweep runs as written against the stub server speaking vLLM's API, a stub per deployment."""
from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from prefillbench.backends.server.engines import ENGINES, PLACEHOLDERS, Engine, parse_template
from prefillbench.backends.server.process import ServerProcess, free_port
from test_docs import prose

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "servers.md"
HEADING = "## Past one machine: vLLM and SGLang across GPUs and nodes"


def section(text: str | None = None) -> str:
    """The section's text: from its heading to the next heading of its level, or the end."""
    text = PAGE.read_text() if text is None else text
    start = text.index(HEADING)
    following = re.search(r"^## ", text[start + len(HEADING):], re.M)
    return text[start:start + len(HEADING) + following.start()] if following else text[start:]


def commands(text: str) -> list[list[str]]:
    """The commands of the fenced shell blocks, each as its words: continuation lines joined, comments and
    variable assignments (`export X=...`, `X=... cmd`) dropped."""
    out, block, fenced = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if fenced:
                joined = "\n".join(block).replace("\\\n", " ")
                for command in joined.splitlines():
                    words = shlex.split(command, comments=True)
                    if words and words[0] == "export":
                        continue
                    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
                        words = words[1:]
                    if words:
                        out.append(words)
                block = []
            fenced = not fenced
        elif fenced:
            block.append(line)
    return out


def option(words: list[str], name: str) -> str | None:
    """The value of `name` in a command's words (the last one given), or None."""
    values = [words[i + 1] for i, w in enumerate(words[:-1]) if w == name]
    return values[-1] if values else None


def flag_pairs(words: list[str]) -> list[tuple[str, str | None]]:
    """An engine command's flags and values, in order, after the program and its positional arguments."""
    pairs, i = [], next((i for i, w in enumerate(words) if w.startswith("--")), len(words))
    while i < len(words):
        flag = words[i]
        value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
        pairs.append((flag, value))
        i += 2 if value is not None else 1
    return pairs


SECTION = section()
COMMANDS = commands(SECTION)
PREFILLBENCH = [c for c in COMMANDS if c[0] == "prefillbench"]
LAUNCHING = [c for c in PREFILLBENCH if "--server-cmd" in c]
AT_URL = [c for c in PREFILLBENCH if "--url" in c]
#: The flags the section's templates add to a preset: the parallelism, and where it reaches another node.
PARALLEL = {"vllm": {"--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
                     "--enable-expert-parallel", "--distributed-executor-backend", "--nnodes", "--node-rank",
                     "--master-addr"},
            "sglang": {"--tp", "--pp-size", "--dp", "--ep-size", "--nnodes", "--node-rank", "--dist-init-addr"}}


def launched(words: list[str], port: int = 41234, budget: int | None = 2048, slots: int = 200) -> list[str]:
    """What prefillbench runs for a documented command with --server-cmd: the template as backend.load takes it, the
    strategy's flags after it."""
    preset = ENGINES[option(words, "--engine")]
    engine = Engine(preset.name, parse_template(option(words, "--server-cmd")), preset.api, preset.health_path,
                    preset.strategies, preset.default_strategy, preset.default_budget)
    return engine.argv(strategy_of(words), {"model": option(words, "-m"), "port": port, "budget": budget,
                                            "slots": slots, "threads": 8, "ctx": 8192, "bin": None})


def strategy_of(words: list[str]) -> str:
    """The strategy a documented command runs: its -s, else its engine's own (the preset's default)."""
    return option(words, "-s") or ENGINES[option(words, "--engine")].default_strategy


def test_the_section_holds_the_deployments_it_promises():
    kinds = {(c[1], option(c, "--engine"), "--url" in c) for c in PREFILLBENCH}
    assert {("tune", "vllm", False), ("tune", "sglang", False), ("capacity", "sglang", False),
            ("capacity", "vllm", True), ("compare", None, False)} <= kinds
    templates = [option(c, "--server-cmd") for c in LAUNCHING]
    assert any("--tensor-parallel-size 8" in t and "--pipeline-parallel-size" not in t for t in templates)
    assert any("--pipeline-parallel-size 2" in t and "--distributed-executor-backend ray" in t for t in templates)
    assert any("--nnodes 2" in t and "--node-rank 0" in t and "sglang" in t for t in templates)
    assert len(AT_URL) >= 2
    assert "this project's machines" in SECTION and "(#what-one-client-machine-can-drive)" in SECTION


@pytest.mark.parametrize("words", PREFILLBENCH, ids=lambda w: " ".join(w[1:4]))
def test_every_prefillbench_command_parses_and_passes_its_checks(words):
    """Every flag exists (the parser refuses an unknown one) and the options are valid as the command would take
    them: tune on vLLM needs --no-sim, --url refuses --chunk-size, a strategy the engine cannot express is refused..."""
    from typer.main import get_command

    from prefillbench.cli import app
    from prefillbench.commands.options import CapacityOptions, CompareOptions, TuneOptions

    name, args = words[1], words[2:]
    command = get_command(app).commands[name]
    ctx = command.make_context(name, list(args))
    options = {"tune": TuneOptions, "capacity": CapacityOptions, "compare": CompareOptions}[name]
    options.from_flags(**ctx.params)


@pytest.mark.parametrize("words", LAUNCHING, ids=lambda w: option(w, "--export"))
def test_every_template_is_its_engines_preset_with_parallel_flags(words):
    engine = option(words, "--engine")
    assert engine in PARALLEL, "a template without --engine vllm|sglang would be taken for llama-server's API"
    template = parse_template(option(words, "--server-cmd"))
    preset, cache_off = ENGINES[engine].template, ENGINES[engine].cache_off
    assert all(f in template for f in cache_off), "no prefix cache, as the preset launches by default"
    template = tuple(w for w in template if w not in cache_off)
    assert template[:len(preset)] == preset, "the preset's command first: its host, port and slots"
    added = {f for f, _ in flag_pairs(list(template[len(preset):]))}
    assert added <= PARALLEL[engine], f"flags beyond the parallelism: {added - PARALLEL[engine]}"
    argv = launched(words)
    assert "{" not in " ".join(argv), "every placeholder filled"
    assert argv[argv.index("--port") + 1] == "41234" and argv[argv.index("--host") + 1] == "127.0.0.1"
    strategy = ENGINES[engine].expression(strategy_of(words)).flags
    assert argv[-len(strategy):] == [f.replace("{budget}", "2048") for f in strategy]
    # the engine's own default configuration: its budget flag goes, with its value
    assert "2048" not in launched(words, budget=None)


def test_the_launch_shown_is_what_prefillbench_runs():
    shown = [c for c in COMMANDS if c[:2] == ["vllm", "serve"]]
    assert len(shown) == 1
    tp8 = next(c for c in LAUNCHING if "--tensor-parallel-size 8" in option(c, "--server-cmd")
               and "--pipeline-parallel-size" not in option(c, "--server-cmd"))
    assert int(option(tp8, "--requests")) == int(option(shown[0], "--max-num-seqs"))  # slots: a probe's requests
    assert option(shown[0], "--max-num-batched-tokens") in option(tp8, "--chunk-size").split(",")  # a budget tuned
    assert launched(tp8, port=int(option(shown[0], "--port")), budget=int(option(shown[0], "--max-num-batched-tokens")),
                    slots=int(option(tp8, "--requests"))) == shown[0]


def test_node_1_is_started_with_what_prefillbench_gives_node_0():
    head = next(c for c in LAUNCHING if "--node-rank 0" in option(c, "--server-cmd"))
    node1 = [c for c in COMMANDS if c[0] == "python" and "--node-rank" in c]
    assert len(node1) == 1
    budget = int(option(head, "--chunk-size"))
    slots = int(option(head, "-c"))
    assert int(option(head, "--requests")) >= slots  # else a probe's requests, fewer, would set the slots
    ignored = {"--node-rank", "--host", "--port"}
    ours = sorted(p for p in flag_pairs(launched(head, budget=budget, slots=slots)) if p[0] not in ignored)
    theirs = sorted(p for p in flag_pairs(node1[0]) if p[0] not in ignored)
    assert ours == theirs
    assert option(node1[0], "--node-rank") == "1" and node1[0][:3] == launched(head)[:3]


def test_every_engine_flag_the_section_uses_has_a_source():
    """Each flag of an engine's command (templates, node 1's, inline ones such as the router's) is in a row of one of
    the page's tables, and every row of the section's table names its source."""
    rows = [line for line in prose(PAGE.read_text()) if line.startswith("|")]
    ours = [line for line in prose(SECTION) if line.startswith("| `")]
    assert ours and all("http" in row or "the same page" in row for row in ours)
    engine_commands = [list(parse_template(option(c, "--server-cmd"))) for c in LAUNCHING]
    engine_commands += [c for c in COMMANDS if c[0] != "prefillbench"]
    engine_commands += [shlex.split(code) for code in re.findall(r"`((?:python -m sglang|vllm serve|ray start)[^`]*)`",
                                                                 SECTION.replace("\n", " "))]
    flags = {w.split("=")[0] for c in engine_commands for w in c if w.startswith("--")}
    flags |= {f for words in LAUNCHING for f in ENGINES[option(words, "--engine")].expression(strategy_of(words)).flags
              if f.startswith("--")}
    uncited = sorted(f for f in flags if not any(re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", row) for row in rows))
    assert not uncited, uncited


def test_the_templates_use_no_placeholder_the_engine_fills_wrongly():
    for words in LAUNCHING:
        names = set(re.findall(r"\{([a-z_]+)\}", option(words, "--server-cmd")))
        assert names <= set(PLACEHOLDERS) and {"model", "port", "slots"} <= names


# ---------------------------------------------------------------- the --url sweep, against stubs


STUB = [sys.executable, "-m", "prefillbench.backends.server.stub"]


def test_the_url_sweep_runs_as_written_against_a_stub_per_deployment(run_cli, tmp_path, monkeypatch):
    """The section's capacity --url commands, each against a stub speaking vLLM's API and serving the model under
    the name -m gives (any other name is a 404 there, as on vLLM), with the test's shape made small; then its
    compare, as written, on their exports. The two stubs differ as two budgets would: the second's steps slower."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PREFILLBENCH_API_KEY", "sk-not-recorded")
    compare = next(c for c in PREFILLBENCH if c[1] == "compare")
    assert [option(c, "--export") for c in AT_URL] == compare[2:4]
    servers = []
    try:
        for pace in (2.0, 6.0):
            port = free_port()
            server = ServerProcess([*STUB, "--port", str(port), "--token-ms", str(pace), "--ms-per-running", "1",
                                    "--served-model-name", option(AT_URL[0], "-m")], f"http://127.0.0.1:{port}/health")
            server.start()
            servers.append((server, port))
        for words, (_, port) in zip(AT_URL, servers):
            args = list(words[1:])
            args[args.index("--url") + 1] = f"http://127.0.0.1:{port}"
            args[args.index("--pg") + 1] = "16,12"
            args[args.index("--requests") + 1] = "40"
            args[args.index("--slo") + 1] = "tbt=15"
            code, out, err = run_cli(*args, "--precision", "50", "--start-rate", "8", "--no-progress")
            assert code == 0, err
            rows = json.loads(Path(option(words, "--export")).read_text())["results"]
            assert rows and all(r.get("failed_requests", 0) == 0 for r in rows), rows  # -m named the served model
            assert "sk-not-recorded" not in Path(option(words, "--export")).read_text() + out + err
        code, out, err = run_cli(*compare[1:])
        assert code in (0, 1), err  # 1: the slower deployment holds less, beyond the threshold
        assert "cross-backend comparison" in err and "capacity req/s" in out and "TBT" in out
        # each deployment's rows are labelled as served (its own configuration), never a strategy it was not given
        table = [line for line in out.splitlines() if "as served" in line]
        assert len(table) == 1 and "sarathi-serve" not in out  # the two deployments' rows joined: one line
    finally:
        for server, _ in servers:
            server.stop()

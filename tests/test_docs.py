"""The README and docs/ stay navigable: every relative link lands on a file (and a heading, when it names one),
the README stays a first screen, and it names every strategy and every command the CLI has."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks: a `#` in a shell block is no heading, a `[x](y)` in a table dump no link."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(page.read_text()):
        m = re.match(r"^#{1,6} (.+)$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    return [m.group(1) for line in prose(page.read_text()) for m in LINK.finditer(re.sub(r"`[^`]*`", "", line))]


def test_slug_matches_githubs_rule():
    assert slug("Verification (`--verify`)") == "verification---verify"
    assert slug("The torch backend against this machine's limits") == "the-torch-backend-against-this-machines-limits"
    assert slug("Capacity (`prefillbench capacity`)") == "capacity-prefillbench-capacity"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Top\n\n[ok](p.md#top) [gone](missing.md) [bad](p.md#nowhere)\n```\n[code](ignored.md)\n```\n")
    assert links(page) == ["p.md#top", "missing.md", "p.md#nowhere"]
    assert anchors(page) == {"top"}


def test_the_readme_is_a_first_screen():
    assert len((ROOT / "README.md").read_text().splitlines()) < 150


def test_the_readme_links_every_strategy_module():
    from strategies import STRATEGIES

    text = (ROOT / "README.md").read_text()
    for name, cls in STRATEGIES.items():
        module = cls.__module__.split(".")[-1]
        assert f"[**{name}**](strategies/{module}.py)" in text, name


def test_the_readme_names_every_command():
    from typer.main import get_command

    from prefillbench.cli import app

    text = (ROOT / "README.md").read_text()
    for name in get_command(app).commands:
        assert f"`prefillbench {name}`" in text, name


#: Paths the pages name that a run or the reader creates: exports under results/, the workflow ci.md tells you to save.
CREATED = ("results/", ".github/workflows/")
CODE_PATH = re.compile(r"`([\w./-]+/[\w.-]+\.(?:py|c|h|sh|md|csv|json|yml|yaml))`")


def named_paths(page: Path) -> list[str]:
    return [m.group(1) for line in prose(page.read_text()) for m in CODE_PATH.finditer(line)]


def missing_paths(page: Path) -> list[str]:
    return [p for p in named_paths(page) if not p.startswith(CREATED)
            and not any((base / p).exists() for base in (ROOT, ROOT / "prefillbench"))]


@pytest.mark.parametrize("page", [p for p in PAGES if "history" not in p.parts],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_the_docs_name_exists(page):
    """Today's pages name today's files (paths from the repository root, or inside prefillbench/); the dated
    history keeps the names of its time and maps them in docs/history/README.md."""
    missing = missing_paths(page)
    assert not missing, f"{page.relative_to(ROOT)} names files that are not there: {missing}"


def test_the_path_check_sees_a_stale_name(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("`prefillbench/backends/torch_linear.py`, `backends/torch/linear.py`, `results/run.csv`\n"
                    "```\n`ignored/in_code.py`\n```\n")
    assert missing_paths(page) == ["prefillbench/backends/torch_linear.py"]


def undocumented_options(command, text: str) -> list[str]:
    """The options of a click command none of whose spellings appear in `text` as a whole word."""
    missing = []
    for param in command.params:
        spellings = [o for o in (*param.opts, *param.secondary_opts) if o.startswith("-")]
        if spellings and not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text) for o in spellings):
            missing.append(spellings[0])
    return missing


def test_usage_documents_every_option_of_the_commands_it_covers():
    """docs/usage.md's flag reference holds every option of each command it has a section for."""
    from typer.main import get_command

    from prefillbench.cli import app

    text = (ROOT / "docs" / "usage.md").read_text()
    covered = set(re.findall(r"^### `prefillbench (\w+)", text, re.M))
    commands = get_command(app).commands
    assert {"run", "capacity", "compare", "plot", "ab", "calibrate"} <= covered <= set(commands)
    missing = {name: undocumented_options(commands[name], text) for name in covered}
    assert not any(missing.values()), missing


def test_the_option_check_sees_an_undocumented_flag():
    import click

    command = click.Command("x", params=[click.Option(["--kept"]), click.Option(["-z", "--zap"])])
    assert undocumented_options(command, "`--kept` and `--kept-more`, `--zapper`") == ["-z"]


def shown_commands(text: str) -> list[list[str]]:
    """The `prefillbench` commands a page shows, each as its words: the lines of its fenced blocks (continuations
    joined, comments dropped) and its inline code spans that give a command arguments."""
    out, block, fenced = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if fenced:
                lines = "\n".join(block).replace("\\\n", " ").splitlines()
                out += [shlex.split(c, comments=True) for c in lines if c.startswith("prefillbench ")]
                block = []
            fenced = not fenced
        elif fenced:
            block.append(line)
        else:
            out += [shlex.split(span) for span in re.findall(r"`(prefillbench [^`]+)`", line)]
    return [words for words in out if words[:1] == ["prefillbench"] and len(words) > 2]


def test_shown_commands_reads_blocks_and_spans():
    text = ("`prefillbench run` alone, `prefillbench run -c 4`\n```sh\nprefillbench tune --quick  # isn't run\n"
            "prefillbench capacity --slo tbt=1 \\\n    -s chunked\nmake run\n```\n```\n| it's output |\n```\n")
    assert shown_commands(text) == [["prefillbench", "run", "-c", "4"], ["prefillbench", "tune", "--quick"],
                                    ["prefillbench", "capacity", "--slo", "tbt=1", "-s", "chunked"]]


README_COMMANDS = shown_commands((ROOT / "README.md").read_text())


def test_the_readme_shows_an_example_of_every_command():
    from typer.main import get_command

    from prefillbench.cli import app

    assert set(get_command(app).commands) <= {words[1] for words in README_COMMANDS}


@pytest.mark.parametrize("words", README_COMMANDS, ids=lambda w: " ".join(w[1:5]))
def test_every_readme_command_parses_and_passes_its_checks(words):
    """Every flag a README example uses exists and takes the value given (the parser refuses the rest), and where
    the command's options check their flags without reading files or loading a model, they pass."""
    from typer.main import get_command

    from prefillbench.cli import app, flags
    from prefillbench.commands.options import CalibrateOptions, CapacityOptions, RunOptions, TuneOptions

    name, args = words[1], words[2:]
    if name == "ab" and "--" in args:  # what follows `--` is what both sides run: a `run` command's flags
        test_every_readme_command_parses_and_passes_its_checks(["prefillbench", "run", *args[args.index("--") + 1:]])
    ctx = get_command(app).commands[name].make_context(name, list(args))
    checked = {"run": RunOptions, "capacity": CapacityOptions, "tune": TuneOptions, "calibrate": CalibrateOptions}
    if name in checked:
        checked[name].from_flags(**flags(ctx.params))

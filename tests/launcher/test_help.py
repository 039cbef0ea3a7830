"""Every command's ``--help`` reads in a terminal of 80 columns and says what is true, as the docs' examples do.

Each command of the tree (the root, every command and subcommand) is rendered as a user sees it. At 80 columns
every description gets at least 40 of them; no sentence is cut by a line break the source kept; every option a
help text names exists where the text says; every signal it names is one distlaunch uses for what the text says;
and ``train --help`` (like ``run --help``) shows its most used options on its first screen."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
import typer

from distlaunch import interrupts
from distlaunch.cli import groups as g
from distlaunch.cli import panels
from distlaunch.cli.app import app
from distlaunch.cli.commands import COMMANDS, load
from distlaunch.cli.helppage import paragraphs
from distlaunch.contract.options import DEFAULT_SAVE_SIGNAL
from tests.helpers import invoke

ROOT = Path(__file__).resolve().parents[2]


def _tree() -> dict[tuple[str, ...], typer.core.TyperCommand]:
    """Every command by its path: () is distlaunch itself, ("slurm", "run") is distlaunch slurm run."""
    found = {(): typer.main.get_command(app)}

    def walk(path: tuple[str, ...], command) -> None:
        found[path] = command
        for name, sub in getattr(command, "commands", {}).items():
            walk((*path, name), sub)

    for name in COMMANDS:
        walk((name,), load(name))
    return found


TREE = _tree()
PATHS = list(TREE)


def _id(path: tuple[str, ...]) -> str:
    return " ".join(path) or "distlaunch"


def _help(path: tuple[str, ...], columns: int) -> str:
    r = invoke([*path, "--help"], env={"COLUMNS": str(columns)})
    assert r.exit_code == 0, r.stderr
    return r.stdout


def _params(command) -> list:
    return [p for p in command.params if not getattr(p, "hidden", False) and p.help]


def _texts(path: tuple[str, ...]) -> list[tuple[str, str]]:
    """What ``path``'s help says, in pieces: each paragraph of its own text, each parameter's help (by its name)."""
    command = TREE[path]
    own = COMMANDS[path[0]].help if len(path) == 1 else None  # the root's listing of it
    texts = [("", text) for text in paragraphs(command.help)] + ([("", own)] if own else [])
    return texts + [(param.name, " ".join(param.help.split())) for param in _params(command)]


@pytest.mark.parametrize("path", PATHS, ids=_id)
def test_every_description_gets_40_columns_at_80(path):
    text = _help(path, 80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    command = TREE[path]
    described = [param.help for param in _params(command)]
    described += [sub.short_help or sub.help or "" for sub in getattr(command, "commands", {}).values()]
    for help_text in filter(None, described):
        start = " ".join(paragraphs(help_text)[0].split()[:3])  # where its description begins
        line = next((line for line in lines if start in line), None)
        assert line is not None, f"{start!r} not found in:\n{text}"
        right = 2 if line.rstrip().endswith("│") else 0  # a panel's border and padding
        assert 80 - right - line.index(start) >= 40, f"{_id(path)}: {start!r} starts at {line.index(start)}"


SENTENCE_END = (".", ")", "]", "!", "?")


@pytest.mark.parametrize("path", PATHS, ids=_id)
def test_no_help_text_breaks_a_sentence(path):
    """A paragraph ends a sentence: a blank line inside one would show as a line break in it."""
    for name, text in _texts(path):
        assert text.endswith(SENTENCE_END), f"{_id(path)} {name}: {text!r} ends mid-sentence"


@pytest.mark.parametrize("path", PATHS[1:], ids=_id)
def test_a_wide_terminal_shows_each_paragraph_on_one_line(path):
    """A single newline in a help text's source is a space: at 1000 columns no line ends mid-sentence (names
    too long to share a line with their description stand alone)."""
    for line in _help(path, 1000).splitlines():
        shown = line.strip().strip("│").strip()
        names_alone = shown.startswith("-") and "  " not in shown
        if not shown or names_alone or shown.startswith(("Usage:", "╭", "╰")):
            continue
        assert shown.endswith(SENTENCE_END), f"{_id(path)}: {shown!r} ends mid-sentence"


# Another program's options a help text may cite, named before them: "srun --kill-on-bad-exit=1".
FOREIGN = r"(?:srun|sbatch|#SBATCH|kubectl apply|python)"
OPTION = re.compile(r"(?<![\w\-=/.])(--?[a-zA-Z][\w-]*)")


def _names(command) -> set[str]:
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)}


def _named_commands(text: str) -> list[tuple[str, ...]]:
    """The commands a text names as ``distlaunch CMD`` (or ``distlaunch GROUP CMD``)."""
    return [path for path in TREE if path and re.search(rf"\bdistlaunch {' '.join(path)}\b", text)]


@pytest.mark.parametrize("path", PATHS, ids=_id)
def test_every_option_a_help_names_exists(path):
    for name, text in _texts(path):
        known = _names(TREE[path]).union(*(_names(TREE[other]) for other in _named_commands(text)))
        for option in OPTION.findall(text):
            if option in known or re.search(rf"{FOREIGN} {re.escape(option)}\b", text):
                continue
            pytest.fail(f"{_id(path)} {name}: {text!r} names {option}, which it does not take")


STOPS = {sig.name.removeprefix("SIG") for sig in interrupts.CAUGHT}  # INT, TERM, HUP: they stop a job
SIGNAL = re.compile(r"\bSIG([A-Z0-9]+)\b|\b(USR1|USR2|INT|TERM|HUP|KILL|WINCH)\b")


def _signals(text: str) -> set[str]:
    return {a or b for a, b in SIGNAL.findall(text)}


@pytest.mark.parametrize("path", PATHS, ids=_id)
def test_every_signal_a_help_names_does_what_it_says(path):
    for name, text in _texts(path):
        named = _signals(text)
        where = f"{_id(path)} {name}: {text!r}"
        if name != "forward_signals":  # its examples are any signals the user picks
            assert named <= STOPS | {DEFAULT_SAVE_SIGNAL, "KILL"}, f"{where}: a signal distlaunch does not use"
        if DEFAULT_SAVE_SIGNAL in named:  # the save signal asks for a checkpoint, and nothing else
            assert "save" in text, f"{where}: SIG{DEFAULT_SAVE_SIGNAL} is the save signal"
        if "KILL" in named:  # every stop starts with SIGTERM, SIGKILL only ends it
            assert "TERM" in named, f"{where}: SIGKILL without the SIGTERM before it"
        for listed in re.findall(r"((?:[A-Z]+, )*[A-Z]+ and [A-Z]+) stop the job", text):
            assert set(re.split(r", | and ", listed)) == STOPS, f"{where}: the stopping signals are {STOPS}"
        for codes in re.findall(r"(\d+)/(\d+)(?:/(\d+))? after Ctrl-C / SIGTERM", text):
            wanted = (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP)
            assert [int(c) for c in codes if c] == list(wanted[: len([c for c in codes if c])]), where


@pytest.mark.parametrize("path", [("train",), ("run",)], ids=_id)
def test_the_most_used_options_are_on_the_first_screen(path):
    head = "\n".join(_help(path, 80).splitlines()[:40])
    for option in panels.MOST_USED:
        if option in _names(TREE[path]):
            assert option in head, f"{option} is not in the first 40 lines of {_id(path)} --help:\n{head}"


def test_every_shared_option_has_a_panel():
    """run's and train's options are grouped by what a person looks for first: an option added without a panel
    would land in the generic one, after them all."""
    for opt in (*g.PROGRAM, *g.LAUNCH_OPTIONS, *g.NODE_OPTIONS):
        info = opt.annotation.__metadata__[0]
        if isinstance(info, typer.models.OptionInfo) and not info.hidden:
            assert info.rich_help_panel in panels.PANELS, f"{opt.name}: no panel of panels.PANELS"


@pytest.mark.parametrize("path", PATHS, ids=_id)
def test_every_value_says_what_goes_there(path):
    """No TEXT or NUMBER for a value, and seconds are SECONDS everywhere."""
    command = TREE[path]
    ctx = typer.Context(command)
    for param in _params(command):
        if param.param_type_name != "option" or param.is_flag:
            continue
        shown = param.display_type_rich(ctx)
        assert shown not in ("TEXT", "NUMBER"), f"{_id(path)} {param.opts[-1]}: its value is shown as {shown}"
        if "seconds" in param.help.lower():
            assert shown == "SECONDS", f"{_id(path)} {param.opts[-1]}: a number of seconds shown as {shown}"


def test_the_reference_synopsis_names_every_option_of_distlaunch():
    synopsis = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8").split("```")[1]
    for param in TREE[()].params:
        shown = [name for name in param.opts if re.search(rf"(?<![\w-]){name}(?![\w-])", synopsis)]
        assert shown, f"docs/cli.md's synopsis lacks {' or '.join(param.opts)}"

"""A command's ``--help`` laid out for a terminal of 80 columns.

typer draws an option's long names, short names, value and description in four table columns, which leave the
description about 24 characters at 80 columns: a sentence takes ten lines. Here an option is its names and value,
then its description in one column of at least 40 characters, beside the names when they fit before it, else
under them (as git and cargo print it). Options come in panels by what a person looks for first
(panels.py), the most used first in theirs. The command's first paragraph is on top and the rest (what
it does in detail, its exit codes) under the options: the options a person came for are on the first screen.

Imported when a command's help is drawn: rich is no cost to ``distlaunch --help`` or to a command that runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from distlaunch.cli import panels

TEXT_MIN = 40  # the narrowest a description column gets
NAMES_MAX = 28  # the widest the names column gets: longer names take a line of their own
FRAME = 4  # a panel's border and padding, both sides


@dataclass(frozen=True)
class Row:
    """One line of a panel: what to type (an option's names and value, an argument, a subcommand) and what it does."""

    names: str
    text: str


def paragraphs(help_text: str | None) -> list[str]:
    """A help text's paragraphs, each one line: a single newline in the source is a space (as click and Markdown
    read it), a blank line starts a paragraph, and ``\\f`` ends what is shown."""
    body = inspect.cleandoc(help_text or "").partition("\f")[0]
    return [" ".join(part.split()) for part in body.split("\n\n") if part.strip()]


def grouped_rows(command, ctx) -> dict[str, list[Row]]:
    """The visible parameters of ``command`` (and a group's subcommands) by panel, in the order shown."""
    found: dict[str, list[tuple[bool, Row]]] = {}
    params = [param for param in command.get_params(ctx) if not getattr(param, "hidden", False)]
    indent = "    " if any(_short(param) for param in params) else ""  # long-only names line up with the long ones
    for param in params:
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, text = record
        if param.param_type_name == "option" and not _short(param):
            names = indent + names
        default = panels.ARGUMENTS if param.param_type_name == "argument" else panels.OTHER
        panel = getattr(param, "rich_help_panel", None) or default
        first = any(name in panels.MOST_USED for name in param.opts)
        found.setdefault(panel, []).append((first, Row(names, " ".join(text.split()))))
    for name, text in _subcommands(command, ctx):
        found.setdefault(panels.COMMANDS, []).append((False, Row(name, text)))
    ordered = sorted(found, key=panels.panel_rank)
    return {panel: [row for _, row in sorted(found[panel], key=lambda pair: not pair[0])] for panel in ordered}


def _short(param) -> bool:
    return any(not opt.startswith("--") for opt in getattr(param, "opts", ()))


def _subcommands(command, ctx) -> Iterable[tuple[str, str]]:
    if not hasattr(command, "list_commands"):
        return
    for name in command.list_commands(ctx):
        sub = command.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            yield name, (paragraphs(sub.short_help or sub.help) or [""])[0]


def names_column(rows: Iterable[Row], width: int) -> int:
    """Where descriptions start in a panel ``width`` wide: after the longest names that fit, leaving the
    description at least ``TEXT_MIN`` (a narrower terminal puts every description under its names)."""
    longest = max((len(row.names) for row in rows if len(row.names) <= NAMES_MAX), default=0)
    return max(2, min(longest + 2, NAMES_MAX + 2, width - TEXT_MIN))


def _drawn(row: Row, column: int) -> list[RenderableType]:
    names = Text(row.names, no_wrap=True)
    names.highlight_regex(r"(?<![\w-])--?[\w-]+", "bold cyan")
    text = Text(row.text)
    text.highlight_regex(r"\[(default|required)[^\]]*\]", "dim")
    grid = Table.grid(expand=True)
    grid.add_column(width=column, no_wrap=True)
    grid.add_column(ratio=1)
    if len(row.names) + 2 <= column:
        grid.add_row(names, text)
        return [grid]
    grid.add_row("", text)
    return [names, grid]


def show(command, ctx, console: Console) -> None:
    """Print ``command``'s help: usage, first paragraph, the panels, then the rest of its help text."""
    texts = paragraphs(command.help)
    console.print(Padding(Text(command.get_usage(ctx), style="bold"), (0, 1, 1, 1)))
    if texts:
        console.print(Padding(Text(texts[0]), (0, 1, 1, 1)))
    grouped = grouped_rows(command, ctx)
    column = names_column((row for rows in grouped.values() for row in rows), console.width - FRAME)
    for title, rows in grouped.items():
        body = Group(*(part for row in rows for part in _drawn(row, column)))
        console.print(Panel(body, title=title, title_align="left", border_style="dim"))
    for text in texts[1:]:
        console.print(Padding(Text(text), (1, 1, 0, 1)))

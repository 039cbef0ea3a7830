"""Long values (commands, paths) on lines of their own, fitted to the terminal without cutting a word.

A table cell narrower than a path folds it anywhere (``train-ti│ny-cpu.toml``), and a line rich wraps breaks a
command into pieces a shell no longer takes. So a value too long for the line it would end goes below its label,
a command is filled into lines at its arguments with shell continuations (`` \\``: it still pastes into a shell),
and every such line is printed as it is (soft wrap): a word longer than the whole width stays one word, for the
terminal to wrap and to copy whole.
"""

from __future__ import annotations

import shlex

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

CONTINUATION = " \\"


def command_lines(argv: list[str], width: int, first: str, indent: str) -> list[str]:
    """``argv`` as a shell command, after ``first`` on its first line and ``indent`` on the others, each line at
    most ``width`` columns where its arguments allow; every line but the last ends in a continuation."""
    words = [shlex.quote(arg) for arg in argv]
    lines, line, empty = [], first, True
    for i, word in enumerate(words):
        room = width - (0 if i == len(words) - 1 else len(CONTINUATION))
        if not empty and cell_len(line) + 1 + cell_len(word) > room:
            lines.append(line + CONTINUATION)
            line, empty = indent, True
        line, empty = (line + word if empty else f"{line} {word}"), False
    return [*lines, line.rstrip()]


def print_command(console: Console, argv: list[str], label: str, indent: str = "  ") -> None:
    """``label`` and the command, filled into continued lines of the console's width."""
    first = f"{indent}{label} "
    for line in command_lines(argv, console.width, first, " " * len(first)):
        console.print(Text(line), soft_wrap=True)


def print_value(console: Console, label: str, value: str, indent: str = "  ") -> None:
    """``label value`` on one line where it fits, else the label on its line and the value indented below it."""
    line = f"{indent}{label} {value}"
    if cell_len(line) <= console.width:
        console.print(Text(line), soft_wrap=True)
        return
    console.print(Text(f"{indent}{label}"), soft_wrap=True)
    console.print(Text(f"{indent}  {value}"), soft_wrap=True)


def print_clauses(console: Console, clauses: list[Text], indent: int = 2) -> None:
    """``clauses`` joined by commas, a line broken only between two of them (``backend gloo`` never splits in two),
    the lines after the first indented."""
    line = Text()
    for i, clause in enumerate(clauses):
        piece = clause + ("," if i < len(clauses) - 1 else "")
        if line.cell_len and line.cell_len + 1 + piece.cell_len > console.width:
            console.print(line, soft_wrap=True)
            line = Text(" " * (indent - 1))
        line = Text.assemble(line, " " if line.cell_len else "", piece)
    console.print(line, soft_wrap=True)


def print_indented(console: Console, text: Text | str, indent: int = 2) -> None:
    """Text wrapped at its spaces to the console's width, every line (the wrapped ones too) indented; a word
    longer than a whole line is folded, as any terminal would."""
    text = Text(text) if isinstance(text, str) else text
    for line in text.wrap(console, max(console.width - indent, 20), overflow="fold"):
        line.rstrip()
        console.print(Text.assemble(" " * indent, line), soft_wrap=True)

"""``--help`` that names values the way a man page does (PATH, N, SPEC), with no Python type names, and groups
its options by what a person looks for first (panels.py).

typer prints each parameter's Python type beside it (``<bool>`` for a flag, ``<list[str]>`` for the program)
and wraps a required argument in braces in the usage line (``{program}...``). A user reads "what do I type
here", so: an option shows its metavar, a flag shows nothing, any other value a plain upper-case word, and
an argument's name alone says what it is. Applied once, when the CLI is built; a command's help is drawn by
helppage.py.
"""

from __future__ import annotations

import re

try:  # typer >= 0.22 carries its own parameter classes
    from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
except ImportError:  # pragma: no cover
    TyperArgument = TyperCommand = TyperGroup = TyperOption = None

_WORDS = {"str": "TEXT", "int": "N", "int range": "N", "float": "NUMBER", "float range": "NUMBER", "path": "PATH"}


def value_word(type_label: str | None) -> str | None:
    """``<list[str]>`` → ``TEXT``, ``<gloo|nccl>`` → ``gloo|nccl``, ``<path>`` → ``PATH``."""
    if not type_label:
        return None
    label = re.sub(r"^list\[(.*)\]$", r"\1", type_label.strip("<>"))
    return label if "|" in label else _WORDS.get(label, label.upper())


def _option_type(self, ctx) -> str | None:
    if self.metavar is not None:
        return self.metavar
    if self.is_flag or self.count:
        return None
    return value_word(self.display_type(ctx))


def _argument_usage(self) -> str:
    name = self.display_name_raw
    name = name if self.required else f"[{name}]"
    return name + ("..." if self.nargs != 1 else "")


def _drawn_by_helppage(original):
    """``format_help`` for typer's commands and groups: helppage's layout, or click's plain one where the command
    asks for no rich markup (the root group: its listing imports no rich)."""

    def format_help(self, ctx, formatter) -> None:
        if self.rich_markup_mode is None:
            return original(self, ctx, formatter)
        from rich.console import Console

        from distlaunch.cli.helppage import show

        show(self, ctx, Console(highlight=False))

    return format_help


def plain_help() -> None:
    """Make typer's help show metavars and plain words instead of Python types, laid out by helppage.py
    (idempotent)."""
    if TyperOption is None or getattr(TyperOption, "_distlaunch_help", False):
        return
    TyperCommand.format_help = _drawn_by_helppage(TyperCommand.format_help)
    TyperGroup.format_help = _drawn_by_helppage(TyperGroup.format_help)
    TyperOption.display_type_rich = _option_type
    TyperArgument.display_type_rich = lambda self, ctx: None
    TyperArgument.display_name_raw = property(lambda self: self.metavar or self.name.upper())
    TyperArgument._usage_display_name = _argument_usage
    TyperOption._distlaunch_help = True

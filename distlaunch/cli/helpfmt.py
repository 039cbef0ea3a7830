"""``--help`` that names values the way a man page does (PATH, N, SPEC), with no Python type names.

typer prints each parameter's Python type beside it (``<bool>`` for a flag, ``<list[str]>`` for the program)
and wraps a required argument in braces in the usage line (``{program}...``). A user reads "what do I type
here", so: an option shows its metavar, a flag shows nothing, any other value a plain upper-case word, and
an argument's name alone says what it is. Applied once, when the CLI is built.
"""

from __future__ import annotations

import re

try:  # typer >= 0.22 carries its own parameter classes
    from typer.core import TyperArgument, TyperOption
except ImportError:  # pragma: no cover
    TyperArgument = TyperOption = None

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


def plain_help() -> None:
    """Make typer's help show metavars and plain words instead of Python types (idempotent)."""
    if TyperOption is None or getattr(TyperOption, "_distlaunch_help", False):
        return
    TyperOption.display_type_rich = _option_type
    TyperArgument.display_type_rich = lambda self, ctx: None
    TyperArgument.display_name_raw = property(lambda self: self.metavar or self.name.upper())
    TyperArgument._usage_display_name = _argument_usage
    TyperOption._distlaunch_help = True

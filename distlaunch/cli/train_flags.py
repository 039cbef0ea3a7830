"""Another trainer's flag given to ``distlaunch train`` (``--steps 10``), answered with the ``--set`` that says the
same (``--set train.steps=10``); the names are training/aliases.py's."""

from __future__ import annotations

from distlaunch.training.aliases import ALIAS_NOTES, KEY_ALIASES, SETTING_ALIASES


def trainer_flag(option: str, args: list[str]) -> str | None:
    """The line for another trainer's flag, with the value typed after it (None: not such a flag)."""
    name = option.removeprefix("--").replace("-", "_")
    if name in SETTING_ALIASES:
        assignment = SETTING_ALIASES[name]
    elif name in KEY_ALIASES and option.startswith("--"):
        note = f": {ALIAS_NOTES[name]}" if name in ALIAS_NOTES else ""
        assignment = f"{KEY_ALIASES[name]}={_typed_value(option, args) or 'VALUE'}{note}"
    else:
        return None
    return f"distlaunch train: {option} is not an option (hint: use --set {assignment})"


def _typed_value(option: str, args: list[str]) -> str | None:
    """What follows the flag on the command line: ``--steps 10`` or ``--steps=10`` (torchrun's underscore
    spellings are read as dashes, so ``--max_steps 10`` too)."""
    for i, arg in enumerate(args):
        if arg == "--":
            return None
        name, eq, value = arg.partition("=")
        if name.replace("_", "-") != option.replace("_", "-"):
            continue
        if eq:
            return value or None
        following = args[i + 1] if i + 1 < len(args) else ""
        return following if following and not following.startswith("--") else None
    return None

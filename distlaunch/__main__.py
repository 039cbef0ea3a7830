"""The ``distlaunch`` command (``python -m distlaunch`` and the console script).

Import-light on purpose: the signals are caught before anything else is loaded (``interrupts.install``), and the
CLI's libraries (typer, rich, pydantic: a few tenths of a second) load with signals held, so a Ctrl-C, a
SIGTERM or a closed terminal at any moment ends the command with 128 + the signal and one line.
"""

from __future__ import annotations

import sys

from distlaunch import interrupts
from distlaunch.errors import Interrupted


def entry() -> None:
    """Console-script entry point."""
    interrupts.install()
    try:
        with interrupts.held():
            from distlaunch.cli.app import main

            _escape_what_cannot_be_shown()
        code = main()
    except Interrupted as stop:  # before the command's own handling began: nothing was started yet
        interrupts.answer()
        _say_at_start(stop.signum)
        code = stop.exit_code
    interrupts.leave(code, _say_at_end)


def _escape_what_cannot_be_shown() -> None:
    """A terminal that cannot show a character (a latin-1 or ASCII locale, PYTHONIOENCODING=ascii; a file name that
    is not UTF-8) gets it escaped: a plan or a report is never lost to a UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def _say_at_start(signum: int) -> None:
    sys.stderr.write(
        f"distlaunch: interrupted by {interrupts.signal_name(signum)} while starting; nothing was started\n"
    )


def _say_at_end(signum: int) -> None:
    sys.stderr.write(f"distlaunch: interrupted by {interrupts.signal_name(signum)}\n")


if __name__ == "__main__":
    entry()

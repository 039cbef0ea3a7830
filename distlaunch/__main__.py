"""The ``distlaunch`` command (``python -m distlaunch`` and the console script).

Import-light on purpose: the CLI's libraries (typer, rich, pydantic) take a few tenths of a second to
load, and a Ctrl-C meanwhile is held until they are loaded (``interrupts.held``), then ends the command as
any other Ctrl-C does (exit 130).
"""

from __future__ import annotations

import sys

from distlaunch import interrupts
from distlaunch.errors import ExitCode


def entry() -> None:
    """Console-script entry point."""
    interrupts.listen()
    try:
        with interrupts.held():
            from distlaunch.cli.app import main
    except KeyboardInterrupt:
        interrupts.forget_handled()
        sys.exit(ExitCode.SIGINT)
    # A terminal that cannot show a character (a latin-1 or ASCII locale, PYTHONIOENCODING=ascii; a file name
    # that is not UTF-8) gets it escaped: a plan or a report is never lost to a UnicodeEncodeError.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    try:
        code = main()
    except KeyboardInterrupt:  # between the restored handler and main's own handling of it
        code = ExitCode.SIGINT
    interrupts.forget_handled()
    sys.exit(code)


if __name__ == "__main__":
    entry()

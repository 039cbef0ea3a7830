"""The ``distlaunch`` command (``python -m distlaunch`` and the console script).

Import-light on purpose: the CLI's libraries (typer, rich, pydantic) take a few tenths of a second to
load, and a Ctrl-C meanwhile is held until they are loaded, then ends the command as any other Ctrl-C
does (exit 130). Raised inside an import it would print a traceback, or be lost in an import callback.
"""

from __future__ import annotations

import signal
import sys

from distlaunch.errors import ExitCode


def entry() -> None:
    """Console-script entry point."""
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        from distlaunch.cli.app import main
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
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
    sys.exit(code)


if __name__ == "__main__":
    entry()

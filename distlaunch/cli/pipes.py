"""Output whose reader went away (``distlaunch jobs | head``): what is left of it is dropped, quietly."""

from __future__ import annotations

import os
import sys


def drop_unread_output() -> None:
    """For stdout and stderr, when the reader of one is gone: what is still buffered for it goes to /dev/null, so
    that no later flush (the interpreter's last) fails on it, which would print "Exception ignored" and exit 120."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass


def reader_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says the reader of the output went away: a BrokenPipeError, or the SystemExit(1) that typer
    and rich raise in its place (with the BrokenPipeError as its context)."""
    if isinstance(exc, SystemExit):
        return isinstance(exc.__context__, BrokenPipeError)
    return isinstance(exc, BrokenPipeError)

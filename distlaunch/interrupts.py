"""A Ctrl-C while the CLI loads its libraries.

typer, rich and pydantic take a few tenths of a second to load, the first time a command runs included. A
KeyboardInterrupt raised inside an import is caught by whatever code that import happens to run: pydantic's
schema builder turns it into a SchemaError, a class body's ``__set_name__`` into a RuntimeError, and distlaunch
would call a Ctrl-C an internal error. So a Ctrl-C meanwhile is held until the import is done, then raised.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold SIGINT inside; a SIGINT that arrived meanwhile is raised as KeyboardInterrupt on the way out."""
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set there
        yield
        return
    arrived: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if arrived:
        raise KeyboardInterrupt


def forget_handled() -> None:
    """CPython 3.11 notes a KeyboardInterrupt raised inside any ``exec``/``eval`` of a string (dataclasses and
    named tuples build their methods so) as unhandled, even when it was caught, and then ends ``python -m``
    with SIGINT itself instead of the exit code asked for. Each such call clears the note first: one more,
    harmless, makes distlaunch's own exit code (130 after a Ctrl-C) the one the shell sees."""
    eval("None")

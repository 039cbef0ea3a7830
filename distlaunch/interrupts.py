"""A Ctrl-C while the CLI loads its libraries, and one that some code swallowed.

typer, rich and pydantic take a few tenths of a second to load, the first time a command runs included. A
KeyboardInterrupt raised inside an import is caught by whatever code that import happens to run: pydantic's
schema builder turns it into a SchemaError, a class body's ``__set_name__`` into a RuntimeError, and distlaunch
would call a Ctrl-C an internal error. So a Ctrl-C meanwhile is held until the import is done, then raised.

A KeyboardInterrupt raised where Python cannot pass it on (a finaliser, a callback run by the interpreter)
is printed as "ignored" and the command goes on as if nothing happened: once seen, the job then ran to its
end. So every Ctrl-C the command turns into a KeyboardInterrupt is also remembered (``listen``), and a job
that starts after one (``launcher.signals.SignalTrap``) stops at once, as if it had come then.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_remembered: list[int] = []  # the SIGINTs this command raised as KeyboardInterrupt


def remember(signum: int) -> None:
    """Note a signal that is about to be raised as an exception in the main thread (see ``swallowed``)."""
    _remembered.append(signum)


def _interrupt(signum, frame) -> None:
    remember(signum)
    raise KeyboardInterrupt


def listen() -> None:
    """From now on, a SIGINT raises KeyboardInterrupt as Python's own handler does, and is remembered.
    Only where Python's handler is in place: a launch started in the background keeps SIGINT ignored."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is (
        signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, _interrupt)


def swallowed() -> int | None:
    """The signal of a Ctrl-C raised earlier in this command that never ended it (caught and dropped on the
    way), or None."""
    return _remembered[0] if _remembered else None


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
        _remembered.extend(arrived)
        raise KeyboardInterrupt


def forget_handled() -> None:
    """CPython 3.11 notes a KeyboardInterrupt raised inside any ``exec``/``eval`` of a string (dataclasses and
    named tuples build their methods so) as unhandled, even when it was caught, and then ends ``python -m``
    with SIGINT itself instead of the exit code asked for. Each such call clears the note first: one more,
    harmless, makes distlaunch's own exit code (130 after a Ctrl-C) the one the shell sees."""
    eval("None")

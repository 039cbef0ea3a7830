"""The signals that end a command, and the one rule every command follows for them: a signal is recorded first,
then acted on at the next safe point, even when the exception it raised was swallowed on the way.

SIGINT, SIGTERM and SIGHUP (a closed terminal; unless it was ignored when the command started, as under
``nohup``) are caught from the command's first moment (``install``, the first thing ``distlaunch`` and a detached
job's supervisor do). What a signal does then:

- While the command loads its modules, or sets up what it must undo (``held``), it is only recorded: an
  exception raised inside an import lands in whatever code that import runs (pydantic's schema builder turns
  it into a SchemaError, importlib's module-lock callback drops it). It is raised when the held part ends.
- Otherwise the first signal raises ``Interrupted`` in the main thread, which unwinds the command: what it
  made is removed on the way, and the command exits 128 + the signal with one line (``cli/app.py``). A second
  signal meanwhile is recorded only: it never interrupts the clean-up of the first. A running job's own trap
  (``launcher/running/signals.py``) takes the signals while the job runs and gives a second one its meaning.
- An ``Interrupted`` raised where Python cannot pass it on (a finaliser, a weakref or import-lock callback) is
  dropped there with an "Exception ignored" report: ``sys.unraisablehook`` notices it instead, says nothing,
  and the next safe point (``check``: the end of a held part, the long loops of a command, a job's start)
  raises it again.
- A command ends through ``exit_code``: one that recorded a signal and never handed it to anything that answers
  for it (the top of the command, a job's trap) exits 128 + that signal whatever became of the exception.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import NoReturn

from distlaunch.errors import Interrupted

CAUGHT = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Record:
    """What this command has seen of the signals: all module state lives here."""

    def __init__(self):
        self.first: int | None = None  # the first signal: the one the command ends by
        self.count = 0
        self.raised = False  # Interrupted is on its way up for the first signal (not swallowed)
        self.answered = False  # something that answers for the signal took it (the command's top, a job's trap)
        self.holding = 0  # depth of held parts
        self.ending = False  # the command is writing its last words: a signal now is recorded only


_record = _Record()
_default_unraisablehook = sys.unraisablehook


def _on_signal(signum: int, frame) -> None:
    record(signum)
    if _record.holding or _record.raised or _record.answered or _record.ending:
        return  # held, or ending; or the first signal is being acted on: a second never interrupts its clean-up
    _record.raised = True
    raise Interrupted(_record.first)


def _unraisable(unraisable) -> None:
    """An Interrupted dropped where Python could not pass it on: silently, to be raised again at the next check."""
    if isinstance(unraisable.exc_value, Interrupted | KeyboardInterrupt) and _record.first is not None:
        _record.raised = False
        return
    _default_unraisablehook(unraisable)


def install() -> None:
    """Catch SIGINT, SIGTERM and SIGHUP for the rest of the command (the main thread's job, once, first thing)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in CAUGHT:
        if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
            continue  # nohup: the command must outlive the terminal that started it
        signal.signal(sig, _on_signal)
    sys.unraisablehook = _unraisable


def forget() -> None:
    """Start again as a command that has seen no signal: for a process that runs many commands (a test suite)."""
    global _record
    _record = _Record()


def record(signum: int) -> None:
    """Note a signal that reached this command (a job's trap notes the ones it takes too)."""
    if _record.first is None:
        _record.first = signum
    _record.count += 1


def signal_name(signum: int) -> str:
    """``SIGINT``, ``SIGTERM``, ``SIGHUP``."""
    return signal.Signals(signum).name


def first() -> int | None:
    """The first signal this command received, or None."""
    return _record.first


def pending() -> int | None:
    """The first signal, when nothing has acted on it yet: not on its way up, not answered."""
    return None if _record.first is None or _record.raised or _record.answered else _record.first


def unanswered() -> int | None:
    """The first signal, when nothing that answers for it has taken it (it was swallowed, or is on its way up)."""
    return None if _record.answered else _record.first


def answer() -> int | None:
    """Take the first signal over (a job's trap, the command's top): from now on, it decides what it means."""
    _record.answered = _record.first is not None
    return _record.first


def check() -> None:
    """A safe point: raise Interrupted now for a signal that came and was not acted on (held, or swallowed)."""
    signum = pending()
    if signum is not None and not _record.holding and threading.current_thread() is threading.main_thread():
        _record.raised = True
        raise Interrupted(signum)


@contextlib.contextmanager
def held(then_check: bool = True) -> Iterator[None]:
    """Signals inside are recorded, and raised once the held part is over (``check``); with ``then_check`` False
    they are left to the command's end (``exit_code``): the part was the command's last step, done whole."""
    _record.holding += 1
    try:
        yield
    finally:
        _record.holding -= 1
    if then_check:
        check()


def exit_code(code: int) -> int:
    """The command's exit code, once it is over (signals are recorded only from now on): 128 + its first signal
    when one came that nothing answered for, else ``code``."""
    _record.ending = True
    if _record.first is not None and not _record.answered:
        return 128 + _record.first
    return code


def leave(code: int, say: Callable[[int], None]) -> NoReturn:
    """End the process with ``code``, as the command decided it, or with 128 + a signal that came while it was
    deciding. The signals are blocked first: one that arrives now stays pending in the kernel, is counted here
    (``say`` tells it in a line), and none can catch the interpreter in its own shutdown, where Python's handlers
    are gone and the default action would kill the process with nothing said. A thread that native code started
    (a tokenizer's pool) can still take one: its handler runs here, between two lines, so the code is decided
    after the output is flushed (a slow reader can hold a flush), as the very last step. Then the process ends at
    once: every thread distlaunch starts is a daemon, and it leaves nothing to finalise."""
    _record.ending = True
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, CAUGHT)
        for sig in sorted(signal.sigpending() & set(CAUGHT)):
            if signal.getsignal(sig) is not signal.SIG_IGN:
                record(sig)
    _flush()
    final = exit_code(code)
    if final != code:
        answer()
        say(final - 128)
        _flush()
    os._exit(final)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone (a closed pipe), a stream closed
            stream.flush()

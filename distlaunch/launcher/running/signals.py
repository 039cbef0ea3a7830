"""SIGINT/SIGTERM/SIGHUP while distlaunch supervises a job: record them (and optionally react) instead of dying,
so the job can be stopped in order; restores the previous handlers on exit."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator

from distlaunch import interrupts
from distlaunch.errors import Interrupted


def catch(sig: int, handler: Callable) -> object | None:
    """Install ``handler`` for ``sig``; the previous handler, or None when ``sig`` was left alone.

    A signal ignored when distlaunch started stays ignored: ``nohup distlaunch ...`` (SIGHUP ignored)
    must outlive the terminal that started it, as every program run under nohup does.
    """
    if signal.getsignal(sig) is signal.SIG_IGN:
        return None
    return signal.signal(sig, handler)


@contextlib.contextmanager
def interrupts_unwind(hangup: bool = False) -> Iterator[None]:
    """SIGINT and SIGTERM (and with ``hangup``, SIGHUP unless ignored: a closed terminal) raise
    ``Interrupted`` in the main thread meanwhile, instead of a KeyboardInterrupt or the default action
    (death, leaving the job record 'running' and then 'lost', or a half-built folder). A ``SignalTrap``
    inside takes over while a job runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(signum, frame) -> None:
        interrupts.remember(signum)  # should the exception be swallowed, the job's trap still stops it
        raise Interrupted(signum)

    # Always, as the job's own trap (SignalTrap) does: a launch started by a script in the background inherits
    # SIGINT ignored, yet a SIGINT sent to it must stop it in order, before the job starts as after.
    saved = {sig: signal.signal(sig, unwind) for sig in (signal.SIGINT, signal.SIGTERM)}
    previous = catch(signal.SIGHUP, unwind) if hangup else None
    if previous is not None:
        saved[signal.SIGHUP] = previous
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


class SignalTrap:
    """Context manager: ``first`` is the first signal received (``first_at``: when, wall clock), ``count`` how
    many arrived."""

    def __init__(self, on_signal: Callable[[int], None] | None = None):
        self.first: int | None = None
        self.first_at: float | None = None
        self.count = 0
        self.on_signal = on_signal
        self._saved: dict[int, object] = {}

    def __enter__(self) -> SignalTrap:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            # SIGHUP: the terminal that started a foreground job was closed; stop the job in order, and say so.
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved[sig] = signal.signal(sig, self._handle)
            previous = catch(signal.SIGHUP, self._handle)
            if previous is not None:
                self._saved[signal.SIGHUP] = previous
        swallowed = interrupts.swallowed()
        if swallowed is not None:  # a Ctrl-C before the job, which some code caught and dropped: stop now
            self._handle(swallowed, None)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.first is None:
            self.first, self.first_at = signum, time.time()
        self.count += 1
        if self.on_signal is not None:
            self.on_signal(signum)

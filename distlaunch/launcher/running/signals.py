"""SIGINT/SIGTERM/SIGHUP while distlaunch supervises a job: the job's trap takes them over from the command's
(``distlaunch/interrupts.py``), records them (and optionally reacts) instead of unwinding, so the job is stopped
in order; the previous handlers come back on exit."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from distlaunch import interrupts


def catch(sig: int, handler: Callable) -> object | None:
    """Install ``handler`` for ``sig``; the previous handler, or None when ``sig`` was left alone.

    A signal ignored when distlaunch started stays ignored: ``nohup distlaunch ...`` (SIGHUP ignored)
    must outlive the terminal that started it, as every program run under nohup does.
    """
    if signal.getsignal(sig) is signal.SIG_IGN:
        return None
    return signal.signal(sig, handler)


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
        came = interrupts.unanswered()
        if came is not None:  # a signal before the job, whose exception some code caught and dropped: stop now
            self._take(came)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        interrupts.record(signum)
        self._take(signum)

    def _take(self, signum: int) -> None:
        interrupts.answer()  # the job decides what it means: its report's exit code is the command's
        if self.first is None:
            self.first, self.first_at = signum, time.time()
        self.count += 1
        if self.on_signal is not None:
            self.on_signal(signum)

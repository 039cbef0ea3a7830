"""SIGINT/SIGTERM/SIGHUP while distlaunch supervises a job: record them (and optionally react) instead of dying,
so the job can be stopped in order; restores the previous handlers on exit."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable


class SignalTrap:
    """Context manager: ``first`` is the first signal received, ``count`` how many arrived."""

    def __init__(self, on_signal: Callable[[int], None] | None = None):
        self.first: int | None = None
        self.count = 0
        self.on_signal = on_signal
        self._saved: dict[int, object] = {}

    def __enter__(self) -> SignalTrap:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            # SIGHUP: the terminal that started a foreground job was closed; stop the job in order, and say so.
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        self.first = self.first or signum
        self.count += 1
        if self.on_signal is not None:
            self.on_signal(signum)

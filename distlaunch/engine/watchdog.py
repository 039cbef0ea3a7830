"""A per-rank watchdog: a step (or a checkpoint save) that runs too long ends the process.

A hung rank stalls every other rank in its next collective, so every rank's watchdog fires, each
exits with ``STEP_TIMEOUT_EXIT`` and a one-line reason (plus the Python stacks of the stuck
process, to show where it hung), and the launcher sees a failed rank: it stops the job and, with
``--max-restarts``, starts it again from the latest checkpoint. Nobody waits on a hang forever.
"""

from __future__ import annotations

import contextlib
import faulthandler
import math
import os
import sys
import threading
import time
from collections.abc import Iterator

STEP_TIMEOUT_EXIT = 124  # the code timeout(1) uses: "ran out of time"
# The longest single wait: Condition.wait raises OverflowError past threading.TIMEOUT_MAX (~292
# years), which would end the thread and with it hang detection; a longer deadline waits in turns.
MAX_WAIT_S = 3600.0


class Watchdog:
    """Arms a deadline around a block; a daemon thread exits the process when it passes."""

    def __init__(self, rank: int):
        self.rank = rank
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._what = ""
        self._limit = 0.0
        self._setting = ""
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def guard(self, what: str, seconds: float, setting: str) -> Iterator[None]:
        """Run the block under a ``seconds`` deadline (0, inf or nan: no deadline); ``setting`` names the knob."""
        if not 0 < seconds < math.inf:  # an infinite deadline never passes: nothing to watch
            yield
            return
        self._start()
        with self._cond:
            self._deadline = time.monotonic() + seconds
            self._what, self._limit, self._setting = what, seconds, setting
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._deadline = None
                self._cond.notify()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="distlaunch-watchdog", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        with self._cond:
            while True:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left <= 0:
                    self._fire()
                self._cond.wait(timeout=min(left, MAX_WAIT_S))

    def _fire(self) -> None:
        sys.stderr.write(
            f"error: rank {self.rank}: {self._what} did not finish within {self._limit:g}s ({self._setting}); "
            f"exiting with code {STEP_TIMEOUT_EXIT} (hint: a hang in one rank blocks the others in their next "
            f"collective; the stacks below show where this rank was; raise {self._setting} if steps are just slow)\n"
        )
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(STEP_TIMEOUT_EXIT)  # the main thread may be stuck in C code: only _exit ends it

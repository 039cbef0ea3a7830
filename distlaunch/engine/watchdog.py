"""A per-rank watchdog: a step (or a checkpoint save) that runs too long ends the process.

This is the last-resort guard for ranks that no distlaunch launcher watches: under ``srun`` (each task is a
rank and distlaunch execs into it), under torchrun, in a pod submitted without ``--hang-timeout``. Under
``distlaunch run``/``train`` the launcher's hang watch (``--hang-timeout``, 600 s for train, shorter than
train.step_timeout's 900 s) fires first, gathers every rank's stack and stops the job. Both end with the one
hang code, ``ExitCode.HANG`` (124).

A hung rank stalls every other rank in its next collective, so every rank's watchdog fires, each
exits with ``STEP_TIMEOUT_EXIT`` and a one-line reason after the Python stacks of the stuck process
(the reason last, so it is what the launcher's root-cause table shows), and the launcher sees a
failed rank: it stops the job and, with ``--max-restarts``, starts it again from the latest
checkpoint. Nobody waits on a hang forever.

The rank that hangs is the one that is not waiting in a collective: a rank whose main thread waits in
``torch.distributed`` says so and exits a few seconds later than its deadline, so that the hung
rank's watchdog (armed at about the same moment) ends its process first and the launcher names it
as the root cause.
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

from distlaunch.engine.compute import waiting
from distlaunch.errors import ExitCode

STEP_TIMEOUT_EXIT = int(ExitCode.HANG)  # the launcher's hang code too: "ran out of time", as timeout(1)
# The longest single wait: Condition.wait raises OverflowError past threading.TIMEOUT_MAX (~292
# years), which would end the thread and with it hang detection; a longer deadline waits in turns.
MAX_WAIT_S = 3600.0
WAITING_GRACE_S = 5.0  # a rank waiting in a collective lets the hung rank exit first (at most the limit)
COLLECTIVES = f"{os.sep}torch{os.sep}distributed{os.sep}"  # where a main thread waits on other ranks


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
        waiting = collective_of(threading.main_thread())
        if waiting is not None:
            time.sleep(min(WAITING_GRACE_S, self._limit))  # the rank that hangs goes first, if it is one of ours
        sys.stderr.write(f"rank {self.rank}: Python stacks when {self._what} ran out of time:\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        where = (
            f"it waits in {waiting} for a rank that did not get there (that rank's line says where it is)"
            if waiting is not None
            else "it is not waiting for other ranks: the hang is in this rank (its stacks above show where)"
        )
        sys.stderr.write(
            f"error: rank {self.rank}: {self._what} did not finish within {self._limit:g}s ({self._setting}): "
            f"{where}; exiting with code {STEP_TIMEOUT_EXIT} (hint: raise {self._setting} if steps are just slow)\n"
        )
        sys.stderr.flush()
        os._exit(STEP_TIMEOUT_EXIT)  # the main thread may be stuck in C code: only _exit ends it


def wait_for_peers(work: object) -> None:
    """Wait for an async collective (a ``Work``, or None: nothing to wait for). The one place the engine
    waits on one itself, so the watchdog knows a rank waiting here is waiting on other ranks, and the time
    spent here is not the rank's compute (``compute.waiting``)."""
    if work is not None:
        with waiting():
            work.wait()


def collective_of(thread: threading.Thread) -> str | None:
    """The collective ``thread`` waits in: its outermost torch.distributed call (as the engine called it),
    or an async one it waits on in ``wait_for_peers``; None when it is not in one."""
    frame = sys._current_frames().get(thread.ident)
    found = None
    while frame is not None:
        if COLLECTIVES in frame.f_code.co_filename and frame.f_code.co_name != "wrapper":  # not a decorator's
            found = frame.f_code.co_name
        elif frame.f_code is wait_for_peers.__code__:
            found = "an async collective"
        frame = frame.f_back
    return found

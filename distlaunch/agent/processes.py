"""The node's rank processes as one group: each rank's exit stamped when it comes (and whether a stop of ours
came first), every rank's process group signalled, and the stop with its grace period."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import time

from distlaunch import protocol as p
from distlaunch.agent.ranks import Rank

EXITED = "exited"  # the selector's mark for a rank's exit descriptor


class RankProcesses:
    """The ranks the agent started (``ranks``), their exit descriptors in the agent's selector ``sel``; a stop
    sends SIGTERM, then SIGKILL once ``grace_period`` seconds are up (``overdue``)."""

    def __init__(self, sel: selectors.BaseSelector, grace_period: float = p.GRACE_PERIOD_S):
        self.sel, self.grace_period = sel, grace_period
        self.ranks: list[Rank] = []
        self.stop_deadline: float | None = None
        self.stopping = False  # told to stop or kill its ranks (or orphaned): later exits are ours, not theirs

    def add(self, rank: Rank) -> None:
        """A rank just started: its exit wakes the agent's select."""
        self.ranks.append(rank)
        if rank.exit_fd is not None:
            self.sel.register(rank.exit_fd, selectors.EVENT_READ, EXITED)

    def all_reported(self) -> bool:
        """Every rank's exit has been reported to the launcher."""
        return all(r.reported for r in self.ranks)

    def signal_all(self, sig: int) -> None:
        """Send ``sig`` to every rank's process group."""
        for rank in self.ranks:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(rank.proc.pid, sig)  # the rank's own group: its children go too

    def begin_stop(self, max_grace: float | None = None) -> None:
        """SIGTERM every rank now, SIGKILL after the grace period (``max_grace`` at most); a later stop only shortens it."""
        grace = self.grace_period
        deadline = time.monotonic() + (grace if max_grace is None else min(grace, max_grace))
        self.mark_stopping()
        if self.stop_deadline is None:
            self.signal_all(signal.SIGTERM)
        if self.stop_deadline is None or deadline < self.stop_deadline:
            self.stop_deadline = deadline

    def kill(self) -> None:
        """SIGKILL every rank now, as a stop of ours."""
        self.mark_stopping()
        self.signal_all(signal.SIGKILL)

    def overdue(self, now: float) -> bool:
        """A stop's grace period is up (``now``: time.monotonic()): the ranks still running get SIGKILL."""
        return self.stop_deadline is not None and now > self.stop_deadline

    def mark_stopping(self) -> None:
        """From now on an exit is one we caused; a rank that ended before this failed on its own."""
        self.observe_exits()
        self.stopping = True

    def observe_exits(self) -> None:
        """Stamp every rank that has ended since the last look."""
        for rank in self.ranks:
            if rank.returncode is not None:
                continue
            rc = rank.proc.poll()
            if rc is None:
                continue
            rank.returncode, rank.exited_at, rank.exit_time = rc, time.monotonic(), time.time()
            rank.stopped = self.stopping
            if rank.exit_fd is not None:
                self.sel.unregister(rank.exit_fd)
                os.close(rank.exit_fd)
                rank.exit_fd = None

"""Signs of life: heartbeats between the agent and the launcher, and the ranks' own progress reports, which the
launcher's hang watch reads."""

from __future__ import annotations

import contextlib
import os
import time

from distlaunch import protocol as p
from distlaunch.agent.channel import Events
from distlaunch.agent.ranks import Rank
from distlaunch.agent.scratch import rank_file

PROGRESS_POLL_S = 1.0


class Heartbeat:
    """The launcher sends {"cmd": "hb"} and we send {"ev": "hb"}, each every third of the timeout; a launcher
    silent for the whole timeout is taken for gone. A timeout of 0: no heartbeats."""

    def __init__(self, timeout: float, events: Events):
        self.timeout = timeout
        self.events = events  # any event counts as ours: a heartbeat goes out only after a silence
        self.heard_at = time.monotonic()

    def heard(self) -> None:
        """The launcher said something: any line counts as a sign of life."""
        self.heard_at = time.monotonic()

    def check(self) -> bool:
        """Send ours when due; True when the launcher has been silent for the whole timeout."""
        if not self.timeout:
            return False
        now = time.monotonic()
        if now - self.events.sent_at > self.timeout / 3:
            self.events.emit(ev=p.HEARTBEAT)
        return now - self.heard_at > self.timeout


class Progress:
    """Ranks report progress (``distlaunch.progress()``) by touching their progress file in the scratch folder;
    the launcher hears a ``progress`` event when any of them moved. Only with a hang watch (``hang_timeout``)."""

    def __init__(self, hang_timeout: float, scratch: str, events: Events):
        self.hang_timeout = hang_timeout
        self.scratch = scratch
        self.events = events
        self.seen = 0.0  # newest progress-file mtime reported
        self.checked = 0.0

    def arm(self, env: dict, rank: int) -> None:
        """Name the rank's progress file in its environment."""
        if self.hang_timeout:
            env["DISTLAUNCH_PROGRESS_FILE"] = rank_file(self.scratch, rank, "progress")

    def check(self, ranks: list[Rank]) -> None:
        """Report ranks' distlaunch.progress() calls (the mtime of their progress files), once a second."""
        now = time.monotonic()
        if not self.hang_timeout or now - self.checked < PROGRESS_POLL_S:
            return
        self.checked = now
        newest = self.seen
        for rank in ranks:
            with contextlib.suppress(OSError):
                newest = max(newest, os.stat(rank_file(self.scratch, rank.rank, "progress")).st_mtime)
        if newest > self.seen:
            self.seen = newest
            self.events.emit(ev=p.PROGRESS)

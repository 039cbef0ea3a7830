"""Signs of life: heartbeats between the agent and the launcher, and the ranks' own progress reports, which the
launcher's hang watch, straggler watch and goodput accounting read."""

from __future__ import annotations

import json
import os
import time

from distlaunch import protocol as p
from distlaunch.agent.channel import Events
from distlaunch.agent.ranks import Rank
from distlaunch.agent.scratch import rank_file

PROGRESS_POLL_S = 1.0
PROGRESS_MAX_BYTES = 4096  # a report is ~120 bytes: anything longer is not one


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
    """Ranks report progress (``distlaunch.progress()``) by replacing their progress file in the scratch folder
    with a small JSON object (step, median compute time, saved checkpoint step). Once a second, the files that
    changed are read and sent as one ``progress`` event: every one counts as progress for the launcher's hang
    watch, and their contents feed its straggler watch and goodput accounting."""

    def __init__(self, scratch: str, events: Events):
        self.scratch = scratch
        self.events = events
        self.seen: dict[int, int] = {}  # rank -> the mtime (ns) of its progress file last reported
        self.checked = 0.0

    def arm(self, env: dict, rank: int) -> None:
        """Name the rank's progress file in its environment."""
        env["DISTLAUNCH_PROGRESS_FILE"] = rank_file(self.scratch, rank, "progress")

    def check(self, ranks: list[Rank], at_once: bool = False) -> None:
        """Report the ranks whose progress file changed since the last report, once a second (``at_once``: now,
        as when a rank ended: the steps it reported last are what a restart recomputes)."""
        now = time.monotonic()
        if now - self.checked < PROGRESS_POLL_S and not at_once:
            return
        self.checked = now
        moved, reports = False, {}
        for rank in ranks:
            path = rank_file(self.scratch, rank.rank, "progress")
            try:
                mtime = os.stat(path).st_mtime_ns
            except OSError:
                continue
            if self.seen.get(rank.rank) == mtime:
                continue
            self.seen[rank.rank] = mtime
            moved = True
            report = read_progress(path)
            if report is not None:
                reports[str(rank.rank)] = report
        if moved:
            self.events.emit(ev=p.PROGRESS, ranks=reports)


def read_progress(path: str) -> dict | None:
    """A rank's progress report, or None when its file is gone, empty, cut short or not a JSON object (then it
    is a plain progress mark, as an older ``distlaunch.progress()`` leaves: an empty file it touches)."""
    try:
        with open(path, encoding="utf-8") as f:
            report = json.loads(f.read(PROGRESS_MAX_BYTES))
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None

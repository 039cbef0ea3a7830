"""Signs of life: heartbeats between the agent and the launcher, and the ranks' own progress reports, which the
launcher's hang watch, straggler watch and goodput accounting read."""

from __future__ import annotations

import json
import os
import time

from distlaunch import protocol as p
from distlaunch.agent.channel import Events
from distlaunch.agent.ranks import Rank
from distlaunch.agent.scratch import PROGRESS, rank_file

PROGRESS_POLL_S = 1.0  # progress events: at most one a second, but a new checkpoint goes out at once
PROGRESS_LOOK_S = 0.1  # the files are looked at this often (a stat each), so a new checkpoint is not a second late
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
    with a small JSON object (step, median compute time, saved checkpoint step). The files that changed are read
    and sent as one ``progress`` event, once a second: every one counts as progress for the launcher's hang
    watch, and their contents feed its straggler watch and goodput accounting. A report of a new checkpoint goes
    out at once: a SIGTERM right after a save is answered by what that save took (the launcher's grace-period
    budget), and a save request by the step that answered it."""

    def __init__(self, scratch: str, events: Events):
        self.scratch = scratch
        self.events = events
        self.seen: dict[int, int] = {}  # rank -> the mtime (ns) of its progress file last read
        self.saved: dict[int, object] = {}  # rank -> the saved_step of its report last read
        self.reports: dict[str, dict] = {}  # read since the last event, by rank
        self.moved = False  # a file changed since the last event (readable or not: it counts as progress)
        self.new_save = False
        self.looked = 0.0
        self.sent = 0.0

    def check(self, ranks: list[Rank], at_once: bool = False) -> None:
        """Read the files that changed; report them once a second, at once when one has a new checkpoint
        (``at_once``: now, as when a rank ended: the steps it reported last are what a restart recomputes)."""
        now = time.monotonic()
        if now - self.looked < PROGRESS_LOOK_S and not at_once:
            return
        self.looked = now
        for rank in ranks:
            path = rank_file(self.scratch, rank.rank, PROGRESS)
            try:
                mtime = os.stat(path).st_mtime_ns
            except OSError:
                continue
            if self.seen.get(rank.rank) == mtime:
                continue
            self.seen[rank.rank] = mtime
            self.moved = True
            report = read_progress(path)
            if report is not None:
                self.reports[str(rank.rank)] = report
                saved = report.get("saved_step")
                self.new_save |= saved is not None and saved != self.saved.get(rank.rank)
                self.saved[rank.rank] = saved
        if self.moved and (at_once or self.new_save or now - self.sent >= PROGRESS_POLL_S):
            self.events.emit(ev=p.PROGRESS, ranks=self.reports)
            self.reports, self.moved, self.new_save, self.sent = {}, False, False, now


def read_progress(path: str) -> dict | None:
    """A rank's progress report, or None when its file is gone, empty, cut short or not a JSON object (then it
    is a plain progress mark, as an older ``distlaunch.progress()`` leaves: an empty file it touches)."""
    try:
        with open(path, encoding="utf-8") as f:
            report = json.loads(f.read(PROGRESS_MAX_BYTES))
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None

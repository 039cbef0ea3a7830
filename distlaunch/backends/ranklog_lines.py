"""A job's output read back from its rank logs (launcher/supervising/ranklogs.py): what ``distlaunch logs`` shows of a job that
ran in a terminal. Each rank's previous part is read before the part written now; the ranks' lines are merged by
their time stamps and printed as the terminal showed them (``[rank N] …``); ``--follow`` follows every rank's log
across its rotations, as ``tail -F`` does.
"""

from __future__ import annotations

import collections
import heapq
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from distlaunch.backends.output import POLL_S, JobEnd, Note
from distlaunch.errors import UsageError
from distlaunch.jobs.logs import KEEP_LOGS_OF, logged_ranks, rank_log_parts
from distlaunch.jobs.store import JobRecord, jobs_dir
from distlaunch.launcher.supervising.ranklogs import parse_line

# a rank's line as read: (time stamp, out|err, the line, the rank's label)
Line = tuple[str, str, str, str]


def logs_folder_of(record: JobRecord) -> Path | None:
    """Where the job's rank logs are: as its record says, or (a record from before it said) <log-dir>/<job id>."""
    if record.rank_logs:
        return Path(record.rank_logs)
    if record.log_dir:
        return Path(record.cwd) / record.log_dir / record.job_id
    return None


class RankLog:
    """One rank's log, read in order: its previous part, then the part written now, and on across rotations."""

    def __init__(self, folder: Path, rank: int, label: str):
        self.older, self.path = rank_log_parts(folder, rank)
        self.label = label  # "[rank 3]", "[node2 rank 3]"
        self.file: BinaryIO | None = None
        self.pending = b""  # a line being written, completed by what follows

    def first(self) -> Iterator[Line]:
        """Every whole line written so far, oldest first (``more`` then reads on from there)."""
        self.file = _open(self.path)
        older = _open(self.older)
        if older is not None and self.file is not None and _same_file(older, self.file):
            self.file.close()  # rotated between the two opens: what was opened first is the previous part now
            self.file = _open(self.path)
        if older is not None:
            with older:
                yield from self.parsed(older)
        if self.file is not None:
            for raw in self.file:
                if not raw.endswith(b"\n"):
                    self.pending = raw
                    break
                yield from self.parse(raw)

    def more(self) -> list[Line]:
        """The whole lines written since the last read, from the part it was rotated out of first."""
        lines: list[Line] = []
        if self.file is None:
            self.file = _open(self.path)
        while self.file is not None:
            chunk = self.file.read()
            if chunk:
                *whole, self.pending = (self.pending + chunk).split(b"\n")
                lines += [line for raw in whole for line in self.parse(raw)]
                continue
            if not self.rotated():
                break
            self.file.close()  # read to its end: the writer closed it before it became the previous part
            self.file, self.pending = _open(self.path), b""
        return lines

    def rotated(self) -> bool:
        try:
            return os.stat(self.path).st_ino != os.fstat(self.file.fileno()).st_ino
        except FileNotFoundError:  # between the rotation's rename and the new part's start: not yet
            return False

    def parsed(self, f: BinaryIO) -> Iterator[Line]:
        for raw in f:
            yield from self.parse(raw)

    def parse(self, raw: bytes) -> list[Line]:
        parsed = parse_line(raw)
        return [] if parsed is None else [(*parsed, self.label)]

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def rank_log_lines(
    record: JobRecord,
    follow: bool,
    ranks: set[int],
    tail: int | None,
    stderr: bool,
    reread: Callable[[JobRecord], JobRecord],
    on_end: Callable[[JobRecord], None] | None = None,
) -> Iterator[str]:
    """The job's output from its rank logs (only ``ranks``' when given; only stderr lines with ``stderr``; the last
    ``tail``); with ``follow``, every new line until the job has ended (``on_end`` then hears how)."""
    folder = logs_folder_of(record)
    if folder is None:
        raise UsageError(
            f"job {record.job_id} ran in a terminal: distlaunch kept no output of it",
            "jobs started by this version keep their ranks' logs; a Slurm or detached job's output is its own file",
        )
    found = logged_ranks(folder)
    if not found and not follow:
        raise _no_logs(record, folder)
    label = _labeller(record)
    logs = {rank: RankLog(folder, rank, label(rank)) for rank in sorted(ranks or found)}
    for rank in sorted(set(logs) - found):
        if not follow:
            yield Note(f"rank {rank} has no log in {folder} (it ran on another node, or never started)")
    shown = (lambda line: line[1] == "err") if stderr else (lambda line: True)
    first = heapq.merge(*(log.first() for log in logs.values()), key=lambda line: line[0])
    kept = (line for line in first if shown(line))
    yield from (_text(line) for line in (collections.deque(kept, maxlen=tail) if tail is not None else kept))
    ended = JobEnd(record, reread)
    try:
        while follow:
            if not ranks:  # a rank that starts later, or another attempt's
                for rank in sorted(logged_ranks(folder) - set(logs)):
                    logs[rank] = RankLog(folder, rank, label(rank))
                    yield from (_text(line) for line in logs[rank].first() if shown(line))
            done = ended()  # before the read: what the job wrote before it ended is read below
            batch = sorted((line for log in logs.values() for line in log.more()), key=lambda line: line[0])
            yield from (_text(line) for line in batch if shown(line))
            if done:
                break
            if not batch:
                time.sleep(POLL_S)
    finally:
        for log in logs.values():
            log.close()
    ended.tell(on_end)


def _no_logs(record: JobRecord, folder: Path) -> UsageError:
    if not record.final:
        return UsageError(f"job {record.job_id} has no output yet: no rank has started", "try again, or use --follow")
    if folder.parent == jobs_dir():
        return UsageError(
            f"job {record.job_id}'s logs were removed: distlaunch keeps the logs of the {KEEP_LOGS_OF} newest jobs",
            f"'distlaunch status {record.job_id}' says how it ended; --log-dir DIR keeps a job's logs for good",
        )
    return UsageError(
        f"job {record.job_id} has no rank logs in {folder} (removed since?)",
        f"'distlaunch status {record.job_id}' says how it ended",
    )


def _labeller(record: JobRecord) -> Callable[[int], str]:
    """The prefix of a rank's lines, as the terminal showed it: ``[rank N]``, with the host on several hosts."""
    hosts = {rank["rank"]: node["host"] for node in record.plan.get("nodes", []) for rank in node["ranks"]}
    several = (record.plan.get("nnodes") or 1) > 1
    return lambda rank: f"[{hosts[rank]} rank {rank}]" if several and rank in hosts else f"[rank {rank}]"


def _text(line: Line) -> str:
    return f"{line[3]} {line[2]}"


def _open(path: Path) -> BinaryIO | None:
    try:
        return open(path, "rb")  # closed by its RankLog
    except FileNotFoundError:
        return None


def _same_file(a: BinaryIO, b: BinaryIO) -> bool:
    first, second = os.fstat(a.fileno()), os.fstat(b.fileno())
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)

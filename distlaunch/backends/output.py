"""A job's output as lines: read from the file its launcher or scheduler writes here, filtered by rank, and
followed until the job ends (as ``tail -F`` does, also across a truncation)."""

from __future__ import annotations

import collections
import os
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path

from distlaunch.backends.base import Backend, PlanT
from distlaunch.errors import UsageError
from distlaunch.files import open_regular
from distlaunch.jobs.store import JobRecord

POLL_S = 0.2
MARK_BYTES = 64  # the last bytes a follower read: while the file still holds them there, it was not truncated
WRITER_WAIT_S = 10.0  # logs --follow: how long a job that has ended may still be writing its report


class Note(str):
    """A line for the reader about the output itself (it was truncated), not a line of the job's output."""


def rank_of(line: str) -> int | None:
    """The rank a printed output line belongs to ('[rank 3] …', '[host rank 3] …' or srun's '3: …')."""
    if line.startswith("["):
        head = line[1 : line.find("]")].split()
        return int(head[-1]) if len(head) >= 2 and head[-2] == "rank" and head[-1].isdigit() else None
    label, colon, _ = line.partition(":")
    return int(label.strip()) if colon and label.strip().isdigit() else None


class FileOutput(Backend[PlanT]):
    """Backends whose job writes its output to one file here."""

    @abstractmethod
    def output(self, record: JobRecord, stderr: bool = False) -> Path:
        """The file that holds the job's output (or its stderr alone)."""

    def lines(
        self,
        record: JobRecord,
        follow: bool,
        ranks: set[int],
        tail: int | None,
        stderr: bool,
        on_end: Callable[[JobRecord], None] | None = None,
    ) -> Iterator[str]:
        return file_lines(record, self.output(record, stderr), follow, keep_ranks(ranks), tail, self.reread, on_end)


def keep_ranks(ranks: set[int]) -> Callable[[str], bool]:
    return lambda line: not ranks or rank_of(line) in ranks


class JobEnd:
    """Whether a followed job has ended and its writer is done: ``end`` is then the record as it ended."""

    def __init__(self, record: JobRecord, reread: Callable[[JobRecord], JobRecord]):
        self.record, self.reread = record, reread
        self.end: JobRecord | None = None
        self.final_at: float | None = None

    def __call__(self) -> bool:
        # Final, and its owner done writing: a detached job's supervisor records the end first, then prints
        # the failure report into the output (waited for at most WRITER_WAIT_S, should it hang).
        now = self.reread(self.record)
        if now.final and self.final_at is None:
            self.final_at = time.monotonic()
        owner = now.owner if now.owner is not None and now.owner.hostname == os.uname().nodename else None
        writing = owner is not None and owner.alive() and time.monotonic() - (self.final_at or 0) < WRITER_WAIT_S
        self.end = now if now.final and not writing else None
        return self.end is not None

    def tell(self, on_end: Callable[[JobRecord], None] | None) -> None:
        """``on_end`` hears of the record as the job ended, if it was seen to end."""
        if on_end is not None and self.end is not None:
            on_end(self.end)


def file_lines(
    record: JobRecord,
    path: Path,
    follow: bool,
    keep: Callable[[str], bool],
    tail: int | None,
    reread: Callable[[JobRecord], JobRecord],
    on_end: Callable[[JobRecord], None] | None = None,
) -> Iterator[str]:
    """The kept lines of ``path`` (the last ``tail``); with ``follow``, every new one until ``reread`` says the
    job has ended and its writer is done (then ``on_end`` hears of the record as it ended)."""
    ended = JobEnd(record, reread)

    if not path.exists():
        if record.final:  # nothing more will come: --follow would print nothing and wait for nothing
            raise UsageError(
                f"job {record.job_id} has ended, and its output file {path} is missing (removed since)",
                f"'distlaunch status {record.job_id}' says how it ended",
            )
        if not follow:
            raise UsageError(f"job {record.job_id} has no output yet: {path} does not exist", "try again later")
        while not path.exists() and not ended():
            time.sleep(POLL_S)
        if not path.exists():
            ended.tell(on_end)
            return
    try:
        f = open(open_regular(path), encoding="utf-8", errors="replace")  # noqa: SIM115 - closed by the with below
    except OSError as exc:  # a folder, a pipe, a symlink loop, no permission: not a file to read lines from
        raise UsageError(
            f"cannot read the output of job {record.job_id}: {path}: {(exc.strerror or str(exc)).lower()}",
            f"move it aside: the job wrote its output to a file there; 'distlaunch status {record.job_id}' still works",
        ) from None
    with f:
        # line by line, keeping at most the last ``tail`` kept lines: a job's output can be many GB
        pending, last = "", collections.deque(maxlen=tail) if tail is not None else None
        for line in f:
            if not line.endswith("\n"):  # the line the job is writing now: completed by what follows
                pending = line
                break
            if keep(line := line[:-1]):
                if last is None:
                    yield line
                else:
                    last.append(line)
        yield from last or ()
        mark = _mark(f)
        while follow:
            if _truncated(f, mark):
                # emptied under us (to free its disk, as logrotate's copytruncate does): the writer appends from
                # the new end, so read again from the start, as tail -F does; what was not yet read is gone
                yield Note(f"{path} was truncated; following it from its new start")
                pending, mark = "", b""
                f.seek(0)
                continue
            chunk = f.read()
            if chunk:
                mark = _mark(f)
            else:
                if not ended():
                    time.sleep(POLL_S)
                    continue
                chunk, follow = f.read(), False  # what the job wrote between the last read and its end
            *lines, pending = (pending + chunk).split("\n")
            yield from (line for line in lines if keep(line))
        if pending and keep(pending):
            yield pending
    ended.tell(on_end)


def _mark(f) -> bytes:
    """The last bytes read from ``f`` (at most ``MARK_BYTES``), as the file holds them now."""
    pos = f.buffer.tell()
    start = max(0, pos - MARK_BYTES)
    return os.pread(f.fileno(), pos - start, start)


def _truncated(f, mark: bytes) -> bool:
    """The file no longer holds, where they were read, the bytes read last (``mark``): it was truncated, whether or
    not it has grown past that point again since (which a size check alone misses)."""
    pos = f.buffer.tell()
    if os.fstat(f.fileno()).st_size < pos:
        return True
    return bool(mark) and os.pread(f.fileno(), len(mark), pos - len(mark)) != mark

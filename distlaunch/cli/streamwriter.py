"""One stream of a job's live output (stdout or stderr) behind a bounded queue, written by a thread of its own.

The launcher's supervision must never wait on a reader: a stdout that nobody reads (a full pipe, a suspended
pager, a terminal slower than the ranks) would otherwise stop fail-fast, signals and exit codes. Two kinds of
stream, told apart by what the descriptor is:

- a regular file (or /dev/null, or an in-memory stream) has no reader to wait for: every write completes. It
  never drops a line; when the queue is full, ``put`` waits for the thread, which writes each chunk of whole
  lines with one write, and the end waits until all of it is written;
- a pipe, a socket or a terminal has a reader that may fall behind. ``put`` never blocks: when the queue is
  full, rank lines are dropped and counted per rank and per stream, and a notice on the same stream says so as
  soon as it moves again. Lines go out in pieces a pipe takes whole (PIPE_BUF), each once ``poll`` says there is
  room, so no line is cut in two and close() knows line by line what the stream never took.

A stream that fails (a file on a full disk, a closed pipe) takes nothing more. Either way, every rank line is
accounted for: written whole, still waiting, or counted as lost (``unsent``).
"""

from __future__ import annotations

import os
import select
import stat
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TextIO

from distlaunch.files import os_error_words
from distlaunch.readable import plural

PENDING_BYTES = 4 << 20  # per stream: what may wait for the stream before put waits (a file) or drops (a reader)
# A pipe takes a write of at most this many bytes whole or not at all (POSIX PIPE_BUF): written in such
# pieces, a line is never cut, and a write the pipe said it has room for never waits.
PIECE_BYTES = getattr(select, "PIPE_BUF", 512)
NOTICE_EVERY_S = 1.0  # a stream that keeps falling behind says what it dropped at most this often
DRAIN_STALL_S = 2.0  # at the end, stop waiting for a reader that has taken nothing for this long
STREAM_NAMES = {1: "stdout", 2: "stderr"}  # a rank's output descriptor, as a notice names it


@dataclass
class Lost:
    """Rank lines a stream did not take: how many of each rank's stream (rank, fd), and their bytes."""

    lines: Counter[tuple[int, int]] = field(default_factory=Counter)
    size: int = 0

    def __bool__(self) -> bool:
        return bool(self.lines)

    def add(self, item: Item) -> None:
        """Count what an item stands for: one line of its rank's stream, or the lines a drop notice announces."""
        text, owed = item
        if isinstance(owed, tuple):
            self.lines[owed] += 1
            self.size += len(text)
        elif isinstance(owed, Lost):
            self.lines.update(owed.lines)
            self.size += owed.size

    def count(self) -> str:
        """``3 lines (690 bytes)``."""
        return f"{plural(sum(self.lines.values()), 'line')} ({plural(self.size, 'byte')})"

    def per_rank(self, name_streams: bool = False) -> str:
        """``1 of rank 0, 2 of rank 3``: the count of each rank, in rank order; ``name_streams`` (a stream that
        carries both of a rank's streams: stdout and stderr are one pipe) names each: ``1 of rank 0's stderr``."""
        return ", ".join(
            f"{n} of rank {rank}" + (f"'s {STREAM_NAMES.get(fd, f'fd {fd}')}" if name_streams else "")
            for (rank, fd), n in sorted(self.lines.items())
        )


# A text and what it stands for: a line of this (rank, fd), the lines a drop notice announces, or nothing (a notice).
Item = tuple[str, "tuple[int, int] | Lost | None"]


class StatusLine:
    """The status line at the bottom of a terminal (cli/statusline.py says what it shows). Every write to the
    terminal starts by erasing it and ends by drawing it again, so it stays the last line; the last write of a job
    only erases it. Shared by the writers of stdout and stderr when both are that terminal."""

    ERASE = "\r\x1b[K"  # to the start of the line, clear to its end: harmless on an empty line

    def __init__(self) -> None:
        self.text = ""
        self.ended = False
        self.lock = threading.Lock()

    def frame(self, final: bool) -> tuple[str, str]:
        """What goes before a write's lines and after them (``final``: the job's output ends here)."""
        with self.lock:
            self.ended = self.ended or final
            return self.ERASE, "" if self.ended else self.text


class StreamWriter:
    """A bounded queue of text in front of one stream, emptied by a daemon thread (the module says how a file
    and a reader differ). Where the stream has a file descriptor the thread writes with ``os.write`` once
    ``poll`` says the stream takes it: no write holds the thread (nor the interpreter's exit) on a full pipe."""

    def __init__(self, stream: TextIO, limit: int = PENDING_BYTES, status: StatusLine | None = None):
        self.stream, self.limit = stream, limit
        self.fd = _fileno(stream)
        self.keeps_up = keeps_up(self.fd)  # a file: never drops, waits instead; a reader may fall behind
        self.poll = _poller(self.fd)
        # a terminal's status line, shared by the writers of one terminal: each write erases it first and draws it
        # again after its lines, so rank lines scroll above it and never land on it
        self.status = status
        self.kept = "every line is kept: distlaunch logs JOB"  # where the dropped lines can still be read
        self.name_streams = False  # it carries the ranks' stdout and stderr both: its notices name which
        self.redraw = False  # the status changed: draw it even with no line to write
        self.pending: deque[Item] = deque()
        self.pending_bytes = 0
        self.sending: deque[Item] = deque()  # the piece being written: its items the stream has not wholly taken
        self.sent_into = 0  # bytes the stream took of the first of them (a terminal or a full disk may take part)
        self.dropped = Lost()  # dropped since the last drop notice was queued
        self.noticed_at = 0.0  # when the last drop notice was queued
        self.failed: str | None = None  # why the stream took nothing more (its write failed), once it did
        self.given_up = False  # close() stopped waiting for the stream: the thread writes nothing more
        self.gate = threading.Lock()  # held around each write, so that none lands after close() gave up
        self.written_at = time.monotonic()  # last time the stream accepted something
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True, name="distlaunch-output")
        self.thread.start()

    def put(self, text: str, rank: int | None = None, fd: int = 1) -> None:
        """Queue one line of ``rank``'s stream ``fd``, or a notice (no rank). A file waits for room; a reader's
        rank lines are dropped and counted while its queue is full (a notice never is, while the stream works;
        once it failed, the end says what it lost, and why)."""
        with self.cond:
            while self.keeps_up and not (self._room_for(text) or self._stopped()):
                self.cond.wait(0.1)  # the thread always makes room: a file takes every write
            if self._stopped() or (rank is not None and not self._room_for(text)):
                if rank is not None:
                    self.dropped.add((text, (rank, fd)))
                return
            self.pending.append((text, None if rank is None else (rank, fd)))
            self.pending_bytes += len(text)
            self.cond.notify_all()

    def _room_for(self, text: str) -> bool:
        return not self.pending or self.pending_bytes + len(text) <= self.limit

    def _stopped(self) -> bool:
        """Whether nothing more will be written: the stream failed, close() gave up, or the thread has ended."""
        return self.failed is not None or self.given_up or not self.thread.is_alive()

    def redraw_status(self) -> None:
        """The status line changed: draw it again (once, however many changes came while the terminal was slow)."""
        with self.cond:
            if self.status is not None and self.failed is None:
                self.redraw = True
                self.cond.notify_all()

    def _take(self) -> bool:
        """Move the next chunk into ``sending``: the drop notice first, then whole lines (a file: all that wait; a
        reader: up to PIECE_BYTES), between the status line's erase and redraw. False once nothing is left."""
        with self.cond:
            while not (self.pending or self.redraw or self.dropped or self.closed):
                self.cond.wait()
            if not (self.pending or self.redraw or self.dropped):
                return False
            items: list[Item] = []
            if self.dropped and self._notice_due():  # on the stream that lost it; until written, the notice owes it
                lost, self.noticed_at = self.dropped, time.monotonic()
                notice = f"distlaunch: dropped {lost.count()} of rank output ({lost.per_rank(self.name_streams)}): this stream did not"
                items.append((f"{notice} keep up ({self.kept})\n", lost))
                self.dropped = Lost()
            size = sum(_size(text) for text, _ in items)
            while self.pending and (self.keeps_up or not items or size + _size(self.pending[0][0]) <= PIECE_BYTES):
                item = self.pending.popleft()
                self.pending_bytes -= len(item[0])
                size += _size(item[0])
                items.append(item)
            self.cond.notify_all()  # room for a put that waits
            self.redraw = False
            if self.status is not None:
                before, after = self.status.frame(final=self.closed and not self.pending)
                items = [(before, None), *items, (after, None)]
            self.sending.extend(items)
            self.sent_into = 0
            return True

    def _notice_due(self) -> bool:
        """Whether to say now what was dropped: once the stream caught up or is closing, else once a second."""
        return not self.pending or self.closed or time.monotonic() - self.noticed_at >= NOTICE_EVERY_S

    def _run(self) -> None:
        while self._take() and self._send():
            self.written_at = time.monotonic()

    def _send(self) -> bool:
        """Write the chunk in ``sending``; False once the stream failed or close() gave up on it."""
        text = "".join(text for text, _ in self.sending)
        if self.fd is None:  # an in-memory stream (tests), or one that writes to two
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError) as exc:
                return self._fail(os_error_words(exc))
            self._taken(0, whole=True)
            return True
        data = memoryview(text.encode("utf-8", "replace"))
        while data:
            if not self._writable():
                return False
            with self.gate:
                if self.given_up:
                    return False
                try:  # a file: the whole chunk in one write; a reader: a piece it takes whole
                    n = os.write(self.fd, data if self.keeps_up else data[:PIECE_BYTES])
                except BlockingIOError:  # a non-blocking file description (shared with another process): wait
                    continue
                except OSError as exc:
                    return self._fail(os_error_words(exc))
            data = data[n:]
            self._taken(n, whole=not data)
            self.written_at = time.monotonic()
        return True

    def _writable(self) -> bool:
        """Wait until the stream takes a write; False once close() gave up."""
        while not self.given_up:
            if self.poll is None or self.poll.poll(100):
                return True  # room, or an error that the write will name
        return False

    def _taken(self, n: int, whole: bool) -> None:
        """The stream took ``n`` more bytes of the chunk (``whole``: all of it): the items it took whole are done."""
        with self.cond:
            if whole:
                self.sending.clear()
                return
            n += self.sent_into
            while self.sending and n >= (size := _size(self.sending[0][0])):
                n -= size
                self.sending.popleft()
            self.sent_into = n

    def _fail(self, why: str) -> bool:
        """The stream failed: it takes nothing more, and everything it did not take counts as dropped."""
        with self.cond:
            self.failed, self.closed = why, True
            for item in (*self.sending, *self.pending):
                self.dropped.add(item)
            self.sending.clear()
            self.pending.clear()
            self.pending_bytes = 0
            self.cond.notify_all()  # a put that waits for room: there is none to wait for any more
        return False

    def unsent(self) -> Lost:
        """The rank output this stream never took: dropped, or still waiting (or being written) when it stalled."""
        with self.cond:
            lost = Lost(Counter(self.dropped.lines), self.dropped.size)
            for item in (*self.sending, *self.pending):
                lost.add(item)
            return lost

    def close(self, stall_s: float = DRAIN_STALL_S) -> bool:
        """Let the thread write what is pending; True if everything went out. A file is waited for to the end; a
        reader only while it keeps taking something (``stall_s``)."""
        with self.cond:
            self.closed = True
            self.redraw = self.status is not None  # one last write erases the status line
            self.written_at = time.monotonic()  # the stall is counted from now
            self.cond.notify_all()
        while self.thread.is_alive():
            self.thread.join(0.05)
            if not self.keeps_up and time.monotonic() - self.written_at > stall_s:
                self._give_up()
                return False
        return self.failed is None

    def _give_up(self) -> None:
        """Stop the thread's writes, so that what it did not write is what ``unsent`` counts."""
        # The thread holds the gate only for a write the stream said it takes (a pipe's goes at once). A write
        # that holds it for longer (a suspended terminal) may still land after the count, and be counted too.
        held = self.gate.acquire(timeout=1.0)
        with self.cond:
            self.given_up = True
            self.cond.notify_all()
        if held:
            self.gate.release()


def keeps_up(fd: int | None) -> bool:
    """Whether every write to ``fd`` completes without waiting for a reader: a regular file, /dev/null, an
    in-memory stream (None). A pipe, a socket or a terminal has a reader that may fall behind."""
    if fd is None:
        return True
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return True  # a closed descriptor: its first write fails, and what it lost is counted
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return False
    return not (stat.S_ISCHR(mode) and os.isatty(fd))


def same_file(a: TextIO, b: TextIO) -> bool:
    """Whether two streams write to the same file, pipe or terminal (``2>&1``): one writer then serves both, so
    their lines keep their order and never land inside one another."""
    fds = (_fileno(a), _fileno(b))
    if None in fds:
        return False
    try:
        one, two = (os.fstat(fd) for fd in fds)
    except OSError:
        return False
    return (one.st_dev, one.st_ino) == (two.st_dev, two.st_ino)


def _size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "replace"))


def _fileno(stream: TextIO) -> int | None:
    try:
        stream.flush()
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None  # an in-memory stream (tests): written through its own write()


def _poller(fd: int | None) -> select.poll | None:
    if fd is None or not hasattr(select, "poll"):
        return None
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return poller

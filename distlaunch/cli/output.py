"""Live output of a running job: whole lines with a coloured ``[rank N]`` prefix, one write per line.

The launcher's supervision must never wait on the terminal: a stdout that nobody reads (a full pipe, a
suspended pager) would otherwise stop fail-fast, signals and exit codes. So lines go into a bounded
buffer per stream that a writer thread empties; when the buffer is full, rank lines are dropped and
counted, and the count is printed as soon as the stream moves again. A stream that fails (a file on a full
disk, a closed pipe) takes nothing more; what it lost is counted and said at the end, with why, and the job
goes on. ``--log-dir`` keeps every line.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from typing import TextIO

from distlaunch.files import os_error_words

_PALETTE = (36, 32, 33, 35, 34, 96, 92, 93, 95, 94)  # ANSI foreground colours, cycled by rank
PENDING_BYTES = 4 << 20  # per stream: what may wait for a slow terminal before lines are dropped
DRAIN_STALL_S = 2.0  # at the end, stop waiting for a terminal that has accepted nothing for this long


def use_color(stream: TextIO) -> bool:
    """Colour on a terminal unless NO_COLOR is set; FORCE_COLOR forces it."""
    if os.environ.get("NO_COLOR"):
        return False
    return bool(os.environ.get("FORCE_COLOR")) or stream.isatty()


class StreamWriter:
    """A bounded queue of text in front of one stream, emptied by a daemon thread.

    ``put`` never blocks. Where the stream has a file descriptor the thread writes to it with
    ``os.write``, so a write stuck on a full pipe holds no Python lock (the interpreter can still exit).
    """

    def __init__(self, stream: TextIO, limit: int = PENDING_BYTES):
        self.stream, self.limit = stream, limit
        self.fd = _fileno(stream)
        self.pending: deque[str] = deque()
        self.pending_bytes = 0
        self.dropped_lines = 0
        self.dropped_bytes = 0
        self.failed: str | None = None  # why the stream took nothing more (its write failed), once it did
        self.written_at = time.monotonic()  # last time the stream accepted something
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True, name="distlaunch-output")
        self.thread.start()

    def put(self, text: str, droppable: bool = True) -> None:
        with self.cond:
            if self.failed is not None and not droppable:
                return  # a notice: the end says what the stream lost, and why
            if self.failed is not None or (droppable and self.pending_bytes + len(text) > self.limit):
                self.dropped_lines += text.count("\n")
                self.dropped_bytes += len(text)
                return
            self.pending.append(text)
            self.pending_bytes += len(text)
            self.cond.notify()

    def _take(self) -> str | None:
        with self.cond:
            while not self.pending and not self.closed:
                self.cond.wait()
            if not self.pending:
                return None
            text = "".join(self.pending)
            self.pending.clear()
            self.pending_bytes = 0
            if self.dropped_lines:  # say what was lost, where it was lost
                text = (
                    f"distlaunch: dropped {self.dropped_lines} lines ({self.dropped_bytes} bytes) of rank output:"
                    f" this stream did not keep up (--log-dir keeps every line)\n{text}"
                )
                self.dropped_lines = self.dropped_bytes = 0
            return text

    def _run(self) -> None:
        while (text := self._take()) is not None:
            unwritten = self._write(text)
            if unwritten is not None:  # the stream failed: nothing more will ever be shown there
                why, rest = unwritten
                with self.cond:
                    self.failed, self.closed = why, True
                    self.dropped_lines += rest.count("\n") + sum(t.count("\n") for t in self.pending)
                    self.dropped_bytes += len(rest) + self.pending_bytes
                    self.pending.clear()
                    self.pending_bytes = 0
                return
            self.written_at = time.monotonic()

    def _write(self, text: str) -> tuple[str, str] | None:
        """Write ``text`` whole; when the stream fails, why and what of ``text`` it did not take."""
        if self.fd is None:
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError) as exc:
                return os_error_words(exc), text
            return None
        data = text.encode("utf-8", "replace")
        while data:
            try:
                n = os.write(self.fd, data)
            except OSError as exc:
                return os_error_words(exc), data.decode("utf-8", "replace")
            data = data[n:]
            self.written_at = time.monotonic()
        return None

    def unsent(self) -> tuple[int, int]:
        """Lines and bytes of rank output this stream never took: dropped, or still waiting when it stalled."""
        with self.cond:
            pending = sum(text.count("\n") for text in self.pending)
            return self.dropped_lines + pending, self.dropped_bytes + self.pending_bytes

    def close(self, stall_s: float = DRAIN_STALL_S) -> bool:
        """Let the thread write what is pending while the stream keeps moving; True if everything went out."""
        with self.cond:
            self.closed = True
            self.written_at = time.monotonic()  # the stall is counted from now
            self.cond.notify()
        while self.thread.is_alive():
            self.thread.join(0.05)
            if time.monotonic() - self.written_at > stall_s:
                return False
        return True


def _fileno(stream: TextIO) -> int | None:
    try:
        stream.flush()
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None  # an in-memory stream (tests): written through its own write()


class RankPrinter:
    """A launcher sink that prefixes every rank line; multi-host jobs also name the host."""

    def __init__(
        self, multi_host: bool, out: TextIO | None = None, err: TextIO | None = None, color: bool | None = None
    ):
        self.multi_host = multi_host
        out = out or sys.stdout
        err = err or sys.stderr
        self.color = use_color(out) if color is None else color
        self.err_color = use_color(err) if color is None else color
        self.out = StreamWriter(out)
        self.err = self.out if err is out else StreamWriter(err)

    def rank_line(self, host: str, rank: int, fd: int, line: str) -> None:
        prefix = f"[{host} rank {rank}]" if self.multi_host else f"[rank {rank}]"
        if self.color:
            prefix = f"\x1b[{_PALETTE[rank % len(_PALETTE)]}m{prefix}\x1b[0m"
        (self.err if fd == 2 else self.out).put(f"{prefix} {line}\n")  # one piece: ranks' lines never mix

    def notice(self, text: str) -> None:
        msg = f"\x1b[1;33mdistlaunch:\x1b[0m {text}" if self.err_color else f"distlaunch: {text}"
        self.err.put(msg + "\n", droppable=False)

    def close(self) -> None:
        """Flush what the terminal still takes (never waiting on a stalled one), and say on stderr what a
        stalled stdout never took: the count it would have printed once it moved again."""
        self.out.close()
        if self.err is self.out:
            return
        lost = self.unsent_note()
        if lost:
            self.notice(lost)
        self.err.close()

    def unsent_note(self) -> str | None:
        """What of the rank output stdout never took, and why, in one line (None: it took everything)."""
        lines, size = self.out.unsent()
        if not lines:
            return None
        why = f", as writing it failed: {self.out.failed}" if self.out.failed else ": it did not keep up"
        return f"{lines} lines ({size} bytes) of rank output never reached stdout{why} (--log-dir keeps every line)"

"""Live output of a running job: whole lines with a coloured ``[rank N]`` prefix, one write per line.

The launcher's supervision must never wait on the terminal: a stdout that nobody reads (a full pipe, a
suspended pager) would otherwise stop fail-fast, signals and exit codes. So lines go into a bounded
buffer per stream that a writer thread empties; when the buffer is full, rank lines are dropped and
counted, and the count is printed as soon as the stream moves again. A stream that fails (a file on a full
disk, a closed pipe) takes nothing more; what it lost is counted and said at the end, with why, and the job
goes on. The job's rank logs keep every line (``distlaunch logs JOB``).
"""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from collections import deque
from typing import TextIO

from distlaunch.cli.statusline import status_text
from distlaunch.contract.sink import JobStatus
from distlaunch.files import os_error_words
from distlaunch.readable import plural

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

    def __init__(self, stream: TextIO, limit: int = PENDING_BYTES, status: StatusLine | None = None):
        self.stream, self.limit = stream, limit
        self.fd = _fileno(stream)
        # a terminal's status line, shared by the writers of one terminal: each write erases it first and draws it
        # again after its lines, so rank lines scroll above it and never land on it
        self.status = status
        self.kept = "every line is kept: distlaunch logs JOB"  # where the dropped lines can still be read
        self.redraw = False  # the status changed: draw it even with no line to write
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

    def redraw_status(self) -> None:
        """The status line changed: draw it again (once, however many changes came while the terminal was slow)."""
        with self.cond:
            if self.status is not None and self.failed is None:
                self.redraw = True
                self.cond.notify()

    def _take(self) -> str | None:
        with self.cond:
            while not self.pending and not self.closed and not self.redraw:
                self.cond.wait()
            if not self.pending and not self.redraw:
                return None
            text = "".join(self.pending)
            self.pending.clear()
            self.pending_bytes = 0
            self.redraw = False
            if self.dropped_lines:  # say what was lost, where it was lost
                text = (
                    f"distlaunch: dropped {plural(self.dropped_lines, 'line')} ({plural(self.dropped_bytes, 'byte')}) of rank output:"
                    f" this stream did not keep up ({self.kept})\n{text}"
                )
                self.dropped_lines = self.dropped_bytes = 0
            if self.status is not None:
                text = self.status.around(text, final=self.closed)
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
            self.redraw = self.status is not None  # one last write erases the status line
            self.written_at = time.monotonic()  # the stall is counted from now
            self.cond.notify()
        while self.thread.is_alive():
            self.thread.join(0.05)
            if time.monotonic() - self.written_at > stall_s:
                return False
        return True


class StatusLine:
    """The status line at the bottom of a terminal (cli/statusline.py says what it shows). Every write to the
    terminal starts by erasing it and ends by drawing it again, so it stays the last line; the last write of a job
    only erases it. Shared by the writers of stdout and stderr when both are that terminal."""

    ERASE = "\r\x1b[K"  # to the start of the line, clear to its end: harmless on an empty line

    def __init__(self) -> None:
        self.text = ""
        self.ended = False
        self.lock = threading.Lock()

    def around(self, text: str, final: bool) -> str:
        """``text`` as written with the status line under it (``final``: the job's output ends here)."""
        with self.lock:
            self.ended = self.ended or final
            return self.ERASE + text + ("" if self.ended else self.text)


def terminal_width(stream: TextIO) -> int | None:
    """Columns of the terminal ``stream`` is, None when it is not one (a pipe, a file, TERM=dumb)."""
    if os.environ.get("TERM") == "dumb":
        return None
    try:
        return os.get_terminal_size(stream.fileno()).columns if stream.isatty() else None
    except (AttributeError, OSError, ValueError):
        return None


def _fileno(stream: TextIO) -> int | None:
    try:
        stream.flush()
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None  # an in-memory stream (tests): written through its own write()


class RankPrinter:
    """A launcher sink that prefixes every rank line; multi-host jobs also name the host."""

    def __init__(
        self,
        multi_host: bool,
        out: TextIO | None = None,
        err: TextIO | None = None,
        color: bool | None = None,
        job_id: str = "JOB",
    ):
        self.multi_host = multi_host
        out = out or sys.stdout
        err = err or sys.stderr
        self.color = use_color(out) if color is None else color
        self.err_color = use_color(err) if color is None else color
        # the status line goes to a terminal: stderr's (stdout may be a pipe into a pager or tee), else stdout's
        self.status_on = err if terminal_width(err) else out if terminal_width(out) else None
        status = StatusLine() if self.status_on is not None else None
        self.out = StreamWriter(out, status=status if terminal_width(out) else None)
        self.err = self.out if err is out else StreamWriter(err, status=status if terminal_width(err) else None)
        for writer in (self.out, self.err):
            writer.kept = f"every line is kept: distlaunch logs {job_id}"

    def rank_line(self, host: str, rank: int, fd: int, line: str) -> None:
        prefix = f"[{host} rank {rank}]" if self.multi_host else f"[rank {rank}]"
        if self.color:
            prefix = f"\x1b[{_PALETTE[rank % len(_PALETTE)]}m{prefix}\x1b[0m"
        (self.err if fd == 2 else self.out).put(f"{prefix} {line}\n")  # one piece: ranks' lines never mix

    def notice(self, text: str) -> None:
        """One notice; on a terminal, wrapped at its width between words (a path or a command stays whole), in a
        pipe or a file one line, as grep finds it."""
        width = terminal_width(self.err.stream)
        if width:
            text = textwrap.fill(
                text, width - 1, initial_indent="distlaunch: ", subsequent_indent="  ", break_long_words=False,
                break_on_hyphens=False,
            )[len("distlaunch: "):]  # fmt: skip
        msg = f"\x1b[1;33mdistlaunch:\x1b[0m {text}" if self.err_color else f"distlaunch: {text}"
        self.err.put(msg + "\n", droppable=False)

    def status(self, state: JobStatus) -> None:
        """Redraw the status line (only on a terminal: a pipe or a file gets none)."""
        if self.status_on is None:
            return
        writer = self.err if self.status_on is self.err.stream else self.out
        width = terminal_width(self.status_on) or 80
        writer.status.text = status_text(state, width)  # a str is swapped whole: no lock needed to set it
        writer.redraw_status()

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
        return f"{plural(lines, 'line')} ({plural(size, 'byte')}) of rank output never reached stdout{why} ({self.out.kept})"

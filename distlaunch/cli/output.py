"""Live output of a running job: whole lines with a coloured ``[rank N]`` prefix, one write per line.

Each stream goes through a StreamWriter (cli/streamwriter.py), which never makes supervision wait on a reader: a
file takes every line, and lines that a slow pipe or terminal cannot take are dropped and counted per rank and
per stream, and said on that stream as soon as it moves again. What a stalled or failed stdout never took is said
on stderr at the end, with why, and the job goes on. The job's rank logs keep every line (``distlaunch logs JOB``).
"""

from __future__ import annotations

import os
import sys
import textwrap
from typing import TextIO

from distlaunch.cli.statusline import status_text
from distlaunch.cli.streamwriter import StatusLine, StreamWriter, same_file
from distlaunch.contract.sink import JobStatus

_PALETTE = (36, 32, 33, 35, 34, 96, 92, 93, 95, 94)  # ANSI foreground colours, cycled by rank


def use_color(stream: TextIO) -> bool:
    """Colour on a terminal unless NO_COLOR is set; FORCE_COLOR forces it."""
    if os.environ.get("NO_COLOR"):
        return False
    return bool(os.environ.get("FORCE_COLOR")) or stream.isatty()


def terminal_width(stream: TextIO) -> int | None:
    """Columns of the terminal ``stream`` is, None when it is not one (a pipe, a file, TERM=dumb)."""
    if os.environ.get("TERM") == "dumb":
        return None
    try:
        return os.get_terminal_size(stream.fileno()).columns if stream.isatty() else None
    except (AttributeError, OSError, ValueError):
        return None


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
        if err is out or same_file(out, err):  # one file, pipe or terminal (2>&1): one writer keeps lines whole
            self.err = self.out
            self.out.name_streams = True
        else:
            self.err = StreamWriter(err, status=status if terminal_width(err) else None)
        for writer in (self.out, self.err):
            writer.kept = f"every line is kept: distlaunch logs {job_id}"

    def rank_line(self, host: str, rank: int, fd: int, line: str) -> None:
        prefix = f"[{host} rank {rank}]" if self.multi_host else f"[rank {rank}]"
        if self.color:
            prefix = f"\x1b[{_PALETTE[rank % len(_PALETTE)]}m{prefix}\x1b[0m"
        (self.err if fd == 2 else self.out).put(f"{prefix} {line}\n", rank, fd)  # one piece: lines never mix

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
        self.err.put(msg + "\n")

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
        lost = self.out.unsent()
        if not lost:
            return None
        why = f", as writing it failed: {self.out.failed}" if self.out.failed else ": it did not keep up"
        return f"{lost.count()} of rank output never reached stdout ({lost.per_rank(self.out.name_streams)}){why} ({self.out.kept})"

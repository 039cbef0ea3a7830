"""The ranks' output: their stdout and stderr pipes, read without blocking and sent on as ``out`` events, a
line each (a long line in pieces), and no longer read while the launcher falls behind."""

from __future__ import annotations

import os
import selectors

from distlaunch import protocol as p
from distlaunch.agent.channel import Events
from distlaunch.agent.ranks import Rank

DRAIN_AFTER_EXIT_S = 1.0  # a rank's grandchild may hold its pipes open: stop waiting for EOF after this
# Output lines longer than this travel in pieces, each but the last ending in SPLIT_MARK: the agent's
# and the launcher's memory stay flat whatever a rank prints without a newline.
MAX_LINE_BYTES = 16384
SPLIT_MARK = " [distlaunch: line continues]"


class RankOutput:
    """Reads the pipes of the ranks it watches when the agent's selector says so, and sends their lines.

    The selector's key for a pipe carries ``(rank, fd)`` as its data; pipes are registered only while not
    ``paused`` (the launcher's end has fallen behind: a full pipe then slows the rank, not the agent)."""

    def __init__(self, sel: selectors.BaseSelector, events: Events):
        self.sel = sel
        self.events = events
        self.ranks: list[Rank] = []
        self.paused = False  # rank pipes unregistered while the events' backlog is over its bound

    def watch(self, rank: Rank) -> None:
        """Read this rank's pipes from now on."""
        self.ranks.append(rank)
        for fd, pipe in rank.pipes.items():
            os.set_blocking(pipe.fileno(), False)
            if not self.paused:
                self.sel.register(pipe, selectors.EVENT_READ, (rank, fd))

    def pause(self, pause: bool) -> None:
        """Stop (or resume) reading rank output: a full pipe then slows the rank, not the agent."""
        if pause == self.paused:
            return
        self.paused = pause
        for rank in self.ranks:
            for fd, pipe in rank.pipes.items():
                if pause:
                    self.sel.unregister(pipe)
                else:
                    self.sel.register(pipe, selectors.EVENT_READ, (rank, fd))

    def read(self, pipe, rank: Rank, fd: int) -> None:
        """Take what a pipe holds: whole lines go out, a redrawn line's states too, the rest waits for its end."""
        try:
            chunk = pipe.read(65536)
        except BlockingIOError:
            return
        if not chunk:
            self.close(pipe, rank, fd)
            return
        *lines, rest = (rank.buffers[fd] + chunk).split(b"\n")
        for line in lines:
            self.emit_line(rank, fd, line.rstrip(b"\r"))
        if b"\r" in rest:  # a progress bar redraws its line: show each state now, not at the next newline
            *redraws, rest = rest.split(b"\r")
            for line in redraws:
                if line:
                    self.emit_line(rank, fd, line)
        while len(rest) > MAX_LINE_BYTES:  # a line without end must not grow without bound: split it
            self.events.emit(ev=p.OUT, rank=rank.rank, fd=fd, line=_text(rest[:MAX_LINE_BYTES]) + SPLIT_MARK)
            rest = rest[MAX_LINE_BYTES:]
        rank.buffers[fd] = rest

    def emit_line(self, rank: Rank, fd: int, line: bytes) -> None:
        """One output line, in pieces of at most MAX_LINE_BYTES (every piece but the last marked)."""
        while len(line) > MAX_LINE_BYTES:
            self.events.emit(ev=p.OUT, rank=rank.rank, fd=fd, line=_text(line[:MAX_LINE_BYTES]) + SPLIT_MARK)
            line = line[MAX_LINE_BYTES:]
        self.events.emit(ev=p.OUT, rank=rank.rank, fd=fd, line=_text(line))

    def close(self, pipe, rank: Rank, fd: int) -> None:
        """Send a pipe's unfinished last line and stop reading it."""
        if rank.buffers[fd]:
            self.emit_line(rank, fd, rank.buffers[fd])
            rank.buffers[fd] = b""
        if not self.paused:
            self.sel.unregister(pipe)
        pipe.close()
        del rank.pipes[fd]

    def finished(self, rank: Rank, now: float) -> bool:
        """For a rank that has ended: whether its output is all sent, closing its pipes once they reached their
        end or DRAIN_AFTER_EXIT_S has passed since the exit. Never while paused."""
        if rank.pipes and (self.paused or now - rank.exited_at < DRAIN_AFTER_EXIT_S):
            return False  # paused: its last output waits in the pipe until the launcher catches up
        for fd, pipe in list(rank.pipes.items()):
            self.close(pipe, rank, fd)
        return True


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")

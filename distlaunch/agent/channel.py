"""The agent's end of the launcher's channel: events out on stdout, written without ever blocking, and whole
lines in on stdin (the node plan, then commands), read without buffering."""

from __future__ import annotations

import json
import os
import selectors
import time

# What may wait for the launcher before the agent stops reading its ranks' pipes (which slows them):
# output is written without ever blocking, so a stalled launcher never keeps the agent from its ranks.
OUT_PENDING_BYTES = 1 << 20


class Events:
    """Events for the launcher, written as far as its end takes them now; the rest waits in ``pending``.

    ``on_backlog(True)`` is called when more than OUT_PENDING_BYTES wait, ``on_backlog(False)`` once they
    fit again (an in-memory stream never waits). ``sent_at`` is when the last event was queued."""

    def __init__(self, out, patience: float = 5.0):
        self.out = out
        self.fd = _fileno(out)
        self.open = True  # False once the launcher's end is gone: events are dropped from then on
        self.pending = bytearray()  # events not yet taken by the launcher
        self.sent_at = time.monotonic()
        self.patience = patience  # how long drain() waits for a launcher that takes nothing
        self.on_backlog = _ignore

    def emit(self, **event) -> None:
        """Queue one event and write what the launcher's end takes now."""
        if not self.open:
            return
        self.pending += (json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8")
        self.sent_at = time.monotonic()
        self.flush()

    def flush(self) -> None:
        """Write what the launcher's end takes now; never wait (see OUT_PENDING_BYTES)."""
        if self.fd is None:  # an in-memory stream
            self.out.write(self.pending.decode("utf-8"))
            self.out.flush()
            self.pending.clear()
            return
        try:
            while self.pending:
                n = os.write(self.fd, self.pending)
                del self.pending[:n]
        except BlockingIOError:
            pass
        except OSError:
            self.open = False  # the launcher is gone (SSH channel closed): keep going, stop the ranks
            self.pending.clear()
        self.on_backlog(len(self.pending) > OUT_PENDING_BYTES)

    def waiting(self) -> bool:
        """Whether events wait for the launcher's end to take them (then the loop selects on its descriptor)."""
        return bool(self.pending) and self.fd is not None

    def drain(self) -> None:
        """Hand the last events to the launcher, while it keeps taking them (never forever)."""
        taken_at = time.monotonic()
        while self.pending and self.open and time.monotonic() - taken_at < self.patience:
            before = len(self.pending)
            select_write(self.fd, 0.1)
            self.flush()
            if len(self.pending) < before:
                taken_at = time.monotonic()


class Lines:
    """Whole lines from a raw fd. Unbuffered reads, so that a line that arrived together with another
    is never left in a Python buffer the selector cannot see (a "stop" must never wait for more input)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buffer = b""

    def first(self) -> str:
        """The first line (blocking until it is complete); empty at end of input."""
        while b"\n" not in self.buffer:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return ""
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode("utf-8")

    def read(self) -> list[str] | None:
        """Read once what is available; the complete lines, or None at end of input."""
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:  # stdin shares a non-blocking file description with stdout (a socket)
            return []
        if not chunk:
            return None
        self.buffer += chunk
        return self.split()

    def split(self) -> list[str]:
        """The complete lines in the buffer, taken out of it."""
        *complete, self.buffer = self.buffer.split(b"\n")
        return [c.decode("utf-8") for c in complete if c.strip()]


def select_write(fd: int, timeout: float) -> None:
    """Wait until ``fd`` takes writes, ``timeout`` seconds at most."""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_WRITE)
        sel.select(timeout)


def _fileno(stream) -> int | None:
    try:
        stream.flush()
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _ignore(backlogged: bool) -> None:
    pass

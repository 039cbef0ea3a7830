"""``PipeHub``: one thread that reads the pipes of every host's OpenSSH client, with one selector, so that the
launcher's threads do not grow with its hosts (a thread per host, as paramiko's transports need, costs a
wake-up per host many times a second even while every rank idles).

It reads each client's stdout and hands the complete lines to that host's reader (``Reader.lines``), then its
end (``Reader.ended``); and it finishes the writes to a client's stdin that would have blocked the caller
(``Writer.flush``). Everything else happens in the callers' threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
import time
from typing import Protocol

log = logging.getLogger("distlaunch")
READ_CHUNK = 65536
BATCH_S = 0.05  # the shortest time between two reading rounds while the pipes are not full (see _run)
# A "line" longer than this is handed on in pieces: a peer that never sends a newline must not grow the
# launcher's memory (the agent itself cuts its ranks' long lines far below this).
MAX_LINE_BYTES = 1 << 20


class Reader(Protocol):
    def lines(self, lines: list[bytes]) -> None:
        """Complete lines (without their newline), in order; called in the hub's thread."""

    def ended(self) -> None:
        """The pipe reached its end (the client exited, or closed its stdout)."""


class Writer(Protocol):
    def flush(self) -> bool:
        """Write what waits; True once nothing does (then the hub stops watching the pipe)."""


class PipeHub:
    """The one reader of every agent pipe of a launch. ``add`` a pipe to read, ``flush_later`` a writer whose
    pipe was full; ``close`` stops the thread (pipes still open are left to their owners)."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()  # epoll: no limit on descriptors, O(ready) per wake-up
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._new: list[tuple[int, object, bool]] = []  # (fd, reader or writer, is a writer): for the hub's thread
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ssh-pipes", daemon=True)
        self._thread.start()

    def add(self, fd: int, reader: Reader) -> None:
        """Read ``fd`` (a pipe) until its end, handing its lines to ``reader``."""
        self._hand_over(fd, reader, False)

    def flush_later(self, fd: int, writer: Writer) -> None:
        """``fd`` (a pipe to a client's stdin) was full: ``writer.flush()`` once it takes more."""
        self._hand_over(fd, writer, True)

    def close(self) -> None:
        """Stop the hub's thread: at once, or within 5 s if a reader waits (on a full event queue)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._wake()
        self._thread.join(5)

    def _hand_over(self, fd: int, what: object, write: bool) -> None:
        with self._lock:
            if self._closed:
                return  # the launch is over: nothing more is read or written
            self._new.append((fd, what, write))
            self._wake()

    def _wake(self) -> None:
        """Wake the hub's thread (under the lock: its pipe is closed under it too, and its number may be reused)."""
        with contextlib.suppress(BlockingIOError):  # a wake-up is already pending
            os.write(self._wake_w, b"x")

    def _run(self) -> None:
        partial: dict[int, bytearray] = {}
        full = False  # the last round left data in a pipe: read on at once
        while True:
            # An idle job's hosts each send a heartbeat now and then, at moments of their own, and a wake-up of
            # this thread costs more than the line it reads (~0.1 ms here, the scheduler and the GIL). Rounds at
            # least BATCH_S apart gather many hosts' lines into one: a line is at most BATCH_S late, and a pipe
            # that had more than one read takes is read again without a pause.
            if not full:
                time.sleep(BATCH_S)
            full = False
            for key, _mask in self._selector.select():
                if key.data is None:
                    if not self._take_new(partial):
                        self._shut()
                        return
                    continue
                try:
                    if not isinstance(key.data, _Writing):
                        full = self._read(key.fd, key.data, partial) or full
                    elif key.data.writer.flush():
                        self._selector.unregister(key.fd)
                except Exception:  # a bug must cost its host (its agent is lost), never every host's reader
                    log.exception("reading an agent's pipe failed; that host's agent counts as lost")
                    self._drop(key, partial)

    def _drop(self, key: selectors.SelectorKey, partial: dict[int, bytearray]) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(key.fd)
        partial.pop(key.fd, None)
        if not isinstance(key.data, _Writing):
            with contextlib.suppress(Exception):
                key.data.ended()

    def _take_new(self, partial: dict[int, bytearray]) -> bool:
        """Register what callers handed over; False once the hub is closed."""
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)
        with self._lock:
            new, self._new = self._new, []
            closed = self._closed
        for fd, what, write in new:
            key = self._selector.get_map().get(fd)
            if key is not None and isinstance(key.data, _Writing) and key.data.writer is what:
                continue  # still watched: its flush comes
            if key is not None:  # a pipe its owner closed while it was watched, and this one has its number
                self._selector.unregister(fd)
            events, data = (selectors.EVENT_WRITE, _Writing(what)) if write else (selectors.EVENT_READ, what)
            with contextlib.suppress(ValueError, OSError):  # closed again before the hub saw it
                self._selector.register(fd, events, data)
                if not write:
                    partial[fd] = bytearray()
        return not closed

    def _read(self, fd: int, reader: Reader, partial: dict[int, bytearray]) -> bool:
        """Read what ``fd`` has (one read); True when it may have more."""
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        buffer = partial[fd]
        if not chunk:
            self._selector.unregister(fd)
            del partial[fd]
            if buffer:
                reader.lines([bytes(buffer)])  # a last line without its newline
            reader.ended()
            return False
        buffer += chunk
        if b"\n" in chunk or len(buffer) >= MAX_LINE_BYTES:
            *complete, rest = buffer.split(b"\n")
            if len(rest) >= MAX_LINE_BYTES:
                complete.append(rest)
                rest = b""
            partial[fd] = bytearray(rest)
            reader.lines(complete)
        return len(chunk) == READ_CHUNK

    def _shut(self) -> None:
        with self._lock:
            self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)


class _Writing:
    """A writer as the selector's data (a reader is the reader itself)."""

    def __init__(self, writer: Writer):
        self.writer = writer

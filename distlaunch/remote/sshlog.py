"""paramiko's own log: kept per host for reports, never printed on the user's terminal.

paramiko's transport thread logs every failed handshake with full tracebacks (a port that accepts TCP but
never speaks SSH yields "Error reading SSH protocol banner" and two tracebacks, once per attempt). Callers
already turn each failure into one clear line, so those records are kept here instead. The handler is
installed once for the whole process and stays: after a Ctrl-C the transport thread is the last to die,
and what it logs then must not reach stderr either.
"""

from __future__ import annotations

import logging
import re
from collections import deque

CHANNEL = "paramiko.transport.host."  # + the host's alias: one logger per host, so records say whose they are
KEEP = 8  # per host: the first lines of a failure are what explains it
# lines of a formatted traceback, logged by paramiko one record per line: the report wants the message only
_TRACEBACK_LINE = re.compile(r"^(\s|Traceback \(|During handling|[\w.]+(Error|Exception)(:|$))")


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.by_host: dict[str, deque[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record must not become a traceback of its own
            return
        if not message or _TRACEBACK_LINE.match(message):
            return
        host = record.name[len(CHANNEL) :] if record.name.startswith(CHANNEL) else ""
        kept = self.by_host.setdefault(host, deque(maxlen=KEEP))
        if message not in kept:
            kept.append(message.splitlines()[0])


_handler = _Keep()


def install() -> None:
    """Route paramiko's records here, for the rest of the process (idempotent)."""
    logger = logging.getLogger("paramiko")
    if _handler not in logger.handlers:
        logger.addHandler(_handler)
        logger.propagate = False


def channel(alias: str) -> str:
    """The logger name for a new SSH connection to ``alias`` (``SSHClient.set_log_channel``); what paramiko
    said about an earlier connection to that host is forgotten."""
    install()
    with _handler.lock:
        _handler.by_host.pop(alias, None)
    return CHANNEL + alias


def messages(alias: str) -> list[str]:
    """What paramiko said about ``alias`` (warnings and errors, oldest first, tracebacks left out)."""
    with _handler.lock:
        return list(_handler.by_host.get(alias, ()))

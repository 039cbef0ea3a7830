"""Reading a file that someone else may have replaced: a job record, a dataset index, a checkpoint pointer.

Standard library only, for the launcher and the engine alike.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def open_regular(path: str | Path) -> int:
    """``path`` opened for reading (a descriptor to hand to ``open``), or an OSError that says what it is
    instead: IsADirectoryError for a folder, EINVAL "not a regular file" for a pipe or a device. Opened
    without blocking, so that a pipe in a file's place is refused, never waited on for a writer that may
    never come."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    kind = os.fstat(fd).st_mode
    if stat.S_ISREG(kind):
        return fd
    os.close(fd)
    if stat.S_ISDIR(kind):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    raise OSError(errno.EINVAL, "not a regular file", str(path))

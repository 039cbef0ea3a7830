"""Files and folders that someone else may have replaced or left behind: reading a job record, a dataset
index or a checkpoint pointer; locking a work folder so that a later process can tell an abandoned one
(its owner was killed outright) from a live one; holding a place (a master port, a checkpoint folder)
for one job at a time.

Standard library only, for the launcher, the agent and the engine alike.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path


def os_error_words(err: BaseException) -> str:
    """A failed file operation in a few words, as distlaunch's messages say it: ``no space left on device``."""
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 text (byte {err.start})"
    text = err.strerror if isinstance(err, OSError) and err.strerror else str(err) or type(err).__name__
    return text[:1].lower() + text[1:]  # "No space left on device" as part of a sentence


TEXT_LIMIT = 64 << 20  # a hostfile, config or template over this is not one: a dataset, a device given by mistake


def read_settings(path: str | Path, encoding: str = "utf-8") -> str:
    """The text of a file of settings the user names (a hostfile, a config, a template), of at most TEXT_LIMIT
    bytes: /dev/zero, or a file of many GB named by mistake, would otherwise be read until memory runs out.
    A pipe (bash's ``<(...)``) and /dev/null (``--ssh-config /dev/null``, as ``ssh -F /dev/null``) are read
    as files. OSError says what is wrong (its strerror is the few words for a message); UnicodeDecodeError
    when it is not text."""
    with open(path, "rb") as f:
        data = f.read(TEXT_LIMIT + 1)
    if len(data) > TEXT_LIMIT:
        raise OSError(errno.EFBIG, f"is over {TEXT_LIMIT >> 20} MiB, too large for a file of settings", str(path))
    return data.decode(encoding)


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


def lock_folder(folder: str | Path) -> int | None:
    """A descriptor of ``folder`` holding an exclusive flock on it, or None: a live process holds it, or
    the folder is gone or was replaced since it was named. The kernel drops the lock when its holder ends,
    however it ends, so a folder whose lock can be taken is one its owner left behind. Not inherited by
    child processes."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held, there = os.fstat(fd), os.stat(folder, follow_symlinks=False)
        if (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


class LockHeld(Exception):
    """A live process holds the lock; ``holder`` is what it wrote in the lock file."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


def hold_lock(path: str | Path, holder: str) -> int:
    """A descriptor holding an exclusive flock on the file ``path`` (created if missing, never followed as a
    symlink), with ``holder`` written in it for whoever finds it held (LockHeld). Held until the descriptor
    is closed or the process ends, however it ends; not inherited by child processes. Other OSErrors (a
    file system without locks) are the caller's to judge."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        text = _holder(fd)
        os.close(fd)
        raise LockHeld(text) from None
    except OSError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, holder.encode("utf-8"), 0)
    return fd


def lock_holder(path: str | Path) -> str | None:
    """Who holds the lock file ``path`` (what it wrote), or None when nobody does; creates nothing, and a
    file it cannot lock (missing, another file system's rules) counts as free."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    except OSError:
        return None
    finally:
        os.close(fd)  # releases it, when it was taken here
    return None


def _holder(fd: int) -> str:
    return os.pread(fd, 300, 0).decode("utf-8", "replace").strip() or "another process"

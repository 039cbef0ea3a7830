"""A fixed master port belongs to one job at a time on the master's machine.

Nothing listens on MASTER_PORT until rank 0 starts its store, so two launches at the same instant on one
fixed port could both find it free, and the second job's ranks could join the first job's store. Each
launch whose master is this machine therefore holds a lock named after the port (flock: the kernel drops
it when the launcher exits, however it exits) for the whole job.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from distlaunch.errors import UsageError
from distlaunch.files import LockHeld, hold_lock
from distlaunch.jobs.store import state_dir


@contextmanager
def hold_port(port: int, job_id: str) -> Iterator[None]:
    """Hold ``port`` for ``job_id`` until the block ends; another job holding it is a one-line error."""
    folder = state_dir() / "ports"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = hold_lock(folder / f"{port}.lock", job_id)
    except LockHeld as held:
        raise UsageError(
            f"--master-port {port} is held by distlaunch job {held.holder} on this machine (the master)",
            "pick another port, or leave --master-port auto (a free one is chosen); two jobs on one port "
            "would cross-connect",
        ) from None
    try:
        yield
    finally:
        os.close(fd)  # releases the lock

"""The agent's scratch folder in the temp folder: its ranks' stacks and progress files and their NCCL dumps, on
their way to the launcher. Each agent locks its own; folders no live agent holds are swept by the next agent."""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from distlaunch.files import lock_folder

SCRATCH_PREFIX = "distlaunch-agent-"
PROGRESS, REQUEST, STACKS = "progress", "request", "stacks"  # the kinds of a rank's own files (rank_file)
SCRATCH_SWEEP_AGE_S = 60.0  # younger folders may be an agent's that is about to lock its own
_held_scratch: list[int] = []  # the descriptor that holds this agent's lock, for as long as it lives


def make_scratch() -> str:
    """This agent's scratch folder, locked (flock) for as long as the agent lives: the kernel drops the lock
    when the agent ends, however it ends. Folders of agents that were killed outright (SIGKILL, the OOM
    killer), which no live agent holds, are removed first, so they do not pile up in the temp folder."""
    sweep_scratch()
    path = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
    fd = lock_folder(path)  # young: no sweep takes it before this lock
    if fd is not None:
        _held_scratch.append(fd)
    return path


def sweep_scratch() -> list[str]:
    """Remove this user's abandoned agent scratch folders: older than a minute and locked by no agent."""
    root, removed = tempfile.gettempdir(), []
    try:
        names = [name for name in os.listdir(root) if name.startswith(SCRATCH_PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(root, name)
        try:
            info = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        if info.st_uid != os.getuid() or time.time() - info.st_mtime < SCRATCH_SWEEP_AGE_S:
            continue
        fd = lock_folder(path)
        if fd is None:  # a live agent's
            continue
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
        removed.append(path)
    return removed


def rank_file(scratch: str, rank: int, kind: str) -> str:
    """A rank's own file of ``kind`` (PROGRESS, REQUEST, STACKS) in the scratch folder: ``rank<rank>.<kind>``."""
    return os.path.join(scratch, f"rank{rank}.{kind}")

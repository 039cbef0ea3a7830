"""What the ranks leave behind outside their process groups (``setsid``, double fork): found by the job's
marks in their environment, ended when the node's ranks are all gone. (The protocol calls them stragglers;
they are stray processes, not slow ranks.)"""

from __future__ import annotations

import contextlib
import os
import signal
import time


def end_stragglers(specs: list[dict]) -> list[int]:
    """End what the ranks left behind outside their process groups (``setsid``, double fork): this
    user's processes whose environment carries this job's id and this node's rank."""
    env = (specs or [{"env": {}}])[0]["env"]
    if "DISTLAUNCH_JOB_ID" not in env:
        return []
    marks = {f"DISTLAUNCH_JOB_ID={env['DISTLAUNCH_JOB_ID']}".encode(), f"NODE_RANK={env.get('NODE_RANK')}".encode()}
    found = [pid for pid in _pids_with(marks) if pid != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 1.0
        while sig == signal.SIGTERM and time.monotonic() < deadline and any(is_running(pid) for pid in found):
            time.sleep(0.05)
    return found


def is_running(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _pids_with(marks: set[bytes]) -> list[int]:
    """This user's processes whose environment holds every one of ``marks`` (NAME=VALUE)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marks <= set(f.read().split(b"\0")):
                    found.append(int(entry))
        except OSError:
            continue
    return found

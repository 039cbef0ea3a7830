"""The places a training job writes (``checkpoint.dir``, the metrics file), checked torch-free without
creating anything, so ``distlaunch train`` (before any rank starts, ``--dry-run`` too) and the ranks (at
start, and at every save) refuse them in the same words."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from distlaunch.errors import UsageError
from distlaunch.files import LockHeld, hold_lock, lock_holder
from distlaunch.training.checkpoint.folder import LATEST_FILE, LATEST_TMP, is_checkpoint, os_reason

CHECKPOINT_DIR, METRICS_FILE = "checkpoint.dir", "metrics file"
# In checkpoint.dir, locked by the rank 0 of the job that trains into it: two jobs in one folder would
# delete each other's saves in progress (as leftovers), prune each other's checkpoints and resume each other.
CHECKPOINT_LOCK = ".distlaunch-lock"
PLACE_FIXES = {
    CHECKPOINT_DIR: "point checkpoint.dir at a folder you can write; missing folders are created",
    METRICS_FILE: "point --metrics-file or --log-dir at a place you can write; missing folders are created",
}


def metrics_path(cli_value: str | Path | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """Where rank 0 writes metrics.jsonl (the order: engine/metrics.py's docstring); torch-free, so
    ``distlaunch train`` finds the place as its rank 0 will."""
    env = os.environ if environ is None else environ
    if cli_value:
        return Path(cli_value)
    if env.get("DISTLAUNCH_METRICS_FILE"):
        return Path(env["DISTLAUNCH_METRICS_FILE"])
    if env.get("DISTLAUNCH_LOG_DIR"):
        return Path(env["DISTLAUNCH_LOG_DIR"]) / "metrics.jsonl"
    return None


def place_problem(path: Path, folder: bool) -> str | None:
    """Why a job cannot write ``path`` (a folder when ``folder``, else a file it appends to), found
    without creating anything; None when it can. The end of a sentence that starts with the path:
    ``is a file, not a folder``, ``cannot be created: /x is a file, not a folder``, ``is not writable``.
    A checkpoint folder's ``latest`` (and ``latest.tmp``, written before it) must not be a folder: it would
    fail the first save."""
    if os.path.lexists(path):
        if folder and not path.is_dir():
            return f"is {_not_a_folder(path)}"
        pointer = next((name for name in (LATEST_FILE, LATEST_TMP) if (path / name).is_dir()), None)
        if folder and pointer:
            return f"holds a folder named {pointer}, where distlaunch keeps its pointer file (move it)"
        if not folder and path.is_dir():
            return "is a folder, not a file"
        if path.exists() and not os.access(path, os.W_OK | (os.X_OK if folder else 0)):
            return "is not writable"
        return None
    parent = path.parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot be created: {parent} is {_not_a_folder(parent)}"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created: {parent} is not writable"
    return None


def _not_a_folder(path: Path) -> str:
    return "a file, not a folder" if path.is_file() else "not a folder"


def place_refusal(what: str, path: Path, why: str) -> UsageError:
    """The one refusal of a place a job cannot write (``what``: CHECKPOINT_DIR or METRICS_FILE)."""
    return UsageError(f"{what} {path} {why}", PLACE_FIXES[what])


def check_place(what: str, path: Path, folder: bool) -> None:
    """UsageError when ``path`` cannot be written (``place_problem``), or is one checkpoint where a folder of
    them belongs; creates nothing (--dry-run too)."""
    if what == CHECKPOINT_DIR and is_checkpoint(path):  # saves would go inside it, and nothing resumes from it
        raise UsageError(
            f"checkpoint.dir {path} is one checkpoint ({path.name}), not the folder of a run's checkpoints",
            f"point checkpoint.dir at {path.parent}, or resume from this one with --resume {path}",
        )
    why = place_problem(path, folder)
    if why is not None:
        raise place_refusal(what, path, why)


def create_checkpoint_dir(root: Path) -> None:
    """Create ``checkpoint.dir`` (rank 0, before the first step and at every save), or UsageError
    saying in one line why it cannot be (a parent that is a file, no write permission)."""
    check_place(CHECKPOINT_DIR, root, folder=True)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # what the check cannot foresee: a read-only or special filesystem
        raise place_refusal(CHECKPOINT_DIR, root, f"cannot be created: {os_reason(root, err)}") from None


def in_use(root: Path, holder: str) -> UsageError:
    """The one refusal of a ``checkpoint.dir`` another running job trains into."""
    return UsageError(
        f"checkpoint.dir {root} is in use by {holder}",
        "give this job a checkpoint.dir of its own, or wait until that job ends (two jobs in one folder would "
        "delete, prune and resume each other's checkpoints)",
    )


def check_not_in_use(root: Path) -> None:
    """UsageError when a running job holds ``root`` (the launcher's look, before any rank starts)."""
    holder = lock_holder(root / CHECKPOINT_LOCK)
    if holder is not None:
        raise in_use(root, holder)


def hold_checkpoint_dir(root: Path, holder: str) -> int | None:
    """Rank 0 holds ``root`` for its job until it ends (the descriptor to close then), or UsageError when
    another job does. None where the file system has no locks (some network file systems): unguarded."""
    try:
        return hold_lock(root / CHECKPOINT_LOCK, holder)
    except LockHeld as held:
        raise in_use(root, held.holder) from None
    except OSError:
        return None

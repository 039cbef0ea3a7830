"""What ``distlaunch checkpoint inspect`` and ``verify`` show: manifests, siblings, damage.

Torch-free: everything comes from ``meta.json`` files, directory listings and file checksums.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from distlaunch.training.checkpoint.folder import (
    LEFTOVER,
    is_checkpoint,
    list_checkpoints,
    locate_checkpoint,
    read_latest,
    step_of,
)
from distlaunch.training.checkpoint.integrity import checkpoint_files, verify_share
from distlaunch.training.checkpoint.manifest import CheckpointMeta, read_manifest


class CheckpointEntry(BaseModel):
    """One published checkpoint next to the inspected one."""

    step: int
    path: str
    files_bytes: int
    damage: str | None = None  # the first problem found (manifest, missing or truncated file)


class CheckpointReport(BaseModel):
    """The inspected checkpoint, and what else its directory holds."""

    path: str
    meta: CheckpointMeta | None  # None: the manifest itself is damaged
    damage: list[str]  # missing or truncated files, a damaged manifest (checksums: ``checkpoint verify``)
    checksums: int  # files with a recorded checksum
    pointer_problem: str | None  # a warning: the latest pointer could not be followed (what is used instead)
    root: str
    latest: str | None
    checkpoints: list[CheckpointEntry]
    leftovers: list[str]  # unfinished saves (*.tmp-*) and interrupted deletions (*.trash-*)


def _entry(path: Path) -> CheckpointEntry:
    meta, problem = read_manifest(path)
    damage = problem or next(iter(verify_share(path, checksum=False)), None)
    return CheckpointEntry(
        step=step_of(path) or 0, path=str(path), files_bytes=meta.files_bytes if meta else 0, damage=damage
    )


def inspect_checkpoint(path: str | Path) -> CheckpointReport:
    """Read the manifest of ``path`` (a step directory, or a root: its latest) and check file sizes."""
    checkpoint, _ = locate_checkpoint(path)
    root = checkpoint.parent
    latest, pointer_problem = read_latest(root)
    meta, _ = read_manifest(checkpoint)
    leftovers = sorted(str(p) for p in root.iterdir() if LEFTOVER.match(p.name))
    return CheckpointReport(
        path=str(checkpoint),
        meta=meta,
        damage=verify_share(checkpoint, checksum=False),
        checksums=len(meta.files) if meta else 0,
        pointer_problem=pointer_problem,
        root=str(root),
        latest=str(latest) if latest else None,
        checkpoints=[_entry(p) for p in list_checkpoints(root)],
        leftovers=leftovers,
    )


class VerifiedCheckpoint(BaseModel):
    """One checkpoint as ``checkpoint verify`` found it."""

    path: str
    step: int
    files: int  # files checked against a recorded checksum
    bytes: int
    unverified: int = 0  # files without a recorded checksum (all of them: written by an older distlaunch)
    problems: list[str]


class VerifyReport(BaseModel):
    """``distlaunch checkpoint verify``: every published checkpoint under a folder (or the one named)."""

    path: str
    pointer_problem: str | None  # a warning only: it does not make the report fail
    checkpoints: list[VerifiedCheckpoint]

    @property
    def ok(self) -> bool:
        """Every checkpoint intact (a bad ``latest`` pointer is not a damaged checkpoint)."""
        return all(not c.problems for c in self.checkpoints)


def verify_folder(path: str | Path, index_check: Callable[[Path], list[str]] | None = None) -> VerifyReport:
    """Check every file of each checkpoint against its recorded size and SHA-256.

    ``path`` is a step directory (that one) or a checkpoint root (all of its published
    checkpoints). ``index_check(checkpoint)`` may add problems of the DCP index (it needs torch).
    """
    path = Path(path).expanduser()
    if is_checkpoint(path):
        targets, pointer_problem = [path], None
    else:
        _, pointer_problem = locate_checkpoint(path)  # UsageError when there is nothing to verify
        targets = list_checkpoints(path)
    found = []
    for checkpoint in targets:
        meta, _ = read_manifest(checkpoint)
        problems = verify_share(checkpoint)
        if not problems and index_check is not None:
            problems += index_check(checkpoint)
        recorded = meta.files if meta else {}
        found.append(
            VerifiedCheckpoint(
                path=str(checkpoint),
                step=step_of(checkpoint) or 0,
                files=len(recorded),
                bytes=sum(d.bytes for d in recorded.values()),
                unverified=len([name for name in checkpoint_files(checkpoint) if name not in recorded]),
                problems=problems,
            )
        )
    return VerifyReport(path=str(path), pointer_problem=pointer_problem, checkpoints=found)

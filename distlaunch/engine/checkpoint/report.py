"""What ``distlaunch checkpoint inspect`` shows: one checkpoint's manifest and its siblings.

Torch-free: everything comes from ``meta.json`` files and directory listings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import BaseModel

from distlaunch.engine.checkpoint.manifest import (
    LEFTOVER,
    CheckpointMeta,
    latest_checkpoint,
    list_checkpoints,
    read_meta,
    resolve_checkpoint,
    step_of,
)


class CheckpointEntry(BaseModel):
    """One published checkpoint next to the inspected one."""

    step: int
    path: str
    files_bytes: int


class CheckpointReport(BaseModel):
    """The inspected checkpoint, and what else its directory holds."""

    path: str
    meta: CheckpointMeta
    root: str
    latest: Optional[str]
    checkpoints: list[CheckpointEntry]
    leftovers: list[str]  # unfinished saves (*.tmp-*) and interrupted deletions (*.trash-*)


def inspect_checkpoint(path: str | Path) -> CheckpointReport:
    """Read the manifest of ``path`` (a step directory, or a root: its latest)."""
    checkpoint = resolve_checkpoint(path)
    root = checkpoint.parent
    latest = latest_checkpoint(root)
    entries = [CheckpointEntry(step=step_of(p) or 0, path=str(p), files_bytes=read_meta(p).files_bytes)
               for p in list_checkpoints(root)]
    leftovers = sorted(str(p) for p in root.iterdir() if LEFTOVER.match(p.name))
    return CheckpointReport(path=str(checkpoint), meta=read_meta(checkpoint), root=str(root),
                            latest=str(latest) if latest else None, checkpoints=entries, leftovers=leftovers)

"""The checkpoint directory on disk: names, the ``meta.json`` manifest, the ``latest`` pointer.

Torch-free on purpose: ``distlaunch checkpoint inspect`` reads checkpoints with this module alone.

::

    <checkpoint.dir>/
      step_000010/             a published checkpoint: DCP shards + .metadata + meta.json
      step_000015/
      latest                   "step_000015\\n", replaced atomically (latest.tmp + os.replace)
      step_000020.tmp-<tag>/   a save in progress (or one that crashed): never read, removed later

A directory counts as a checkpoint only if its name is ``step_<digits>`` and it holds
``meta.json``, which rank 0 writes as the last file, after every rank finished writing.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from pydantic import BaseModel

from distlaunch.errors import UsageError

FORMAT_VERSION = 1
META_FILE = "meta.json"
LATEST_FILE = "latest"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")
LEFTOVER = re.compile(r"^step_\d{6,}\.(tmp|trash)-")


class ComponentSize(BaseModel):
    """One part of the saved state (model, optimizer, extra, rng): entry count and bytes."""

    entries: int = 0
    numel: int = 0
    bytes: int = 0


class Layout(BaseModel):
    """The parallel layout the checkpoint was written with (any layout can read it)."""

    dp: int
    tp: int
    pp: int
    zero: int
    world_size: int


class FileDigest(BaseModel):
    """One file of a checkpoint as it was written: size and SHA-256."""

    bytes: int
    sha256: str


class CheckpointMeta(BaseModel):
    """``meta.json``: what was saved, by which job, at which step."""

    format: int = FORMAT_VERSION
    step: int
    preset: str
    layout: Layout
    components: dict[str, ComponentSize]
    files_bytes: int
    extras: list[str]  # registered train-state parts (LR schedule, loss scaler, ...)
    job: str
    saved_at: str  # ISO-8601 UTC
    torch_version: str
    save_seconds: float
    # every file but meta.json, checked before a load (empty in checkpoints of older versions)
    files: dict[str, FileDigest] = {}


def step_dir_name(step: int) -> str:
    """``step_000012``: zero-padded so names sort like steps."""
    return f"step_{step:06d}"


def step_of(path: Path) -> int | None:
    """The step a checkpoint directory name encodes, or None for anything else."""
    match = _STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


def is_checkpoint(path: Path) -> bool:
    """A published checkpoint: a ``step_N`` directory with its manifest."""
    return step_of(path) is not None and (path / META_FILE).is_file()


def list_checkpoints(root: Path) -> list[Path]:
    """Published checkpoints under ``root``, oldest step first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and is_checkpoint(p)]
    return sorted(found, key=lambda p: step_of(p) or 0)


def latest_checkpoint(root: Path) -> Path | None:
    """What ``latest`` names, if that is a published checkpoint; else the newest one (or None).

    The fallback covers the one window where the pointer can name a directory that is briefly
    absent: re-publishing a step that already existed (the old copy is moved aside first).
    """
    name, _ = read_pointer(root)
    if name is not None and is_checkpoint(root / name):
        return root / name
    found = list_checkpoints(root)
    return found[-1] if found else None


def read_pointer(root: Path) -> tuple[str | None, str | None]:
    """The directory name ``latest`` holds, or None and what is wrong with the pointer.

    A damaged pointer (not UTF-8, not a ``step_N`` name) is never followed; the newest published
    checkpoint is used instead.
    """
    pointer = root / LATEST_FILE
    if not pointer.is_file():
        return None, None
    try:
        name = pointer.read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        return None, f"{pointer} is unreadable ({err.__class__.__name__}); using the newest step_N directory"
    if _STEP_DIR.match(name) is None:
        return None, f"{pointer} does not name a step_N directory ({name[:40]!r}); using the newest step_N directory"
    return name, None


def resolve_checkpoint(path: str | Path) -> Path:
    """A step directory, or a checkpoint root (its latest); UsageError when neither."""
    path = Path(path).expanduser()
    if is_checkpoint(path):
        return path
    if not path.exists():
        raise UsageError(f"checkpoint not found: {path}", "pass a checkpoint.dir or one of its step_N directories")
    latest = latest_checkpoint(path)
    if latest is None:
        raise UsageError(
            f"no published checkpoint in {path}",
            "a checkpoint is a step_N directory with meta.json; *.tmp-* directories are unfinished saves",
        )
    return latest


def read_meta(path: Path) -> CheckpointMeta:
    """The manifest of a published checkpoint."""
    return CheckpointMeta.model_validate_json((path / META_FILE).read_text())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_durably(path: Path, text: str) -> None:
    """Write, flush and fsync ``path`` (so a rename after it publishes complete bytes)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def write_meta(tmp_dir: Path, meta: CheckpointMeta) -> None:
    """The manifest, written last into the not-yet-published directory."""
    write_file_durably(tmp_dir / META_FILE, meta.model_dump_json(indent=2) + "\n")


def publish(root: Path, tmp_dir: Path, step: int, tag: str) -> Path:
    """Rename ``tmp_dir`` to ``step_N`` and move ``latest`` to it, each step atomic."""
    final = root / step_dir_name(step)
    trash = None
    if final.exists():  # the same step saved again (resumed from an older checkpoint)
        trash = root / f"{final.name}.trash-{tag}"
        os.rename(final, trash)
    os.rename(tmp_dir, final)
    _fsync_dir(root)
    pointer_tmp = root / f"{LATEST_FILE}.tmp"
    write_file_durably(pointer_tmp, final.name + "\n")
    os.replace(pointer_tmp, root / LATEST_FILE)
    _fsync_dir(root)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    return final


def remove_leftovers(root: Path) -> list[Path]:
    """Delete unfinished saves (``*.tmp-*``) and half-deleted old checkpoints (``*.trash-*``)."""
    removed = []
    if not root.is_dir():
        return removed
    for path in root.iterdir():
        if LEFTOVER.match(path.name):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def prune(root: Path, keep: int, tag: str) -> list[Path]:
    """Keep the newest ``keep`` checkpoints (and whatever ``latest`` names); delete the rest.

    Each victim is first renamed to ``*.trash-*`` (atomic), so a kill in the middle of the
    deletion leaves a leftover the next save removes, never a damaged ``step_N``.
    """
    latest = latest_checkpoint(root)
    found = list_checkpoints(root)
    removed = []
    for path in found[: max(len(found) - keep, 0)]:
        if path == latest:
            continue
        trash = root / f"{path.name}.trash-{tag}"
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(path)
    return removed


def directory_bytes(path: Path) -> int:
    """Total size of the files directly in ``path``."""
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())

"""Checksums of a checkpoint's files: recorded in ``meta.json`` at save, verified before a load.

Torch-free, so ``distlaunch checkpoint inspect`` and ``verify`` report damage without loading
torch. The work is split by file name (``share``): with N ranks, each hashes every N-th file, so
a resume verifies the checkpoint in parallel and only then trusts it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from distlaunch.training.checkpoint.folder import META_FILE, regular_file
from distlaunch.training.checkpoint.manifest import (
    CheckpointMeta,
    DamagedCheckpoint,
    FileDigest,
    read_manifest,
    read_meta,
)

CHUNK = 4 << 20


def digest(path: Path) -> FileDigest:
    """Size and SHA-256 of ``path``, read in chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return FileDigest(bytes=size, sha256=h.hexdigest())


def checkpoint_files(path: Path) -> list[str]:
    """The files a checkpoint's manifest covers: everything in the directory but ``meta.json``."""
    return sorted(p.name for p in path.iterdir() if p.is_file() and p.name != META_FILE)


def share(names: list[str], rank: int, world: int) -> list[str]:
    """The files rank ``rank`` of ``world`` hashes: every ``world``-th of the sorted names."""
    return sorted(names)[rank::world]


def check_file(checkpoint: Path, name: str, expected: FileDigest, checksum: bool = True) -> str | None:
    """What is wrong with one file (None: intact); ``checksum=False`` checks presence and size only."""
    path = checkpoint / name
    info, problem = regular_file(path)
    if info is None:
        return f"{name} {problem}"
    size = info.st_size
    if size != expected.bytes:
        return f"{name} has {size} bytes, the manifest recorded {expected.bytes} (truncated or overwritten)"
    if checksum and digest(path).sha256 != expected.sha256:
        return f"{name} does not match its SHA-256 in the manifest (the bytes were altered)"
    return None


def verify_share(checkpoint: Path, rank: int = 0, world: int = 1, checksum: bool = True) -> list[str]:
    """Problems in the manifest and in this rank's share of the files (empty: intact).

    A manifest without checksums (written by an older distlaunch) has nothing to compare.
    """
    meta, problem = read_manifest(checkpoint)
    if problem is not None:
        return [problem] if rank == 0 else []
    assert meta is not None
    problems = [
        p
        for name in share(list(meta.files), rank, world)
        if (p := check_file(checkpoint, name, meta.files[name], checksum))
    ]
    return problems


def require_intact(checkpoint: Path, hint: str) -> CheckpointMeta:
    """The manifest of ``checkpoint`` after verifying every file; DamagedCheckpoint if any is bad."""
    problems = verify_share(checkpoint)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DamagedCheckpoint(f"checkpoint {checkpoint} is damaged: {problems[0]}{more}", hint)
    return read_meta(checkpoint)

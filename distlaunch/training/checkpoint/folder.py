"""The checkpoint directory on disk: step names, the ``latest`` pointer, finding, publishing and pruning.

Torch-free on purpose: ``distlaunch checkpoint inspect`` and the launcher's checks before a resume read
checkpoints with this module and ``manifest.py`` alone.

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

import contextlib
import errno
import os
import re
import shutil
import stat
from pathlib import Path

from distlaunch.errors import UsageError
from distlaunch.files import open_regular, os_error_words

META_FILE = "meta.json"
LATEST_FILE = "latest"
LATEST_TMP = f"{LATEST_FILE}.tmp"  # the pointer being written, renamed over LATEST_FILE
_STEP_DIR = re.compile(r"^step_(\d{6,})$")
LEFTOVER = re.compile(r"^step_\d{6,}\.(tmp|trash)-")


def is_shard_name(name: str) -> bool:
    """A plain name of a file inside a checkpoint directory, as the manifest and the DCP index must give
    them: nothing that reaches outside it (``..``, ``/``), and not the manifest itself."""
    return name not in ("", ".", "..", META_FILE) and "/" not in name and "\\" not in name


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
    try:
        found = [p for p in root.iterdir() if p.is_dir() and is_checkpoint(p)]
    except OSError:  # not a directory, gone, unreadable: nothing published here (resolve says why)
        return []
    return sorted(found, key=lambda p: step_of(p) or 0)


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``root`` stands for: what ``latest`` names, else the newest one (or None)."""
    return read_latest(root)[0]


def read_latest(root: Path) -> tuple[Path | None, str | None]:
    """The one rule for ``latest``, used by inspect, verify, export and resume: the checkpoint it
    names if that is a published one; otherwise the newest published checkpoint, and a warning that
    names the pointer, what is wrong with it and which checkpoint is used instead.

    No pointer at all is not worth a warning: a publish interrupted between renaming the directory
    and writing ``latest`` leaves exactly that, and the newest checkpoint is the right one.
    """
    found = list_checkpoints(root)
    newest = found[-1] if found else None
    pointer = root / LATEST_FILE
    name, problem = _pointer_target(pointer)
    if name is not None:
        target = root / name
        if is_checkpoint(target):
            return target, None
        if not os.path.lexists(target):
            problem = f"{pointer} names {name}, which does not exist"
        elif target.is_dir():
            problem = f"{pointer} names {name}, which has no {META_FILE} (not a published checkpoint)"
        else:
            problem = f"{pointer} names {name}, which is not a directory"
    if problem is None:
        return newest, None
    instead = f"using {newest.name} instead" if newest else "and there is no published checkpoint to use instead"
    return newest, f"{problem}; {instead}"


def _pointer_target(pointer: Path) -> tuple[str | None, str | None]:
    """The ``step_N`` name the pointer file holds, or None and what is wrong with it (None, None: no pointer)."""
    if not os.path.lexists(pointer):
        return None, None
    try:
        with open(open_regular(pointer), "rb") as f:  # a pipe in its place is refused, never waited on
            data = f.read(256)  # a step name is ~12 bytes: never read a huge file that landed here
    except IsADirectoryError:
        return None, f"{pointer} is a directory, not a pointer file"
    except OSError as err:
        if err.errno == errno.EINVAL:
            return None, f"{pointer} is not a regular file, not a pointer file"
        return None, f"{pointer} is unreadable ({os_reason(pointer, err)})"
    try:
        name = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None, f"{pointer} is unreadable (UnicodeDecodeError)"
    if _STEP_DIR.match(name) is None:
        return None, f"{pointer} does not name a step_N directory ({name[:40]!r})"
    return name, None


def os_reason(path: Path, err: OSError) -> str:
    """Why ``path`` cannot be used, in a few words: a symlink loop, a dangling link, or the system's reason."""
    if err.errno == errno.ELOOP:
        return "a symlink loop"
    if err.errno == errno.ENOENT and os.path.islink(path):
        return f"a symlink to {os.readlink(path)}, which does not exist"
    return os_error_words(err)


def regular_file(path: Path) -> tuple[os.stat_result | None, str | None]:
    """A checkpoint file's stat, or None and why it cannot be read as a file, to follow its name: ``is
    missing``, ``is a directory, not a file``, ``cannot be read (a symlink loop)``. A symlink to a file is one."""
    try:
        info = path.stat()
    except OSError as err:
        if err.errno == errno.ENOENT and not os.path.islink(path):
            return None, "is missing"
        return None, f"cannot be read ({os_reason(path, err)})"
    if stat.S_ISDIR(info.st_mode):
        return None, "is a directory, not a file"
    if not stat.S_ISREG(info.st_mode):
        return None, "is not a regular file"
    return info, None


def path_problem(path: Path) -> str | None:
    """What keeps ``path`` from being a checkpoint directory or root (None: a readable directory)."""
    try:
        info = path.stat()
    except OSError as err:
        if err.errno == errno.ELOOP or (err.errno == errno.ENOENT and os.path.islink(path)):
            return f"checkpoint path {path} is {os_reason(path, err)}"
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            return f"checkpoint not found: {path}"
        return f"checkpoint path {path} cannot be read ({os_reason(path, err)})"
    if not stat.S_ISDIR(info.st_mode):
        return f"checkpoint path {path} is a file, not a checkpoint directory"
    try:
        os.listdir(path)
    except OSError as err:
        return f"checkpoint directory {path} cannot be read ({os_reason(path, err)})"
    return None


def locate_checkpoint(path: str | Path) -> tuple[Path, str | None]:
    """A step directory, or a checkpoint root (its latest, and the pointer's warning); UsageError when neither."""
    path = Path(path).expanduser()
    if is_checkpoint(path):
        return path, None
    problem = path_problem(path)
    if problem is not None:
        raise UsageError(problem, "pass a checkpoint.dir or one of its step_N directories")
    latest, warning = read_latest(path)
    if latest is not None:
        return latest, warning
    if step_of(path) is not None:
        raise UsageError(
            f"{path} has no {META_FILE}: not a published checkpoint (an unfinished save, or damaged)",
            "pass its checkpoint.dir to use the newest published checkpoint, or another step_N directory",
        )
    raise UsageError(
        f"no published checkpoint in {path}",
        "a checkpoint is a step_N directory with meta.json; *.tmp-* directories are unfinished saves",
    )


def resolve_checkpoint(path: str | Path) -> Path:
    """A step directory, or a checkpoint root (its latest); UsageError when neither."""
    return locate_checkpoint(path)[0]


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


def publish(root: Path, tmp_dir: Path, step: int, tag: str) -> Path:
    """Rename ``tmp_dir`` to ``step_N`` and move ``latest`` to it, each step atomic."""
    final = root / step_dir_name(step)
    trash = None
    if final.exists():  # the same step saved again (resumed from an older checkpoint)
        trash = root / f"{final.name}.trash-{tag}"
        os.rename(final, trash)
    os.rename(tmp_dir, final)
    _fsync_dir(root)
    pointer_tmp = root / LATEST_TMP
    write_file_durably(pointer_tmp, final.name + "\n")
    os.replace(pointer_tmp, root / LATEST_FILE)
    _fsync_dir(root)
    if trash is not None:
        discard(trash)
    return final


def remove_leftovers(root: Path) -> list[Path]:
    """Delete unfinished saves (``*.tmp-*``) and half-deleted old checkpoints (``*.trash-*``)."""
    removed = []
    if not root.is_dir():
        return removed
    for path in root.iterdir():
        if LEFTOVER.match(path.name):
            discard(path)
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
        discard(trash)
        removed.append(path)
    return removed


def discard(path: Path) -> None:
    """Delete what a save or a prune set aside: a checkpoint folder, or a file or link that stood in a
    ``step_N``'s place (a folder's delete would leave that behind for good)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def directory_bytes(path: Path) -> int:
    """Total size of the files directly in ``path``."""
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())

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

import errno
import os
import re
import shutil
import stat
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from distlaunch.errors import DistlaunchError, ExitCode, UsageError

FORMAT_VERSION = 1
META_FILE = "meta.json"
LATEST_FILE = "latest"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")
LEFTOVER = re.compile(r"^step_\d{6,}\.(tmp|trash)-")


class ComponentSize(BaseModel):
    """One part of the saved state (model, optimizer, extra, rng): entry count and bytes."""

    entries: int = Field(0, ge=0)
    numel: int = Field(0, ge=0)
    bytes: int = Field(0, ge=0)


class Layout(BaseModel):
    """The parallel layout the checkpoint was written with (any layout can read it)."""

    dp: int = Field(ge=1)
    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    zero: int = Field(ge=0, le=3)
    world_size: int = Field(ge=1)

    @model_validator(mode="after")
    def _one_rank_per_cell(self) -> Layout:
        if self.world_size != self.dp * self.tp * self.pp:
            raise ValueError(f"world_size {self.world_size} is not dp*tp*pp = {self.dp * self.tp * self.pp}")
        return self


class FileDigest(BaseModel):
    """One file of a checkpoint as it was written: size and SHA-256."""

    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class CheckpointMeta(BaseModel):
    """``meta.json``: what was saved, by which job, at which step."""

    format: int = FORMAT_VERSION
    step: int = Field(ge=1)  # the last step trained: a checkpoint is saved after a step, never before the first
    preset: str = Field(min_length=1)
    layout: Layout
    components: dict[str, ComponentSize]
    files_bytes: int = Field(ge=0)
    extras: list[str]  # registered train-state parts (LR schedule, loss scaler, ...)
    job: str
    saved_at: str  # ISO-8601 UTC
    torch_version: str
    save_seconds: float = Field(ge=0)
    # every file but meta.json, checked before a load (empty in checkpoints of older versions)
    files: dict[str, FileDigest] = {}

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: int) -> int:
        if not 1 <= value <= FORMAT_VERSION:
            raise ValueError(f"this distlaunch reads format 1 to {FORMAT_VERSION} (a newer distlaunch wrote it?)")
        return value

    @field_validator("files")
    @classmethod
    def _plain_names(cls, files: dict[str, FileDigest]) -> dict[str, FileDigest]:
        # verify hashes each named file: a name must never reach outside the checkpoint directory
        for name in files:
            if name in ("", ".", "..", META_FILE) or "/" in name or "\\" in name:
                raise ValueError(f"{name!r} is not the name of a file in the checkpoint directory")
        return files


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
        with open(pointer, "rb") as f:
            data = f.read(256)  # a step name is ~12 bytes: never read a huge file that landed here
    except IsADirectoryError:
        return None, f"{pointer} is a directory, not a pointer file"
    except OSError as err:
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
    return (err.strerror or err.__class__.__name__).lower()


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


class DamagedCheckpoint(DistlaunchError):
    """A checkpoint file that is missing, altered, unreadable or not what distlaunch writes (exit 1)."""

    exit_code = ExitCode.CHECK_FAILED


def read_manifest(checkpoint: Path) -> tuple[CheckpointMeta | None, str | None]:
    """The manifest, or None and what is wrong with it, in one line that names the field and its value."""
    try:
        raw = (checkpoint / META_FILE).read_bytes()
    except OSError as err:
        return None, f"{META_FILE} cannot be read ({os_reason(checkpoint / META_FILE, err)})"
    try:
        meta = CheckpointMeta.model_validate_json(raw)
    except ValidationError as err:
        return None, f"{META_FILE} is not a valid manifest: {_first_error(err)}"
    named = step_of(checkpoint)
    if named is not None and meta.step != named:
        return None, f"{META_FILE} is not a valid manifest: step={meta.step}, but the directory is {checkpoint.name}"
    return meta, None


def _first_error(err: ValidationError) -> str:
    """pydantic's first complaint as ``field=value: why`` (its own text names neither)."""
    first = err.errors()[0]
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    field = ".".join(str(part) for part in first["loc"])
    why = first["msg"].removeprefix("Value error, ")
    if first["type"] == "json_invalid":
        return f"not JSON ({first.get('ctx', {}).get('error', why)})"
    if not field:
        return f"not a JSON object{more}"
    if first["type"] == "missing":
        return f"{field} is missing{more}"
    why = f"{why[:1].lower()}{why[1:]}{more}"
    if isinstance(first.get("input"), dict | list):  # a whole table: the reason names what is wrong in it
        return f"{field}: {why}"
    value = repr(first.get("input"))
    return f"{field}={value if len(value) <= 60 else value[:57] + '...'}: {why}"


def read_meta(path: Path) -> CheckpointMeta:
    """The manifest of a published checkpoint; DamagedCheckpoint (one line) when it is not valid."""
    meta, problem = read_manifest(path)
    if meta is None:
        raise DamagedCheckpoint(
            f"checkpoint {path} is damaged: {problem}", "restore the file, or use another step_N directory of the run"
        )
    return meta


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

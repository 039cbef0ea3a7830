"""``meta.json``, a checkpoint's manifest: its format, and reading it into one-line reasons when it is wrong.

Torch-free, as ``folder.py``. rank 0 writes it as the last file of a save (``write_meta``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from distlaunch.data.source import DataIdentity
from distlaunch.errors import DistlaunchError, ExitCode, validation_problem
from distlaunch.training.checkpoint.folder import META_FILE, is_shard_name, os_reason, step_of, write_file_durably

FORMAT_VERSION = 1


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
    # what it was trained on: a resume on other data is refused before a rank starts (None in older versions)
    data: DataIdentity | None = None

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
            if not is_shard_name(name):
                raise ValueError(f"{name!r} is not the name of a file in the checkpoint directory")
        return files


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
        return None, f"{META_FILE} is not a valid manifest: {validation_problem(err)}"
    named = step_of(checkpoint)
    if named is not None and meta.step != named:
        return None, f"{META_FILE} is not a valid manifest: step={meta.step}, but the directory is {checkpoint.name}"
    return meta, None


def read_meta(path: Path) -> CheckpointMeta:
    """The manifest of a published checkpoint; DamagedCheckpoint (one line) when it is not valid."""
    meta, problem = read_manifest(path)
    if meta is None:
        raise DamagedCheckpoint(
            f"checkpoint {path} is damaged: {problem}", "restore the file, or use another step_N directory of the run"
        )
    return meta


def write_meta(tmp_dir: Path, meta: CheckpointMeta) -> None:
    """The manifest, written last into the not-yet-published directory."""
    write_file_durably(tmp_dir / META_FILE, meta.model_dump_json(indent=2) + "\n")

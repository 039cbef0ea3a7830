"""One consolidated state dict from a sharded checkpoint, for the plain single-process model.

No process group is needed: DCP reads every shard in this one process (``no_dist``) into
full-size tensors, keyed by the names ``GPT.load_state_dict`` expects. The output is safetensors
(``OUT.safetensors``, or any suffix but ``.pt``/``.pth``) or ``torch.save`` (``.pt``/``.pth``)::

    from safetensors.torch import load_file
    model = GPT(PRESETS["tiny"]); model.load_state_dict(load_file("model.safetensors"))

A model trained on a prepared dataset has its tokenizer's vocabulary: build it with
``replace(PRESETS[meta.preset], vocab_size=meta.data.vocab_size)`` from the checkpoint's ``meta.json``
(docs/checkpointing.md shows it whole).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import warnings
from pathlib import Path

import torch
from pydantic import BaseModel
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from distlaunch.engine.checkpoint.safe import describe, index_problems, load_state, read_dcp_metadata
from distlaunch.engine.checkpoint.shards import MODEL
from distlaunch.errors import UsageError
from distlaunch.training.checkpoint.folder import LATEST_FILE, LATEST_TMP, locate_checkpoint, resolve_checkpoint
from distlaunch.training.checkpoint.integrity import DamagedCheckpoint, require_intact
from distlaunch.training.checkpoint.manifest import CheckpointMeta

TORCH_SUFFIXES = (".pt", ".pth")
DAMAGED_HINT = "export another step_N directory of the same run"


class ExportReport(BaseModel):
    """What ``export_checkpoint`` wrote."""

    source: str
    output: str
    format: str  # safetensors or torch
    step: int
    preset: str
    tensors: int
    bytes: int
    warnings: list[str] = []  # a bad latest pointer that was not followed; a checkpoint without checksums


def consolidated_state(path: str | Path, prefix: str = MODEL) -> dict[str, torch.Tensor]:
    """Full tensors of every ``prefix`` entry (default: the model), prefix removed."""
    checkpoint = resolve_checkpoint(path)
    saved = read_dcp_metadata(checkpoint).state_dict_metadata
    state = {
        fqn: torch.empty(item.size, dtype=item.properties.dtype)
        for fqn, item in saved.items()
        if fqn.startswith(prefix) and isinstance(item, TensorStorageMetadata)
    }
    with warnings.catch_warnings():  # DCP warns that it runs without a process group: that is the point
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        load_state(state, checkpoint, no_dist=True)
    return {fqn[len(prefix) :]: tensor for fqn, tensor in state.items()}


def export_checkpoint(path: str | Path, output: str | Path) -> ExportReport:
    """Write the model weights of checkpoint ``path`` (or a root's latest) to ``output``.

    The output is checked before anything is read, written to a temporary file beside it and
    renamed into place: it is complete or absent, never half-written.
    """
    checkpoint, pointer_warning = locate_checkpoint(path)
    output = usable_output(Path(output).expanduser(), checkpoint)
    meta = require_intact(checkpoint, DAMAGED_HINT)
    problems = index_problems(checkpoint)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DamagedCheckpoint(f"checkpoint {checkpoint} is damaged: {problems[0]}{more}", DAMAGED_HINT)
    notes = [pointer_warning] if pointer_warning else []
    if not meta.files:
        notes.append(
            f"checkpoint {checkpoint} has no checksums recorded (written by an older distlaunch): "
            "its files could not be verified, only read"
        )
    weights = consolidated_state(checkpoint)
    fmt = write_weights(weights, output, meta, checkpoint)
    return ExportReport(
        source=str(checkpoint),
        output=str(output),
        format=fmt,
        step=meta.step,
        preset=meta.preset,
        tensors=len(weights),
        bytes=output.stat().st_size,
        warnings=notes,
    )


def usable_output(output: Path, checkpoint: Path) -> Path:
    """The file to write (a symlink's target), or UsageError: a directory, not a regular file, part
    of the checkpoint folder (``latest``, a ``step_N`` directory), or under a file or an unwritable one."""
    target = Path(os.path.realpath(output))
    fix = "name a new file outside the checkpoint's step_N directories, e.g. model.safetensors"
    if target.is_dir():
        raise UsageError(f"export output {output} is a directory", fix)
    if target.exists() and not target.is_file():
        raise UsageError(f"export output {output} is not a regular file", fix)
    root = Path(os.path.realpath(checkpoint.parent))
    if target.is_relative_to(root) and target != root:
        first = target.relative_to(root).parts[0]
        if first in (LATEST_FILE, LATEST_TMP) or first.startswith("step_"):
            raise UsageError(f"export output {output} is part of the checkpoint folder {root} ({first})", fix)
    existing = target.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"cannot write export output {output}: {existing} is a file, not a directory", fix)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write export output {output}: {existing} is not writable", fix)
    return target


def write_weights(weights: dict[str, torch.Tensor], output: Path, meta: CheckpointMeta, checkpoint: Path) -> str:
    """Write ``weights`` to ``output`` atomically (a temporary file beside it, then a rename), with the
    mode the umask gives a new file whatever the format; returns the format written."""
    missing = [p for p in [output.parent, *output.parent.parents] if not p.exists()]
    tmp = output.parent / f".{output.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to any new file
        mode = os.fstat(fd).st_mode & 0o777
        with os.fdopen(fd, "wb") as f:
            if output.suffix in TORCH_SUFFIXES:
                torch.save(weights, f)
                f.flush()
                os.fsync(f.fileno())
        if output.suffix not in TORCH_SUFFIXES:
            from safetensors.torch import save_file  # a dependency; imported where it is needed

            metadata = {"step": str(meta.step), "preset": meta.preset, "source": str(checkpoint)}
            save_file(weights, str(tmp), metadata=metadata)  # replaces tmp with a file of mode 0600
            os.chmod(tmp, mode)
        os.replace(tmp, output)
    except BaseException as err:  # OSError, safetensors' SafetensorError (no space, permissions), Ctrl-C
        tmp.unlink(missing_ok=True)
        for folder in missing:  # the innermost first: only what this export created, and only if empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        if not isinstance(err, Exception):
            raise
        why = err.strerror if isinstance(err, OSError) and err.strerror else describe(err)  # not the temp file's name
        raise UsageError(
            f"cannot write export output {output}: {why}", "choose a writable place with enough free space"
        ) from None
    return "torch" if output.suffix in TORCH_SUFFIXES else "safetensors"

"""One consolidated state dict from a sharded checkpoint, for the plain single-process model.

No process group is needed: DCP reads every shard in this one process (``no_dist``) into
full-size tensors, keyed by the names ``GPT.load_state_dict`` expects. The output is safetensors
(``OUT.safetensors``, or any suffix but ``.pt``/``.pth``) or ``torch.save`` (``.pt``/``.pth``)::

    from safetensors.torch import load_file
    model = GPT(PRESETS["tiny"]); model.load_state_dict(load_file("model.safetensors"))
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from pydantic import BaseModel
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from distlaunch.engine.checkpoint.integrity import DamagedCheckpoint, require_intact
from distlaunch.engine.checkpoint.manifest import locate_checkpoint, resolve_checkpoint
from distlaunch.engine.checkpoint.safe import index_problems, load_state, read_dcp_metadata
from distlaunch.engine.checkpoint.shards import MODEL
from distlaunch.errors import UsageError

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
    """Write the model weights of checkpoint ``path`` (or a root's latest) to ``output``."""
    checkpoint, pointer_warning = locate_checkpoint(path)
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
    output = Path(output).expanduser()
    if output.is_dir():
        raise UsageError(f"export output {output} is a directory", "name a file, e.g. model.safetensors")
    output.parent.mkdir(parents=True, exist_ok=True)
    weights = consolidated_state(checkpoint)
    if output.suffix in TORCH_SUFFIXES:
        torch.save(weights, output)
        fmt = "torch"
    else:
        from safetensors.torch import save_file  # a dependency; imported where it is needed

        save_file(
            weights, str(output), metadata={"step": str(meta.step), "preset": meta.preset, "source": str(checkpoint)}
        )
        fmt = "safetensors"
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

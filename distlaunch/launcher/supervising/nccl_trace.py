"""NCCL flight recorder dumps that agents send (protocol ``nccl-trace``): stored byte for byte next to the
attempt's stacks, under the name PyTorch gave them (``nccl_trace_rank_<global rank>``). They are pickles,
which only PyTorch's own reader should load: the launcher never opens them as anything but bytes."""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from distlaunch import protocol as p

# PyTorch's reader: merges the per-rank dumps of a folder and reports the first collective they disagree on.
READ_HINT = "python -m torch.distributed.flight_recorder.fr_trace {folder} -p " + p.NCCL_TRACE_PREFIX


class BadTrace(ValueError):
    """An nccl-trace event whose data is not base64."""


def store_nccl_trace(folder: Path, event: dict) -> Path:
    """Write one piece of a dump into ``folder`` at its offset; a name that is not a plain
    ``nccl_trace_rank_*`` file name is replaced."""
    name = Path(str(event.get("name") or "")).name
    if not name.startswith(p.NCCL_TRACE_PREFIX):
        name = f"{p.NCCL_TRACE_PREFIX}{event.get('rank')}"
    try:
        data = base64.b64decode(str(event.get("data") or ""), validate=True)
    except binascii.Error as exc:
        raise BadTrace(f"the dump {name} is not base64: {exc}") from None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    offset = int(event.get("offset") or 0)
    with open(path, "r+b" if offset else "wb") as f:
        f.seek(offset)
        f.write(data)
    return path


def cut_note(event: dict, path: Path) -> str | None:
    """A line for a dump the agent cut to NCCL_TRACE_MAX_BYTES, else None."""
    size, kept = int(event.get("size") or 0), path.stat().st_size
    if size <= kept:
        return None
    return f"{path.name} was cut to its first {kept} of {size} bytes (at most {p.NCCL_TRACE_MAX_BYTES} per rank)"

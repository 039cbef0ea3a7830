"""Reading a checkpoint without running code from it.

DCP keeps its index (``.metadata``) as a pickle and reads it with ``pickle.load``, which runs
whatever a crafted file asks for. Here the index goes through an unpickler that builds only DCP's
own metadata classes, ``torch.Size``, dtypes and layouts, and ``pathlib`` paths; anything else is
refused with ``DamagedCheckpoint``. Opaque values (train-state parts, RNG) are read with
``torch.load(weights_only=True)``, which builds tensors and plain containers only.

Damage the checksums cannot see (a checkpoint written before them, a checksum rewritten to match)
is caught twice more: ``index_problems`` checks every byte range the index reads is on disk, and
``load_state`` turns any failure of the load into one ``DamagedCheckpoint`` line naming the file.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from distlaunch.errors import DistlaunchError
from distlaunch.training.checkpoint.folder import is_shard_name, regular_file
from distlaunch.training.checkpoint.manifest import DamagedCheckpoint, read_manifest

METADATA_FILE = ".metadata"
LOAD_HINT = "a file holds other bytes than distlaunch wrote: restore it from a copy, or use another step_N directory"
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    (_DCP_METADATA, name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"it asks for {module}.{name}, which a checkpoint index never holds")


def read_dcp_metadata(checkpoint: Path) -> Metadata:
    """The DCP index of ``checkpoint``, unpickled with the allow-list above."""
    path = Path(checkpoint) / METADATA_FILE
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except FileNotFoundError:
        raise DamagedCheckpoint(f"{path} is missing", "the checkpoint is incomplete; resume from another one") from None
    except Exception as err:  # any unpickling failure: truncated, garbage, or a refused global
        raise DamagedCheckpoint(
            f"refused to load {path}: {err.__class__.__name__}: {err}",
            "this file was not written by distlaunch (or was altered); loading never runs code from a checkpoint",
        ) from None
    if not isinstance(metadata, Metadata):
        raise DamagedCheckpoint(f"{path} holds a {type(metadata).__name__}, not a checkpoint index", "")
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    return metadata


def index_problems(checkpoint: Path) -> list[str]:
    """What the DCP index shows without reading a tensor (empty: nothing): it is unreadable or refused,
    or a file it points into is missing, shorter than the bytes it indexes (truncated), or not covered
    by the manifest's checksums. This is what catches a truncated shard of a checkpoint written before
    checksums existed, and a path reaching outside the checkpoint directory."""
    try:
        metadata = read_dcp_metadata(checkpoint)
    except DistlaunchError as err:
        return [err.message]
    meta, _ = read_manifest(checkpoint)
    recorded = meta.files if meta is not None else {}
    needed: dict[str, int] = {}  # file -> the end of the last byte range the index reads from it
    try:
        for info in (metadata.storage_data or {}).values():
            name = str(info.relative_path)
            needed[name] = max(needed.get(name, 0), int(info.offset) + int(info.length))
    except (AttributeError, TypeError, ValueError):
        return [f"{checkpoint / METADATA_FILE} does not say where its data lies (not written by distlaunch)"]
    problems = []
    for name, end in sorted(needed.items()):
        path = checkpoint / name
        if not is_shard_name(name):
            problems.append(f"the index names {name!r}, which is not a shard file of the checkpoint directory")
        elif (problem := regular_file(path)[1]) is not None:
            problems.append(f"{name} {problem} (the index reads from it)")
        elif (size := path.stat().st_size) < end:
            problems.append(f"{name} has {size} bytes, the index reads up to byte {end} (truncated)")
        elif recorded and name not in recorded:
            problems.append(f"{name} has no checksum in the manifest (added or renamed after the save)")
    return problems


def describe(err: BaseException) -> str:
    """An exception in one short line: ``Class: first sentence of its message``. (torch's own advice
    for a refused pickle, to load it with ``weights_only=False``, is exactly what must not happen.)"""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    text = text.split(". ", 1)[0].rstrip(".")
    if len(text) > 160:
        text = text[:157] + "..."
    if isinstance(err, EOFError) and not text:
        text = "the data ends early (truncated?)"
    return f"{err.__class__.__name__}: {text}" if text else err.__class__.__name__


class SafeReader(dcp.FileSystemReader):
    """DCP's file reader, with the index read by ``read_dcp_metadata`` and any failure to read a
    shard turned into one ``DamagedCheckpoint`` line that names the file."""

    _reading: str | None = None  # the shard file being read, for the error message

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        self._reading = str(sinfo.relative_path)
        return super()._slice_file(file, sinfo)

    def read_data(self, plan: Any, planner: Any) -> Any:
        self._reading = None
        try:
            return super().read_data(plan, planner)
        except DamagedCheckpoint as err:  # a stored value refused by load_value
            raise DamagedCheckpoint(f"{self._reading or 'a shard'}: {err.message}", err.hint or LOAD_HINT) from None
        except Exception as err:  # truncated, garbage, missing: whatever torch.load or the file system says
            where = self._reading or (Path(err.filename).name if isinstance(err, OSError) and err.filename else None)
            raise DamagedCheckpoint(f"{where or 'a shard'} cannot be read ({describe(err)})", LOAD_HINT) from None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise DamagedCheckpoint(f"{self.path} asks for per-rank metadata, which distlaunch never writes", "")
        metadata = read_dcp_metadata(Path(self.path))
        metadata.storage_meta.load_id = self.load_id
        return metadata


def load_state(state: dict[str, Any], checkpoint: Path, *, no_dist: bool = False) -> None:
    """``dcp.load`` into ``state`` through the safe reader and planner. DCP gathers every rank's
    failure into one CheckpointException, a BaseException (``except Exception`` misses it) whose text
    is a traceback per rank: every rank gets the first failure instead, as one DamagedCheckpoint line."""
    try:
        dcp.load(state, storage_reader=SafeReader(checkpoint), planner=SafeLoadPlanner(), no_dist=no_dist)
    except CheckpointException as err:
        raise DamagedCheckpoint(f"cannot load {checkpoint}: {first_failure(err)}", LOAD_HINT) from None


def first_failure(err: CheckpointException) -> str:
    """The lowest failing rank's reason, in one line."""
    for rank in sorted(err.failures):
        failure = err.failures[rank]
        exc = failure[0] if isinstance(failure, tuple) and failure else failure
        if isinstance(exc, DistlaunchError):
            return exc.message
        if isinstance(exc, BaseException):
            return describe(exc)
    return "DCP reported a failure without a reason"


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load plan, with opaque values read by ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        loaded = load_value(value)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def load_value(data: bytes | io.BytesIO) -> Any:
    """An opaque value (tensors and plain containers only)."""
    stream = io.BytesIO(data) if isinstance(data, bytes) else data
    try:
        return torch.load(stream, weights_only=True)
    except EOFError:
        raise DamagedCheckpoint("a stored value ends early (truncated)", "") from None
    except Exception as err:
        raise DamagedCheckpoint(
            f"refused a stored value ({describe(err)})",
            "values in a checkpoint may hold only tensors and plain containers",
        ) from None

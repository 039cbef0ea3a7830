"""Reading a checkpoint without running code from it.

DCP keeps its index (``.metadata``) as a pickle and reads it with ``pickle.load``, which runs
whatever a crafted file asks for. Here the index goes through an unpickler that builds only DCP's
own metadata classes, ``torch.Size``, dtypes and layouts, and ``pathlib`` paths; anything else is
refused with ``DamagedCheckpoint``. Opaque values (train-state parts, RNG) are read with
``torch.load(weights_only=True)``, which builds tensors and plain containers only.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from distlaunch.engine.checkpoint.integrity import DamagedCheckpoint

METADATA_FILE = ".metadata"
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


class SafeReader(dcp.FileSystemReader):
    """DCP's file reader, with the index read by ``read_dcp_metadata``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise DamagedCheckpoint(f"{self.path} asks for per-rank metadata, which distlaunch never writes", "")
        metadata = read_dcp_metadata(Path(self.path))
        metadata.storage_meta.load_id = self.load_id
        return metadata


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
    except Exception as err:
        raise DamagedCheckpoint(
            f"refused a stored value: {err.__class__.__name__}: {str(err).splitlines()[0] if str(err) else ''}",
            "values in a checkpoint may hold only tensors and plain containers",
        ) from None

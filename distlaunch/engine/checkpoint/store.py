"""Save and load one checkpoint with torch.distributed.checkpoint (DCP), atomically.

A save writes every rank's shards into ``step_N.tmp-<tag>``, waits for every rank (barrier), and
only then does rank 0 write ``meta.json``, rename the directory to ``step_N`` and move ``latest``.
A rank that dies anywhere before that leaves a ``.tmp-`` directory nobody reads, and the previous
checkpoint untouched; the next save deletes the leftover.
"""

from __future__ import annotations

import io
import shutil
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from distlaunch.data.source import FRESH_START, check_same_data
from distlaunch.engine.checkpoint.safe import load_state, load_value, read_dcp_metadata
from distlaunch.engine.checkpoint.shards import (
    apply_model_weights,
    apply_optimizer_state,
    load_templates,
    save_tensors,
    shape_mismatch,
)
from distlaunch.engine.checkpoint.state import TrainState, rng_state, set_rng_state
from distlaunch.errors import DistlaunchError, ExitCode, UsageError
from distlaunch.training.checkpoint.folder import directory_bytes, prune, publish, remove_leftovers, step_dir_name
from distlaunch.training.checkpoint.integrity import checkpoint_files, digest, share
from distlaunch.training.checkpoint.manifest import CheckpointMeta, ComponentSize, Layout, read_meta, write_meta
from distlaunch.training.places import create_checkpoint_dir
from distlaunch.training.resume import preset_refusal

EXTRA, RNG = "extra.", "rng.rank"


def _to_bytes(obj: Any) -> bytes:
    # one opaque value per part: DCP would otherwise flatten nested dicts and tuples key by key
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _from_bytes(data: bytes) -> Any:
    return load_value(data)  # tensors and plain containers only: never code from the file


def build_state(engine, train_state: TrainState, rank: int) -> dict[str, Any]:
    """Everything one rank contributes to a checkpoint, keyed by single-process names."""
    state = save_tensors(engine.data_parallel)
    for name, part in train_state.parts.items():
        state[EXTRA + name] = _to_bytes(part.state_dict())
    state[f"{RNG}{rank}"] = _to_bytes(rng_state())
    return state


def component_sizes(metadata: Metadata) -> dict[str, ComponentSize]:
    """Entries, elements and bytes per top-level component (model, optim, extra, rng)."""
    sizes: dict[str, ComponentSize] = {}
    for fqn, item in metadata.state_dict_metadata.items():
        part = sizes.setdefault(fqn.split(".", 1)[0], ComponentSize())
        part.entries += 1
        if isinstance(item, TensorStorageMetadata):
            numel = 1
            for dim in item.size:
                numel *= dim
            part.numel += numel
            part.bytes += numel * item.properties.dtype.itemsize
    return sizes


LOW_SPACE_BYTES = 64 << 20  # free space under which a failed save is put down to a full disk


def _save_failure(root: Path, step: int, exc: Exception) -> Exception:
    """A failed save in one line when the disk is full (the earlier checkpoints stay: nothing was published);
    else the exception itself, a bug or a fault to read in full."""
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return exc
    if free >= LOW_SPACE_BYTES and "No space left" not in str(exc):
        return exc
    return DistlaunchError(
        f"the checkpoint of step {step} could not be written to {root}: no space left on the device "
        f"({free / 2**20:.0f} MiB free); the checkpoints before it are intact",
        "free space there, or lower checkpoint.keep, then resume (the job continues from the last checkpoint)",
        exit_code=ExitCode.CHECK_FAILED,
    )


def save_checkpoint(
    engine, train_state: TrainState, step: int, root: Path, keep: int, tag: str, before_publish: Callable[[], None]
) -> Path | None:
    """Write, then publish, the checkpoint of ``step`` (collective); rank 0 returns its path."""
    started = time.perf_counter()
    rank = dist.get_rank()
    tmp = root / f"{step_dir_name(step)}.tmp-{tag}"
    if rank == 0:
        create_checkpoint_dir(root)  # made at the start already (loop.run): removed or unwritable since, one line
        remove_leftovers(root)  # unfinished saves of crashed tries, old half-deleted checkpoints
    try:
        metadata = dcp.save(build_state(engine, train_state, rank), storage_writer=dcp.FileSystemWriter(tmp))
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException; a full disk: "unexpected pos"
        raise _save_failure(root, step, exc) from exc
    before_publish()  # the crash-in-save fault point: shards on disk, nothing published
    dist.barrier()  # every rank has finished writing
    # each rank hashes its share of the files; rank 0 records them all in the manifest
    mine = {name: digest(tmp / name) for name in share(checkpoint_files(tmp), rank, dist.get_world_size())}
    digests: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, mine)
    final = None
    if rank == 0:
        dims = engine.dims
        write_meta(
            tmp,
            CheckpointMeta(
                step=step,
                preset=engine.cfg.model.preset,
                layout=Layout(dp=dims.dp, tp=dims.tp, pp=dims.pp, zero=dims.zero, world_size=dims.world_size),
                components=component_sizes(metadata),
                files_bytes=directory_bytes(tmp),
                extras=sorted(train_state.parts),
                job=tag,
                saved_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                torch_version=torch.__version__,
                save_seconds=round(time.perf_counter() - started, 3),
                files={name: d for part in digests for name, d in sorted(part.items())},
                data=engine.data_identity(),
            ),
        )
        final = publish(root, tmp, step, tag)
        prune(root, keep, tag)
    dist.barrier()  # nobody trains on until the checkpoint is published
    return final


def load_checkpoint(engine, train_state: TrainState, path: Path) -> CheckpointMeta:
    """Load ``path`` into this rank's model, optimizer and train state, from any saved layout.

    Collective. What can be checked before reading a tensor is checked first, and every rank gets
    the first rank's refusal (a pipeline stage alone may hold the mismatching parameter): UsageError
    for a checkpoint of another model or other data, DamagedCheckpoint for one that cannot be read.
    """
    rank = dist.get_rank()
    meta, state, saved, refusal = None, {}, {}, None
    try:
        meta = read_meta(path)
        saved = _check_model(engine, meta, path)
        state = load_templates(engine.data_parallel, saved)
    except DistlaunchError as err:
        refusal = err
    _same_outcome(refusal)
    assert meta is not None  # set, or _same_outcome raised
    extras = [name for name in train_state.parts if EXTRA + name in saved]
    for name in extras:
        state[EXTRA + name] = b""
    # a rank's random stream only means something for the same rank in the same world
    rng_key = f"{RNG}{rank}"
    restore_rng = meta.layout.world_size == dist.get_world_size() and rng_key in saved
    if restore_rng:
        state[rng_key] = b""
    with torch.no_grad():
        load_state(state, path)  # collective: a failure on any rank is raised on every rank
    try:
        apply_model_weights(engine.data_parallel, state)
        apply_optimizer_state(engine.data_parallel, state)
        for name in extras:
            train_state.parts[name].load_state_dict(_from_bytes(state[EXTRA + name]))
        if restore_rng:
            set_rng_state(_from_bytes(state[rng_key]))
    except DistlaunchError as err:  # a refused value, other data: one rank's RNG part may be all that differs
        refusal = err
    _same_outcome(refusal)
    return meta


def _same_outcome(refusal: DistlaunchError | None) -> None:
    """Every rank raises the first rank's refusal, or none does (collective): a rank that went on
    alone would wait forever in the next collective."""
    refusals: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(refusals, refusal)
    first = next((r for r in refusals if r is not None), None)
    if first is not None:
        raise first


def _check_model(engine, meta: CheckpointMeta, path: Path) -> dict[str, Any]:
    """The checkpoint's index, once it is known to hold this very model (preset and shapes)."""
    preset = engine.cfg.model.preset
    if meta.preset != preset:
        raise preset_refusal(path, meta.preset, preset)
    if meta.data is not None:
        check_same_data(path, meta.data, engine.data_identity())
    saved = read_dcp_metadata(path).state_dict_metadata
    mismatch = shape_mismatch(engine.data_parallel, saved)
    if mismatch is not None:  # same preset, other shape: the vocabulary of data meta.json does not name (older)
        key, there, here = mismatch
        data = engine.cfg.data.path
        raise UsageError(
            f"checkpoint {path} was trained on other data: it holds {key} as {there}, this model has {here} "
            f"(the vocabulary comes from {f'data.path={data!r}' if data else 'the bundled corpus'})",
            f"resume with the data.path the checkpoint was trained on, {FRESH_START}",
        )
    return saved

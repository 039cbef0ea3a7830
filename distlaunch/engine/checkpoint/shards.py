"""Model and optimizer state under single-process names, in a form DCP can reshard.

Every tensor is saved with its *global* shape under the name the plain model uses
(``model.blocks.0.attn.wqkv.weight``, ``optim.blocks.0.attn.wqkv.weight.exp_avg``), so any layout can
read any other's checkpoint; DCP (``torch.distributed.checkpoint``) writes each rank's chunk and
reads, on load, whatever chunks overlap the reader's own shard.

- Parameters: already in that form. Replicated tensors are whole; tensor-parallel ones are
  DTensors over the tp mesh; ZeRO-3's are DTensors over dp (and tp); pipeline stages hold disjoint
  names. DCP saves one copy of replicated chunks (its plan de-duplicates them).
- Weights are always saved in fp32: with 16-bit parameters (bf16, ZeRO-0/1/2) the fp32 master
  weights are saved instead of the parameters (ZeRO-0's are shaped like the parameter; ZeRO-1/2's
  slices are gathered like their optimizer state, below), so a resume loses no precision. On load
  they go into the masters and, rounded, into the parameters (``apply_model_weights``).
- Optimizer state of ZeRO 0 and 3: shaped (and placed) like its parameter, saved as it is.
- Optimizer state of ZeRO 1/2: a flat 1/dp slice of the parameter's local tensor, which is not a
  rectangular chunk of the global tensor. It is all-gathered over dp, one parameter at a time,
  into the parameter's own shape and placement (gather-on-save); on load each rank reads that
  shape and keeps its slice. docs/checkpointing.md has the measured cost and the alternative.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from distlaunch.engine.parallel.data import DataParallelBase, local
from distlaunch.engine.parallel.wire import all_gather
from distlaunch.engine.parallel.zero import ParamShard, ShardedDP
from distlaunch.errors import UsageError
from distlaunch.readable import plural

MODEL, OPTIM = "model.", "optim."


@dataclass
class ParamEntry:
    """One parameter: its single-process name, the tensor, and what the optimizer updates."""

    name: str
    param: nn.Parameter
    opt_param: torch.Tensor  # the parameter itself, its fp32 master, or its ZeRO-1/2 slice
    shard: ParamShard | None  # set for ZeRO-1/2
    master: bool = False  # opt_param is an fp32 master copy of a 16-bit parameter


def param_entries(data_parallel: DataParallelBase) -> list[ParamEntry]:
    """Every parameter this rank holds, whatever the ZeRO stage."""
    master = data_parallel.master_weights
    if isinstance(data_parallel, ShardedDP):
        return [
            ParamEntry(n, p, s.master, s, master)
            for (n, p), s in zip(data_parallel.named_params, data_parallel.shards, strict=False)
        ]
    master_of = getattr(data_parallel, "master_of", {})
    return [ParamEntry(n, p, master_of.get(p, p), None, master) for n, p in data_parallel.named_params]


def _saved_weights(entry: ParamEntry, data_parallel: DataParallelBase) -> torch.Tensor:
    """What ``model.<name>`` holds: the fp32 master weights (gathered for ZeRO-1/2), or the
    parameter when it is its own master."""
    if not entry.master:
        return entry.param.detach()
    if entry.shard is None:
        return entry.opt_param.detach()
    return _gather_slice(entry.opt_param.detach(), entry, data_parallel)


def _is_elementwise(value: Any, entry: ParamEntry) -> bool:
    """Optimizer state with one value per parameter element (Adam's moments), not a scalar."""
    return torch.is_tensor(value) and value.ndim > 0 and value.shape == entry.opt_param.shape


def _gather_slice(value: torch.Tensor, entry: ParamEntry, data_parallel: ShardedDP) -> torch.Tensor:
    """A ZeRO-1/2 state slice all-gathered over dp into the parameter's shape and placement."""
    shard = entry.shard
    slot = value.new_zeros(shard.size)
    slot[: shard.stop - shard.start] = value
    gathered = slot.new_empty(shard.size * data_parallel.dp)
    all_gather(gathered, slot, group=data_parallel.group)
    full_local = gathered[: shard.numel].view(local(entry.param).shape)
    if isinstance(entry.param, DTensor):
        return DTensor.from_local(
            full_local,
            entry.param.device_mesh,
            entry.param.placements,
            shape=entry.param.shape,
            stride=entry.param.stride(),
        )
    return full_local


def save_tensors(data_parallel: DataParallelBase) -> dict[str, Any]:
    """``model.*`` and ``optim.*`` entries of this rank (collective over dp for ZeRO-1/2)."""
    out: dict[str, Any] = {}
    optimizer_state = data_parallel.optimizer.state
    for entry in param_entries(data_parallel):
        out[MODEL + entry.name] = _saved_weights(entry, data_parallel)
        # sorted: every dp rank runs the gathers of one parameter in the same order
        for key, value in sorted(optimizer_state.get(entry.opt_param, {}).items()):
            if entry.shard is not None and _is_elementwise(value, entry):
                value = _gather_slice(value, entry, data_parallel)
            out[f"{OPTIM}{entry.name}.{key}"] = value
    return out


def load_templates(data_parallel: DataParallelBase, saved: dict[str, Any]) -> dict[str, Any]:
    """Destinations for DCP's load: the parameters themselves (loaded in place; 16-bit ones: their
    ZeRO-0 master, or an fp32 tensor shaped like the parameter, see ``apply_model_weights``) and
    empty optimizer state shaped as saved. ``saved`` is the checkpoint's fqn -> storage metadata.

    Raises UsageError when the checkpoint lacks a parameter this rank holds.
    """
    out: dict[str, Any] = {}
    missing = []
    for entry in param_entries(data_parallel):
        if MODEL + entry.name not in saved:
            missing.append(entry.name)
            continue
        out[MODEL + entry.name] = _weights_template(entry)
        prefix = f"{OPTIM}{entry.name}."
        for key, meta in saved.items():
            if key.startswith(prefix) and "." not in key[len(prefix) :]:
                out[key] = _optimizer_template(entry, meta)
    if missing:
        raise UsageError(
            f"the checkpoint has no weights for {plural(len(missing), 'parameter')} of this model, e.g. {missing[0]}",
            "resume with the same model.preset the checkpoint was written with",
        )
    return out


def shape_mismatch(data_parallel: DataParallelBase, saved: dict[str, Any]) -> tuple[str, str, str] | None:
    """The first parameter this rank holds whose saved global shape differs from the model's:
    ``(key, saved shape, this shape)``, e.g. ``("model.head.weight", "256x128", "384x128")``."""
    for entry in param_entries(data_parallel):
        size = getattr(saved.get(MODEL + entry.name), "size", None)
        if size is not None and tuple(size) != tuple(entry.param.shape):
            return MODEL + entry.name, "x".join(map(str, size)), "x".join(map(str, entry.param.shape))
    return None


def _weights_template(entry: ParamEntry) -> torch.Tensor:
    """Where the saved fp32 weights of ``entry`` are loaded."""
    if not entry.master:
        return entry.param.detach()
    if entry.shard is None:
        return entry.opt_param.detach()  # ZeRO-0: the master itself
    return torch.empty_like(entry.param.detach(), dtype=torch.float32)  # placed like the parameter


@torch.no_grad()
def apply_model_weights(data_parallel: DataParallelBase, loaded: dict[str, Any]) -> None:
    """After the load, with 16-bit parameters: this rank's slice of the loaded fp32 weights into
    its ZeRO-1/2 master, and the weights rounded into every parameter (no collective)."""
    for entry in param_entries(data_parallel):
        if not entry.master:
            continue
        weights = local(loaded[MODEL + entry.name])
        if entry.shard is not None:
            entry.opt_param.copy_(weights.reshape(-1)[entry.shard.start : entry.shard.stop])
        local(entry.param).copy_(weights)


def _optimizer_template(entry: ParamEntry, meta: Any) -> Any:
    """An empty destination for one optimizer state entry (None for a non-tensor value)."""
    size = getattr(meta, "size", None)
    if size is None:
        return None  # saved as bytes: DCP replaces the value
    dtype = meta.properties.dtype
    if len(size) > 0 and tuple(size) == tuple(entry.param.shape):
        return torch.empty_like(entry.param.detach(), dtype=dtype)  # placed like the parameter
    return torch.empty(size, dtype=dtype, device=local(entry.param).device)


def apply_optimizer_state(data_parallel: DataParallelBase, loaded: dict[str, Any]) -> int:
    """Install loaded optimizer state (ZeRO-1/2 keep their slice); returns the tensors set."""
    count = 0
    for entry in param_entries(data_parallel):
        prefix = f"{OPTIM}{entry.name}."
        state = {}
        for key, value in loaded.items():
            if not key.startswith(prefix):
                continue
            name = key[len(prefix) :]
            if entry.shard is not None and torch.is_tensor(value) and tuple(value.shape) == tuple(entry.param.shape):
                value = local(value).reshape(-1)[entry.shard.start : entry.shard.stop].clone()
            state[name] = value
            count += 1
        if state:
            data_parallel.optimizer.state[entry.opt_param] = state
    return count

"""Materialise a model built on the meta device: allocate only this rank's shards, then fill them.

The engine builds the whole model on the meta device (shapes, no memory), cuts out this rank's
pipeline stage(s), and applies tensor parallel and ZeRO-3 there, so every parameter is already
the shard this rank keeps when memory is first allocated. ``materialize`` then allocates those
shards (``to_empty``) and writes into each one its slice of the parameter's initial value, one
parameter at a time. A rank therefore never holds more than its own shards plus one whole
parameter (the largest: the embedding or the LM head), whatever the model's size; building
first and sharding after would hold the whole stage.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from distlaunch.engine.model import GPT, initial_value


def local_slice(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``full`` as ``param`` (a plain tensor or a DTensor) lays it out.

    ``src_data_rank=None``: every rank holds the whole value, so each cuts its own piece, with
    the placements' own rules (tp's Shard, ZeRO-3's Shard or strided shard over dp x tp), and no
    collective runs.
    """
    if not isinstance(param, DTensor):
        return full
    full = full.to(param.device)
    return distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()


@torch.no_grad()
def materialize(chunks: list[GPT], device: torch.device, seed: int) -> None:
    """Allocate ``chunks``' parameters on ``device`` and initialise them (identical in any layout)."""
    for chunk in chunks:
        chunk.to_empty(device=device)
        for name, param in chunk.named_parameters():
            full = initial_value(chunk.cfg, name, param.shape, seed)
            target = param.to_local() if isinstance(param, DTensor) else param
            target.copy_(local_slice(full, param).to(target.dtype))

"""Pipeline parallelism: split the GPT into stages and drive them with torch's schedules.

A stage is the full model with every part it does not own deleted (blocks dropped from the
``ModuleDict``, embeddings / norm / head set to ``None``), so parameter names stay those of the
full model. With ``virtual_stages`` v, the model is cut into pp*v stages and pp rank i holds
stages i, i+pp, i+2pp, ... (the looped placement ScheduleInterleaved1F1B expects).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from distlaunch.engine.model import GPT
from distlaunch.training.dims import ParallelDims, stage_layer_counts

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import _PipelineSchedule


def stage_ids(pp_rank: int, dims: ParallelDims) -> list[int]:
    """The stages this pp rank runs (one, or v for the interleaved schedule)."""
    return [pp_rank + k * dims.pp for k in range(dims.virtual_stages)]


def split_stage(model: GPT, stage: int, n_stages: int) -> GPT:
    """A copy of ``model`` keeping only stage ``stage`` of ``n_stages`` (cheap on meta tensors)."""
    counts = stage_layer_counts(len(model.blocks), n_stages)
    first = sum(counts[:stage])
    keep = {str(i) for i in range(first, first + counts[stage])}
    part = copy.deepcopy(model)
    for name in list(part.blocks):
        if name not in keep:
            del part.blocks[name]
    if stage != 0:
        part.tok_emb = None
        part.pos_emb = None
    if stage != n_stages - 1:
        part.norm = None
        part.head = None
    return part


def split_pipeline(model: GPT, pp_rank: int, dims: ParallelDims) -> list[GPT]:
    """This pp rank's model chunks, in stage order; the whole model when pp=1."""
    if dims.pp == 1:
        return [model]
    return [split_stage(model, s, dims.n_stages) for s in stage_ids(pp_rank, dims)]


def build_schedule(
    chunks: list[nn.Module],
    pp_rank: int,
    dims: ParallelDims,
    pp_mesh: DeviceMesh,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> _PipelineSchedule:
    """The configured schedule over this rank's stages."""
    # imported here, for pp > 1 only: torch.distributed.pipelining imports torch._dynamo, some 2 s
    # of CPU at every rank's start that no other layout needs
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    stages = [
        PipelineStage(chunk, sid, dims.n_stages, device, group=pp_mesh.get_group())
        for chunk, sid in zip(chunks, stage_ids(pp_rank, dims), strict=False)
    ]
    # scale_grads=False: loss_fn already divides by the micro-batch count, the same as the
    # non-pipelined path, and the ZeRO-2 hooks take gradients away before the schedule could
    # rescale them
    if dims.schedule == "interleaved":
        return ScheduleInterleaved1F1B(stages, dims.microbatches, loss_fn=loss_fn, scale_grads=False)
    schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[dims.schedule]
    return schedule(stages[0], dims.microbatches, loss_fn=loss_fn, scale_grads=False)


def bubble_fraction(pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Idle share of a GPipe/1F1B step, (p-1)/(m+p-1); interleaving divides the bubble by v."""
    bubble = (pp - 1) / virtual_stages
    return bubble / (microbatches + bubble)

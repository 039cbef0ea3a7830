"""Memory planner: per-rank bytes of the kept training state and of a step's peak, from the
preset's shapes alone (pure arithmetic, no torch), for ``distlaunch train --dry-run``.

``shapes``: what a rank holds and its kept state; ``activations``: the activation estimate;
``step``: what a step adds, moment by moment. See docs/train.md ("Memory planner").
"""

from __future__ import annotations

from pydantic import BaseModel

from distlaunch.contract.layout import place_of
from distlaunch.training.config import TrainSection
from distlaunch.training.dims import ParallelDims
from distlaunch.training.planner.shapes import block_numel, rank_tensors, state_bytes
from distlaunch.training.planner.step import step_moments, unsharded_16bit_weights
from distlaunch.training.presets import GPTConfig

__all__ = [
    "HEADROOM",
    "MemoryPlan",
    "RankMemory",
    "block_numel",
    "plan_memory",
    "rank_memory",
    "unsharded_16bit_weights",
]

HEADROOM = 0.9  # share of device memory the plan may use: the rest is context, allocator, fragmentation


class RankMemory(BaseModel):
    """Estimated bytes of one rank; ``fits`` is None when the device memory is unknown.

    ``params``, ``grads`` and ``optimizer`` are kept between steps; ``activations`` and
    ``buffers`` are the most each takes at once inside a step; ``peak`` is the most alive at once
    (at the moment ``peak_at``), less than the sum of the parts when they peak apart.
    """

    rank: int
    pp_rank: int
    dp_rank: int
    tp_rank: int
    params: int
    grads: int
    optimizer: int
    activations: int
    buffers: int
    peak: int
    peak_at: str  # backward, next block's backward, later backward, gradient sync, optimizer step
    fits: bool | None = None


class MemoryPlan(BaseModel):
    """The planner's answer: one entry per rank, and whether the job fits the device memory."""

    device: str  # "gpu" or "no GPU: host memory"
    capacity_bytes: int | None  # per rank; None: unknown
    capacity_source: str  # --gpu-memory, nvidia-smi, /proc/meminfo, unknown
    precision: str
    zero: int
    micro_batch_size: int
    activation_checkpointing: bool
    fits: bool | None
    ranks: list[RankMemory]


STATE_PARTS = ("params", "optimizer", "gradients", "activations")  # the rest of a moment is buffers


def rank_memory(
    model: GPTConfig, dims: ParallelDims, rank: int, train: TrainSection, backend: str, capacity: int | None
) -> RankMemory:
    """The estimate for one global rank (its place in the contract's grid: tp fastest, then dp, then pp)."""
    place = place_of(dims, rank)
    tp_rank, dp_rank, pp_rank = place["tp"], place["dp"], place["pp"]
    params, grads, optimizer = state_bytes(
        rank_tensors(model, dims, pp_rank), dims.zero, dims.dp, dp_rank, train.precision
    )
    moments = step_moments(model, dims, pp_rank, dp_rank, train, backend)
    peak_at, parts = max(moments.items(), key=lambda item: sum(item[1].values()))
    peak = sum(parts.values())
    return RankMemory(
        rank=rank,
        pp_rank=pp_rank,
        dp_rank=dp_rank,
        tp_rank=tp_rank,
        params=params,
        grads=grads,
        optimizer=optimizer,
        activations=moments["backward"]["activations"],
        buffers=max(sum(v for k, v in m.items() if k not in STATE_PARTS) for m in moments.values()),
        peak=peak,
        peak_at=peak_at,
        fits=None if capacity is None else peak <= capacity * HEADROOM,
    )


def plan_memory(
    model: GPTConfig,
    dims: ParallelDims,
    train: TrainSection,
    backend: str,
    device: str,
    capacity: int | None,
    source: str,
) -> MemoryPlan:
    """Every rank's estimate and the overall verdict (None when the capacity is unknown)."""
    ranks = [rank_memory(model, dims, r, train, backend, capacity) for r in range(dims.world_size)]
    fits = None if capacity is None else all(r.fits for r in ranks)
    return MemoryPlan(
        device=device,
        capacity_bytes=capacity,
        capacity_source=source,
        precision=train.precision,
        zero=dims.zero,
        micro_batch_size=dims.micro_batch_size,
        activation_checkpointing=train.activation_checkpointing,
        fits=fits,
        ranks=ranks,
    )

"""Memory planner: per-rank bytes of parameters, gradients, optimizer state and activations,
from the preset's shapes alone (pure arithmetic, no torch), for ``distlaunch train --dry-run``.

The state parts follow what the engine really allocates, tensor by tensor, so they match the
measured bytes (``Engine.state_bytes``): gradients and AdamW state are fp32 in every precision;
the parameters are in ``precision.model_dtype_name``'s dtype (bf16 with ZeRO-0/1/2, then with
fp32 master weights, counted as optimizer state: whole for ZeRO-0, this rank's slice for
ZeRO-1/2; else fp32, their own master weights), AdamW holds two moments and a 4-byte step
counter per tensor, ZeRO-1/2 slice each flattened tensor into dp slots of ceil(numel/dp), ZeRO-3
(FSDP2) shards dim 0 into dp padded rows. Activations are an estimate (Korthikanti et al. 2022,
without dropout; fused attention keeps no score matrix), see docs/train.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from pydantic import BaseModel

from distlaunch.engine.parallel.dims import ParallelDims, stage_layer_counts
from distlaunch.engine.precision import ELEMENT_BYTES, model_dtype_name
from distlaunch.engine.presets import GPTConfig

FP32 = 4
ADAM_STEP_BYTES = 4  # AdamW's per-tensor step counter (a float32 scalar tensor)
HEADROOM = 0.9  # share of device memory the plan may use: the rest is context, allocator, buffers


@dataclass(frozen=True)
class Tensor:
    """One parameter as this rank holds it after tensor parallel: (rows, cols)."""

    rows: int
    cols: int

    @property
    def numel(self) -> int:
        return self.rows * self.cols


class RankMemory(BaseModel):
    """Estimated bytes of one rank; ``fits`` is None when the device memory is unknown."""

    rank: int
    pp_rank: int
    dp_rank: int
    tp_rank: int
    params: int
    grads: int
    optimizer: int
    activations: int
    total: int
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


def stage_tensors(model: GPTConfig, stage: int, n_stages: int, tp: int) -> list[Tensor]:
    """The parameters of pipeline stage ``stage`` as one tp rank holds them."""
    d, v, f = model.d_model, model.vocab_size, model.mlp_ratio * model.d_model
    out: list[Tensor] = []
    if stage == 0:
        out += [Tensor(v // tp, d), Tensor(model.max_seq_len, d)]  # vocab-parallel tok_emb, pos_emb
    for _ in range(stage_layer_counts(model.n_layer, n_stages)[stage]):
        out += [Tensor(1, d)] * 2  # attn_norm weight, bias (replicated)
        out += [Tensor(3 * d // tp, d), Tensor(d, d // tp)]  # fused wqkv column-, wo row-parallel
        out += [Tensor(1, d)] * 2  # mlp_norm
        out += [Tensor(f // tp, d), Tensor(d, f // tp)]  # fc column-, proj row-parallel
    if stage == n_stages - 1:
        out += [Tensor(1, d)] * 2 + [Tensor(v // tp, d)]  # norm, column-parallel head
    return out


def rank_tensors(model: GPTConfig, dims: ParallelDims, pp_rank: int) -> list[Tensor]:
    """Every parameter of this pp rank's stage(s) (interleaved: stages pp_rank, pp_rank+pp, ...)."""
    stages = [pp_rank + k * dims.pp for k in range(dims.virtual_stages)]
    return [t for s in stages for t in stage_tensors(model, s, dims.n_stages, dims.tp)]


def state_bytes(
    tensors: list[Tensor], zero: int, dp: int, dp_rank: int, precision: str = "fp32"
) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes of one rank for ZeRO stage ``zero``."""
    full = sum(t.numel for t in tensors)
    steps = ADAM_STEP_BYTES * len(tensors)
    param = ELEMENT_BYTES[model_dtype_name(precision, zero)]
    per_owned = 2 * FP32 + (FP32 if param != FP32 else 0)  # Adam moments (+ the fp32 master)
    if zero == 0:
        return param * full, FP32 * full, per_owned * full + steps
    if zero in (1, 2):
        slots = [ceil(t.numel / dp) for t in tensors]
        owned = sum(max(0, min(s, t.numel - dp_rank * s)) for s, t in zip(slots, tensors, strict=False))
        grads = FP32 * (full if zero == 1 else sum(slots))  # stage 1 keeps the full gradient
        return param * full, grads, per_owned * owned + steps
    rows = [ceil(t.rows / dp) for t in tensors]  # FSDP2: dim 0 padded to dp equal rows
    padded = sum(r * t.cols for r, t in zip(rows, tensors, strict=False))
    owned = sum(max(0, min(r, t.rows - dp_rank * r)) * t.cols for r, t in zip(rows, tensors, strict=False))
    return FP32 * padded, FP32 * padded, 2 * FP32 * owned + steps


def in_flight_microbatches(dims: ParallelDims, pp_rank: int) -> float:
    """Micro-batches whose activations a pp rank holds at its peak, by schedule."""
    if dims.pp == 1:
        return 1  # accumulation rounds free their activations in their own backward
    m = dims.microbatches
    if dims.schedule == "gpipe":
        return m  # every forward before any backward
    warmup = min(m, dims.pp - pp_rank)  # 1F1B: the first stage holds pp micro-batches
    if dims.schedule == "interleaved":
        return warmup * (1 + (dims.pp - 1) / (dims.pp * dims.virtual_stages))  # Narayanan et al. 2021
    return warmup


def activation_bytes(
    model: GPTConfig, dims: ParallelDims, pp_rank: int, seq_len: int, precision: str, checkpointing: bool
) -> int:
    """Estimated peak activation bytes of one rank (plus 16-bit weight copies, if any)."""
    b, s, h, t = dims.micro_batch_size, seq_len, model.d_model, dims.tp
    elem = FP32 if precision == "fp32" else 2
    # per layer and micro-batch: s*b*h*(10 + 24/t) 16-bit values (Korthikanti et al.), less the
    # 2 dropout masks this GPT does not have; scaled to the precision's element size
    per_layer = s * b * h * (8 + 24 / t) * elem / 2
    stages = [pp_rank + k * dims.pp for k in range(dims.virtual_stages)]
    counts = stage_layer_counts(model.n_layer, dims.n_stages)
    layers = sum(counts[i] for i in stages)
    in_flight = in_flight_microbatches(dims, pp_rank)
    # With checkpointing each block keeps its fp32 input, and one block is recomputed at a time.
    kept = layers * in_flight * s * b * h * FP32 + per_layer if checkpointing else layers * in_flight * per_layer
    if dims.n_stages - 1 in stages:  # fp32 logits of one micro-batch and their gradient
        kept += 2 * FP32 * b * s * model.vocab_size // t
    if elem == 2:
        kept += unsharded_16bit_weights(model, dims, pp_rank, precision)
    return int(kept)


def block_numel(model: GPTConfig, tp: int) -> int:
    """Parameters of one transformer block as one tp rank holds them."""
    d, f = model.d_model, model.mlp_ratio * model.d_model
    return 4 * d + (3 * d * d + d * d + 2 * f * d) // tp


def unsharded_16bit_weights(model: GPTConfig, dims: ParallelDims, pp_rank: int, precision: str) -> int:
    """Bytes of 16-bit weight copies a 16-bit step holds besides the kept state.

    bf16 with ZeRO-0/1/2: none, the parameters themselves are bf16 (counted as state).
    fp16 with ZeRO-0/1/2: autocast caches a 16-bit copy of every fp32 weight matrix it used, for
    the forward.
    ZeRO-3 (FSDP2 ``MixedPrecisionPolicy``): the units are all-gathered in 16 bits, so only the
    unsharded units exist: the stage root (kept from forward to backward) and two blocks (the one
    running and the next one prefetched).
    """
    tensors = rank_tensors(model, dims, pp_rank)
    if dims.zero != 3:
        if model_dtype_name(precision, dims.zero) != "fp32":
            return 0
        return 2 * sum(x.numel for x in tensors if x.rows > 1)
    layers = sum(
        stage_layer_counts(model.n_layer, dims.n_stages)[pp_rank + k * dims.pp] for k in range(dims.virtual_stages)
    )
    block = block_numel(model, dims.tp)
    root = sum(x.numel for x in tensors) - layers * block
    return 2 * (root + min(2, layers) * block)


def rank_memory(
    model: GPTConfig,
    dims: ParallelDims,
    rank: int,
    seq_len: int,
    precision: str,
    checkpointing: bool,
    capacity: int | None,
) -> RankMemory:
    """The estimate for one global rank (grid order: tp fastest, then dp, then pp)."""
    tp_rank = rank % dims.tp
    dp_rank = rank // dims.tp % dims.dp
    pp_rank = rank // (dims.tp * dims.dp)
    params, grads, optimizer = state_bytes(rank_tensors(model, dims, pp_rank), dims.zero, dims.dp, dp_rank, precision)
    activations = activation_bytes(model, dims, pp_rank, seq_len, precision, checkpointing)
    total = params + grads + optimizer + activations
    fits = None if capacity is None else total <= capacity * HEADROOM
    return RankMemory(
        rank=rank,
        pp_rank=pp_rank,
        dp_rank=dp_rank,
        tp_rank=tp_rank,
        params=params,
        grads=grads,
        optimizer=optimizer,
        activations=activations,
        total=total,
        fits=fits,
    )


def plan_memory(
    model: GPTConfig,
    dims: ParallelDims,
    seq_len: int,
    precision: str,
    checkpointing: bool,
    device: str,
    capacity: int | None,
    source: str,
) -> MemoryPlan:
    """Every rank's estimate and the overall verdict (None when the capacity is unknown)."""
    ranks = [rank_memory(model, dims, r, seq_len, precision, checkpointing, capacity) for r in range(dims.world_size)]
    fits = None if capacity is None else all(r.fits for r in ranks)
    return MemoryPlan(
        device=device,
        capacity_bytes=capacity,
        capacity_source=source,
        precision=precision,
        zero=dims.zero,
        micro_batch_size=dims.micro_batch_size,
        activation_checkpointing=checkpointing,
        fits=fits,
        ranks=ranks,
    )

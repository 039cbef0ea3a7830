"""Activation estimate of one rank (Korthikanti et al. 2022, without dropout; fused attention
keeps no score matrix), and how many micro-batches' worth a pipeline schedule holds.
"""

from __future__ import annotations

from distlaunch.engine.parallel.dims import ParallelDims
from distlaunch.engine.planner.shapes import FP32, holds_last_stage, rank_layers
from distlaunch.engine.presets import GPTConfig


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


def later_in_flight(dims: ParallelDims, pp_rank: int) -> tuple[float, bool]:
    """Micro-batches in flight at a pp rank's backwards after its first, and whether a forward
    runs between two of them (1F1B's steady state)."""
    m = dims.microbatches
    warmup = m if dims.schedule == "gpipe" else min(m, dims.pp - pp_rank)
    if m > warmup:
        return in_flight_microbatches(dims, pp_rank), True
    return in_flight_microbatches(dims, pp_rank) - 1, False


def activation_bytes(
    model: GPTConfig,
    dims: ParallelDims,
    pp_rank: int,
    seq_len: int,
    precision: str,
    checkpointing: bool,
    done: int = 0,
    in_flight: float | None = None,
) -> int:
    """Estimated activation bytes of one rank when its backward starts (their peak), or once the
    backward of its last ``done`` blocks has freed theirs and the logits; ``in_flight``: that many
    micro-batches instead of the schedule's most."""
    b, s, h, t = dims.micro_batch_size, seq_len, model.d_model, dims.tp
    elem = FP32 if precision == "fp32" else 2
    # per layer and micro-batch: s*b*h*(10 + 24/t) 16-bit values (Korthikanti et al.), less the
    # 2 dropout masks this GPT does not have; scaled to the precision's element size
    per_layer = s * b * h * (8 + 24 / t) * elem / 2
    layers = rank_layers(model, dims, pp_rank) - done
    in_flight = in_flight_microbatches(dims, pp_rank) if in_flight is None else in_flight
    # With checkpointing each block keeps its fp32 input, and one block is recomputed at a time.
    kept = layers * in_flight * s * b * h * FP32 + per_layer if checkpointing else layers * in_flight * per_layer
    if holds_last_stage(dims, pp_rank) and not done:  # fp32 logits of one micro-batch and their gradient
        kept += 2 * FP32 * b * s * model.vocab_size // t
    return int(kept)

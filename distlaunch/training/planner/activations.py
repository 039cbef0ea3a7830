"""Activation estimate of one rank (Korthikanti et al. 2022, without dropout; fused attention
keeps no score matrix), and how many micro-batches' worth a pipeline schedule holds.
"""

from __future__ import annotations

from distlaunch.training.dims import ParallelDims
from distlaunch.training.planner.shapes import FP32, holds_last_stage, rank_layers
from distlaunch.training.precision import ELEMENT_BYTES, hidden_dtype_name
from distlaunch.training.presets import GPTConfig


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


def chunks_take_turns(dims: ParallelDims) -> bool:
    """Interleaved with one round of pp micro-batches: each of a rank's chunks runs all its backwards
    before the next chunk's first, with no forward in between (more rounds interleave them)."""
    return dims.schedule == "interleaved" and dims.microbatches <= dims.pp


def later_in_flight(dims: ParallelDims, pp_rank: int) -> tuple[float, bool]:
    """Micro-batches in flight at a pp rank's backwards after its first, and whether a forward
    runs between two of them (1F1B's steady state)."""
    m = dims.microbatches
    warmup = m if dims.schedule == "gpipe" else min(m, dims.pp - pp_rank)
    if m <= warmup:
        return in_flight_microbatches(dims, pp_rank) - 1, False
    return in_flight_microbatches(dims, pp_rank), not chunks_take_turns(dims)


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
    sbh = s * b * h  # one hidden state of one micro-batch, in elements
    elem = ELEMENT_BYTES[precision]  # the matmuls' inputs and outputs (autocast's dtype)
    hidden = ELEMENT_BYTES[hidden_dtype_name(precision, dims.zero)]
    # What a block saves per micro-batch (Korthikanti et al. 2022, without dropout masks; the
    # fused attention keeps no score matrix): its input and the attention block's output, the
    # hidden states, and each norm's output as the next matmul's input (2 sbh each); q, k, v,
    # the attention output, and the MLP's hidden layer before and after GELU (12 sbh / t).
    per_layer = sbh * (2 * hidden + 2 * elem + 12 / t * elem)
    layers = rank_layers(model, dims, pp_rank) - done
    in_flight = in_flight_microbatches(dims, pp_rank) if in_flight is None else in_flight
    # a block's backward works beside what is saved: the gradient of the residual stream and of
    # the MLP's hidden layer, in fp32 as autograd accumulates them
    working = sbh * (1 + 4 / t) * FP32
    # with checkpointing each block keeps only its input, and one block is recomputed at a time.
    # The input is counted at 4 bytes an element in every precision: the peaks measured with
    # 16-bit hidden states (tests/train/test_training.py) are that much above 2 bytes' worth.
    saved = layers * in_flight * (sbh * FP32 if checkpointing else per_layer)
    kept = saved + (per_layer if checkpointing else working)
    last = holds_last_stage(dims, pp_rank)
    if dims.pp > 1:
        # the schedule keeps each in-flight micro-batch's stage output for its backward (on the
        # last stage: the logits), and before the last stage, the output gradient it received
        vocab = b * s * model.vocab_size // t
        kept += in_flight * vocab * elem if last else (in_flight + 1) * sbh * hidden
    if last and not done:
        # the loss's backward: the final norm's input and output, and, per fp32 (tokens x vocab)
        # logits tensor of one micro-batch, the log-probabilities cross_entropy saved, the gradient
        # its nll_loss hands back and the logits' gradient it computes, alive at once (under tp,
        # each a vocabulary shard). Measured in tests/train/test_training.py, and within 1% on a
        # GPU (docs/benchmarks.md), where the logits make most of the peak. Without tp that
        # backward is over before the blocks' starts, so the larger of the two moments counts;
        # under tp the vocab-parallel loss keeps more than these, and the sum covers it.
        logits = FP32 * b * s * model.vocab_size // t
        loss = 2 * sbh * hidden + 3 * logits
        if t > 1:
            kept += loss
        elif checkpointing:
            kept += max(0, loss - per_layer)  # the recomputed block comes after the loss's backward
        else:
            kept += max(0, loss - working)
    return int(kept)

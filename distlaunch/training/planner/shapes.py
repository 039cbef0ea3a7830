"""What a rank holds, from the preset's shapes: its parameters after tp and pp, and the bytes of
its kept state (parameters, gradients, AdamW state) per ZeRO stage.

The state follows what the engine really allocates, tensor by tensor, so it matches the measured
bytes (``Engine.state_bytes``): gradients and AdamW state are fp32 in every precision; the
parameters are in ``precision.model_dtype_name``'s dtype (bf16 with ZeRO-0/1/2, then with fp32
master weights, counted as optimizer state: whole for ZeRO-0, this rank's slice for ZeRO-1/2;
else fp32, their own master weights), AdamW holds two moments and a 4-byte step counter per tensor, ZeRO-1/2 slice each flattened tensor into dp
slots of ceil(numel/dp), ZeRO-3 (FSDP2) shards dim 0 into dp padded rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from distlaunch.training.dims import ParallelDims, stage_layer_counts
from distlaunch.training.precision import ELEMENT_BYTES, model_dtype_name
from distlaunch.training.presets import GPTConfig

FP32 = 4
ADAM_STEP_BYTES = 4  # AdamW's per-tensor step counter (a float32 scalar tensor)
TENSORS_PER_BLOCK = 8  # two norms (weight, bias), wqkv, wo, fc, proj: see stage_tensors


@dataclass(frozen=True)
class Tensor:
    """One parameter as this rank holds it after tensor parallel: (rows, cols)."""

    rows: int
    cols: int

    @property
    def numel(self) -> int:
        return self.rows * self.cols


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


def rank_stages(dims: ParallelDims, pp_rank: int) -> list[int]:
    """The stages a pp rank runs (interleaved: stages pp_rank, pp_rank+pp, ...)."""
    return [pp_rank + k * dims.pp for k in range(dims.virtual_stages)]


def rank_tensors(model: GPTConfig, dims: ParallelDims, pp_rank: int) -> list[Tensor]:
    """Every parameter of this pp rank's stage(s)."""
    return [t for s in rank_stages(dims, pp_rank) for t in stage_tensors(model, s, dims.n_stages, dims.tp)]


def rank_layers(model: GPTConfig, dims: ParallelDims, pp_rank: int) -> int:
    """Transformer blocks of this pp rank's stage(s)."""
    counts = stage_layer_counts(model.n_layer, dims.n_stages)
    return sum(counts[s] for s in rank_stages(dims, pp_rank))


def holds_last_stage(dims: ParallelDims, pp_rank: int) -> bool:
    return dims.n_stages - 1 in rank_stages(dims, pp_rank)


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
        owned = sum(zero12_owned(t.numel, dp, dp_rank) for t in tensors)
        grads = FP32 * (full if zero == 1 else sum(ceil(t.numel / dp) for t in tensors))  # stage 1: full gradient
        return param * full, grads, per_owned * owned + steps
    padded = sum(ceil(t.rows / dp) * t.cols for t in tensors)  # FSDP2: dim 0 padded to dp equal rows
    owned = sum(zero3_owned(t, dp, dp_rank) for t in tensors)
    return FP32 * padded, FP32 * padded, 2 * FP32 * owned + steps


def zero12_owned(numel: int, dp: int, dp_rank: int) -> int:
    """Elements of a flattened tensor in dp rank ``dp_rank``'s slot (the last slot is shorter)."""
    slot = ceil(numel / dp)
    return max(0, min(slot, numel - dp_rank * slot))


def zero3_owned(t: Tensor, dp: int, dp_rank: int) -> int:
    """Elements of ``t`` in dp rank ``dp_rank``'s rows (without the padding)."""
    rows = ceil(t.rows / dp)
    return max(0, min(rows, t.rows - dp_rank * rows)) * t.cols


def block_numel(model: GPTConfig, tp: int) -> int:
    """Parameters of one transformer block as one tp rank holds them."""
    d, f = model.d_model, model.mlp_ratio * model.d_model
    return 4 * d + (3 * d * d + d * d + 2 * f * d) // tp


def head_unit_numel(model: GPTConfig, dims: ParallelDims, pp_rank: int, vocab_over_dp: bool = False) -> int:
    """Parameters of ZeRO-3's head unit (the final norm and the LM head, on the last stage; the norm
    alone where the head is sharded by rows over dp, ``vocab_over_dp``)."""
    if not holds_last_stage(dims, pp_rank):
        return 0
    return 2 * model.d_model + (0 if vocab_over_dp else model.vocab_size // dims.tp * model.d_model)


def gathered_numel(model: GPTConfig, dims: ParallelDims, pp_rank: int, vocab_over_dp: bool = False) -> int:
    """Parameters ZeRO-3 holds unsharded while it gathers unit by unit (parallel/units.py): the
    head unit (kept from its forward to its backward) and two blocks (the one running, the next
    one prefetched). The embeddings are gathered for the forward only."""
    layers = rank_layers(model, dims, pp_rank)
    return head_unit_numel(model, dims, pp_rank, vocab_over_dp) + min(2, layers) * block_numel(model, dims.tp)


def vocab_tables_numel(model: GPTConfig, stage: int, n_stages: int, vocab_over_dp: bool) -> int:
    """The token embedding's and the LM head's parameters in pipeline stage ``stage`` where ZeRO-3
    never gathers them (``vocab_over_dp``: ``dims.shards_vocab_over_dp``, ``parallel/vocab.py``), else 0."""
    if not vocab_over_dp:
        return 0
    return model.vocab_size * model.d_model * ((stage == 0) + (stage == n_stages - 1))


def unsharded_numel(model: GPTConfig, dims: ParallelDims, pp_rank: int, vocab_over_dp: bool = False) -> int:
    """Parameters ZeRO-3 holds unsharded at most. With pp, the whole stage: torch's PipelineStage
    keeps FSDP from resharding after a backward and reduce-scatters only after the last micro-batch
    (less the vocabulary tables sharded over dp, which are never gathered)."""
    if dims.pp > 1:
        stages = rank_stages(dims, pp_rank)
        tables = sum(vocab_tables_numel(model, s, dims.n_stages, vocab_over_dp) for s in stages)
        return sum(x.numel for x in rank_tensors(model, dims, pp_rank)) - tables
    return gathered_numel(model, dims, pp_rank, vocab_over_dp)

"""Megatron-style tensor parallelism with PyTorch's DTensor styles.

Attention is split by heads: the fused q/k/v projection is column-parallel (its rows are laid out
head by head, so each rank computes whole n_head/tp heads), the output projection is row-parallel
(one all-reduce). Backward does one all-reduce for the attention input and one for the MLP input. The MLP is column- then row-parallel
(one all-reduce). The token embedding is vocabulary-parallel (each rank owns vocab/tp rows, an
all-reduce assembles the embeddings) and the LM head is column-parallel over the vocabulary; its
logits stay sharded and the cross-entropy runs on the shards (``loss_parallel``), so the full
(B, T, vocab) logits are never gathered. Norms and the position embedding stay replicated.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    loss_parallel,
    parallelize_module,
)

from distlaunch.engine.model import GPT
from distlaunch.engine.parallel.wire import gather_stacked


def tp_plan(model: GPT) -> dict[str, ParallelStyle]:
    """Module name -> parallel style, for the parts of ``model`` this stage still has."""
    plan: dict[str, ParallelStyle] = {}
    if model.tok_emb is not None:
        # vocab-parallel embedding: out-of-shard ids give zeros, the all-reduce fills them in
        plan["tok_emb"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    for name in model.blocks:
        for proj in ("attn.wqkv", "mlp.fc"):
            plan[f"blocks.{name}.{proj}"] = ColwiseParallel()
        for proj in ("attn.wo", "mlp.proj"):
            plan[f"blocks.{name}.{proj}"] = RowwiseParallel()
    if model.head is not None:
        # local (B, T, vocab/tp) logits: a plain tensor crosses the pipeline loss boundary
        # more simply than a DTensor; vocab_parallel_cross_entropy re-wraps it
        plan["head"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=True)
    return plan


def apply_tp(model: GPT, tp_mesh: DeviceMesh) -> GPT:
    """Shard ``model``'s weights over ``tp_mesh`` in place (no-op for tp=1)."""
    if tp_mesh.size() == 1:
        return model
    parallelize_module(model, tp_mesh, tp_plan(model))
    return model


def cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, vocab_mesh: DeviceMesh | None, every_rank: bool = False
) -> torch.Tensor:
    """Mean token cross-entropy. With a ``vocab_mesh`` the logits are this rank's vocabulary shard over
    it: tp's (B, T, V/tp), or (``every_rank``) ZeRO-3's ``vocab.ShardedHead``'s (dp*B, T, V/dp), which
    covers every dp rank's tokens: the targets are gathered to match, and the loss is the mean over
    the dp group's tokens."""
    if vocab_mesh is None or vocab_mesh.size() == 1:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # (B*T, V) vs (B*T,)
    if every_rank:
        targets = gather_stacked(targets, vocab_mesh.get_group()).flatten(0, 1)  # (dp*B, T)
    sharded = DTensor.from_local(logits, vocab_mesh, [Shard(-1)])
    return F.cross_entropy(sharded.flatten(0, 1), targets.flatten())  # must run in loss_context


def loss_context(vocab_mesh: DeviceMesh | None) -> contextlib.AbstractContextManager:
    """Context for forward *and* backward of the loss: the sharded cross-entropy needs both."""
    if vocab_mesh is None or vocab_mesh.size() == 1:
        return contextlib.nullcontext()
    return loss_parallel()


def loss_value(loss: torch.Tensor) -> torch.Tensor:
    """A detached plain scalar from a plain or DTensor (replicated) loss."""
    if isinstance(loss, DTensor):
        return loss.detach().to_local()
    return loss.detach()

"""ZeRO-3's token embedding, looked up where its rows live.

FSDP would make the token embedding a unit like any other: all-gather the whole (vocab, d_model)
table for every forward, and in backward compute a whole-table gradient, copy it into a
reduce-scatter buffer of the same size and reduce that. With a real vocabulary the table is the
largest parameter of the model (125m: 38.6M of 163M), so for a moment a rank holds two full-size
copies of it besides its shards: the highest point of a ZeRO-3 rank's memory.

Yet a step reads only the rows of the tokens in its batch. ``ShardedTokenEmbedding`` keeps the
table sharded by rows over the dp group (rank r holds rows r*ceil(V/dp) onwards, as FSDP's and
DTensor's ``Shard(0)``), and moves tokens instead of the table:

- forward: all-gather every dp rank's token ids; each rank looks up, for every rank's tokens, the
  rows it holds (zeros for the others); a reduce-scatter gives each rank the sum of those
  lookups for its own tokens, which is its embeddings;
- backward: all-gather every rank's gradient of its embeddings; each rank adds, into the
  gradient of its own rows, the gradients of the tokens that fall there, and divides by dp as
  FSDP does (the gradient is the dp mean).

The weight stays a DTensor sharded over dp like every FSDP parameter, so optimizer, clipping and
checkpoints treat it the same. ``dims.looks_up_sharded`` decides when to use it.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from distlaunch.engine.parallel.wire import all_gather, reduce_scatter, reduces_by_all_reduce


class ShardedTokenEmbedding(nn.Module):
    """A token embedding whose ``weight`` is sharded by rows over ``dp_mesh`` (module docstring).

    Built on the meta device in place of the model's ``tok_emb`` (same parameter name and full
    shape), before ``fully_shard``, which is told to leave the weight alone; ``materialize`` fills
    each rank's rows. ``compute_dtype``: the dtype of the embeddings returned (bf16 or fp16 when
    training in 16 bits, as FSDP's gathered units compute); the weight and its gradient stay fp32."""

    def __init__(self, num_embeddings: int, embedding_dim: int, dp_mesh: DeviceMesh, compute_dtype: torch.dtype):
        super().__init__()
        full = torch.empty(num_embeddings, embedding_dim, device="meta")
        self.weight = nn.Parameter(distribute_tensor(full, dp_mesh, [Shard(0)], src_data_rank=None))
        self.group = dp_mesh.get_group()
        self.dp, self.dp_rank = dp_mesh.size(), dp_mesh.get_local_rank()
        self.num_embeddings = num_embeddings
        self.start = min(self.dp_rank * math.ceil(num_embeddings / self.dp), num_embeddings)
        self.compute_dtype = compute_dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight.to_local()  # differentiable: the gradient comes back sharded like the weight
        return _Lookup.apply(ids, rows, self)


class _Lookup(torch.autograd.Function):
    """(ids of this rank, this rank's rows) -> this rank's embeddings; see the module docstring."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, rows: torch.Tensor, table: ShardedTokenEmbedding) -> torch.Tensor:
        every = _gather(ids, table)  # (dp, B, T): every rank's token ids
        _check_ids(every, table.num_embeddings)
        local = every - table.start
        outside = (local < 0) | (local >= rows.shape[0])
        local = local.masked_fill(outside, 0)
        # (dp, B, T, C): for every rank's tokens, the rows this rank holds; zeros where another holds them
        found = F.embedding(local, rows).masked_fill_(outside.unsqueeze(-1), 0).to(table.compute_dtype)
        mine = _sum_own_slot(found, table)
        ctx.table = table
        ctx.save_for_backward(local, outside)
        ctx.rows_shape, ctx.rows_dtype = rows.shape, rows.dtype
        return mine

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        table = ctx.table
        local, outside = ctx.saved_tensors
        every = _gather(grad, table).to(ctx.rows_dtype)  # (dp, B, T, C): every rank's gradient
        every.masked_fill_(outside.unsqueeze(-1), 0)
        rows_grad = torch.zeros(ctx.rows_shape, dtype=ctx.rows_dtype, device=grad.device)
        rows_grad.index_add_(0, local.reshape(-1), every.reshape(-1, every.shape[-1]))
        return None, rows_grad.div_(table.dp), None


def _check_ids(every: torch.Tensor, rows: int) -> None:
    """A token id outside the table would find no rank holding its row and silently embed as zeros
    (a plain embedding raises); here every rank sees every id, so all of them fail together, none
    left waiting in a collective. On a GPU the check is asynchronous (no host sync per step)."""
    bad = (every < 0) | (every >= rows)
    if every.device.type != "cpu":
        torch._assert_async(~bad.any(), f"a token id is outside the vocabulary (0..{rows - 1})")
    elif bad.any():
        raise IndexError(
            f"token id {int(every[bad][0])} is outside the vocabulary (0..{rows - 1}): "
            "check that the data was prepared with this model's tokenizer"
        )


def _gather(t: torch.Tensor, table: ShardedTokenEmbedding) -> torch.Tensor:
    """Every dp rank's ``t``, stacked: (dp, *t.shape)."""
    out = t.new_empty(table.dp * t.numel())
    all_gather(out, t.contiguous().view(-1), group=table.group)
    return out.view(table.dp, *t.shape)


def _sum_own_slot(found: torch.Tensor, table: ShardedTokenEmbedding) -> torch.Tensor:
    """Slot ``dp_rank`` of ``found`` (dp, ...) summed over the dp group: a reduce-scatter (gloo: an
    all-reduce in place, which moves the same bytes without gloo's copy)."""
    if reduces_by_all_reduce(table.group):
        dist.all_reduce(found, group=table.group)
        return found[table.dp_rank].clone()
    out = found.new_empty(found.shape[1:])
    reduce_scatter(out, found.reshape(-1), group=table.group)
    return out

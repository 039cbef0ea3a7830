"""ZeRO-3's vocabulary-sized tables, sharded by rows over dp: tokens travel, the tables stay put.

FSDP would make the token embedding and the LM head units like any other: all-gather the whole
(vocab, d_model) table for the forward (the head keeps it until its backward), compute a
whole-table gradient in backward, copy it into a reduce-scatter buffer of the same size and
reduce that. With a real vocabulary each table is the largest parameter of the model (125m: 38.6M
of 163M parameters each), so for a moment a rank holds two or three full-size copies of one
besides its shards: the highest points of a ZeRO-3 rank's memory.

Yet a step touches a table only through its tokens. Here each table stays sharded by rows over
the dp group (rank r holds rows r*ceil(V/dp) onwards, as FSDP's and DTensor's ``Shard(0)``), and
every dp rank's tokens come to the rows instead:

- ``ShardedTokenEmbedding``. Forward: all-gather every rank's token ids; each rank looks up, for
  every rank's tokens, the rows it holds (zeros for the others); a reduce-scatter gives each rank
  the sum of those lookups for its own tokens, which is its embeddings. Backward: all-gather every
  rank's gradient of its embeddings; each rank adds, into the gradient of its own rows, those of
  the tokens that fall there, and divides by dp (the gradient is the dp mean, as FSDP's).
- ``ShardedHead``. Forward: all-gather every rank's final hidden states; each rank computes, for
  every rank's tokens, the logits of the vocabulary entries it holds: vocabulary-parallel logits
  over dp, which the loss reads with ``loss_parallel`` against every rank's targets
  (``tensor.cross_entropy``), so each rank's loss is the mean over the dp group's tokens. Backward:
  the weight's gradient is this rank's rows of the dp mean's, as it stands; the hidden states'
  gradients are reduce-scattered back to the ranks they came from and multiplied by dp, so that
  each rank's backward goes on with the gradient of its own tokens' mean, as under FSDP.

Both weights stay DTensors sharded over dp like every FSDP parameter, so optimizer, clipping and
checkpoints treat them the same, and both move (dp, micro-batch, seq, d_model) buffers in place of
the table. ``dims.shards_vocab_over_dp`` decides when: where those buffers are no larger.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from distlaunch.engine.parallel.wire import gather_stacked, sum_own_slot


class _RowShard(nn.Module):
    """A (rows, width) ``weight`` sharded by rows over ``dp_mesh``, built on the meta device in place
    of a model table (same parameter name and full shape), before ``fully_shard``, which is told to
    leave it alone; ``materialize`` fills each rank's rows. The weight and its gradient stay fp32;
    ``compute_dtype`` (bf16 or fp16 when training in 16 bits) is what it computes in, as FSDP's
    gathered units do."""

    def __init__(self, rows: int, width: int, dp_mesh: DeviceMesh, compute_dtype: torch.dtype):
        super().__init__()
        full = torch.empty(rows, width, device="meta")
        self.weight = nn.Parameter(distribute_tensor(full, dp_mesh, [Shard(0)], src_data_rank=None))
        self.mesh, self.group = dp_mesh, dp_mesh.get_group()
        self.dp, self.dp_rank = dp_mesh.size(), dp_mesh.get_local_rank()
        self.rows = rows
        self.start = min(self.dp_rank * math.ceil(rows / self.dp), rows)
        self.compute_dtype = compute_dtype


class ShardedTokenEmbedding(_RowShard):
    """The token embedding, looked up where its rows live (see the module docstring)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight.to_local()  # differentiable: the gradient comes back sharded like the weight
        return _Lookup.apply(ids, rows, self)


class ShardedHead(_RowShard):
    """The LM head over the rows (vocabulary entries) this rank holds, for every dp rank's tokens
    (see the module docstring). Returns this rank's (dp * B, T, V / dp) block of the dp group's
    vocabulary-parallel logits, a plain tensor as tp's head returns its shard; ``cross_entropy``
    reads it over ``mesh`` against every rank's targets."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        every = _GatherTokens.apply(hidden, self)  # (dp * B, T, C)
        return F.linear(every, self.weight.to_local().to(self.compute_dtype))


class _Lookup(torch.autograd.Function):
    """(ids of this rank, this rank's rows) -> this rank's embeddings; see the module docstring."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, rows: torch.Tensor, table: ShardedTokenEmbedding) -> torch.Tensor:
        every = gather_stacked(ids, table.group)  # (dp, B, T): every rank's token ids
        _check_ids(every, table.rows)
        local = every - table.start
        outside = (local < 0) | (local >= rows.shape[0])
        local = local.masked_fill(outside, 0)
        # (dp, B, T, C): for every rank's tokens, the rows this rank holds; zeros where another holds them
        found = F.embedding(local, rows).masked_fill_(outside.unsqueeze(-1), 0).to(table.compute_dtype)
        mine = sum_own_slot(found, table.group)
        ctx.table = table
        ctx.save_for_backward(local, outside)
        ctx.rows_shape, ctx.rows_dtype = rows.shape, rows.dtype
        return mine

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        table = ctx.table
        local, outside = ctx.saved_tensors
        every = gather_stacked(grad, table.group).to(ctx.rows_dtype)  # (dp, B, T, C): every rank's gradient
        every.masked_fill_(outside.unsqueeze(-1), 0)
        rows_grad = torch.zeros(ctx.rows_shape, dtype=ctx.rows_dtype, device=grad.device)
        rows_grad.index_add_(0, local.reshape(-1), every.reshape(-1, every.shape[-1]))
        return None, rows_grad.div_(table.dp), None


class _GatherTokens(torch.autograd.Function):
    """(B, T, C) hidden states of this rank -> (dp * B, T, C) of every rank; backward: the sum over the
    dp group of the gradient of this rank's block, times dp (see the module docstring)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, head: ShardedHead) -> torch.Tensor:
        ctx.head = head
        return gather_stacked(hidden, head.group).flatten(0, 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        head = ctx.head
        blocks = grad.reshape(head.dp, -1, *grad.shape[1:]).contiguous()  # (dp, B, T, C)
        return sum_own_slot(blocks, head.group).mul_(head.dp), None


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


def shard_vocab_tables(chunk: nn.Module, dp_mesh: DeviceMesh, compute_dtype: torch.dtype) -> set[nn.Parameter]:
    """Replace the token embedding and the LM head of ``chunk`` (those its pipeline stage has) by
    their row-sharded forms, on the meta device; the parameters ``fully_shard`` must leave alone."""
    if chunk.tok_emb is not None:
        chunk.tok_emb = ShardedTokenEmbedding(*chunk.tok_emb.weight.shape, dp_mesh, compute_dtype)
    if chunk.head is not None:
        chunk.head = ShardedHead(*chunk.head.weight.shape, dp_mesh, compute_dtype)
    return {m.weight for m in (chunk.tok_emb, chunk.head) if isinstance(m, _RowShard)}

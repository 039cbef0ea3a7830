"""ZeRO-3's units: which modules FSDP2 gathers together, and how the large ones are reduced.

A unit is all-gathered whole for its forward and backward, and its gradients are reduce-scattered
whole, so the largest unit sets a rank's transient memory. With a real vocabulary the embeddings
and the LM head are each as large as several blocks (125m: 38.6M parameters each against 7.1M a
block), so they are units of their own instead of one root unit that stayed unsharded from the
first forward to the end of backward (both tables at once, with their gradients):

- ``tok_emb`` + ``pos_emb``: gathered for the forward only. An embedding's backward needs no
  weights, so the unit is not gathered again for it (``set_unshard_in_backward``).
- ``head`` + ``norm``: the head first, so FSDP's reduce (whose loop keeps its last gradient alive
  until the collective returns) frees the head's gradient once it is copied in.

Where ``dims.shards_vocab_over_dp``, ``tok_emb`` and ``head`` are no units at all, but sharded by
rows and never gathered (``parallel/vocab.py``); ``pos_emb`` and ``norm`` are then units alone.

On gloo a reduce-scatter clones its input, all-reduces the clone and copies this rank's part out
(``wire.reduces_by_all_reduce``); ``InPlaceReduceScatter`` all-reduces FSDP's own input buffer
instead (FSDP does not read it again): the same bytes on the wire, one unit's gradients fewer in memory.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule

from distlaunch.engine.parallel.vocab import ShardedHead, ShardedTokenEmbedding
from distlaunch.engine.parallel.wire import reduces_by_all_reduce

try:  # FSDP2's interface for a custom reduce-scatter (torch >= 2.8)
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
except ImportError:  # pragma: no cover - older torch: the default collective
    ReduceScatter = object  # type: ignore[assignment,misc]


class InPlaceReduceScatter(ReduceScatter):
    """gloo's reduce-scatter without its clone of the input: all-reduce in place, keep our part."""

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        dist.all_reduce(input_tensor, op=op, group=group)
        output_tensor.copy_(input_tensor.chunk(group.size())[group.rank()])
        return None


def unit_groups(chunk: nn.Module) -> list[list[nn.Module]]:
    """The units of a model chunk besides its blocks: the embeddings (first stage) and the head
    with the final norm (last stage); a middle stage has neither."""
    groups = []
    if isinstance(chunk.tok_emb, ShardedTokenEmbedding):  # sharded by rows already, never gathered
        groups.append([chunk.pos_emb])
    elif chunk.tok_emb is not None:
        groups.append([chunk.tok_emb, chunk.pos_emb])
    if isinstance(chunk.head, ShardedHead):
        groups.append([chunk.norm])
    elif chunk.head is not None:
        groups.append([chunk.head, chunk.norm])
    return groups


def tune_unit(unit: nn.Module, dp_mesh: DeviceMesh) -> None:
    """After ``fully_shard``: the embeddings are not gathered for backward, and on gloo every unit
    reduces in place (see the module docstring); each where this torch has it."""
    assert isinstance(unit, FSDPModule)
    if isinstance(unit, nn.Embedding) and hasattr(unit, "set_unshard_in_backward"):
        unit.set_unshard_in_backward(False)
    if (
        reduces_by_all_reduce(dp_mesh.get_group())
        and ReduceScatter is not object
        and hasattr(unit, "set_custom_reduce_scatter")
    ):
        unit.set_custom_reduce_scatter(InPlaceReduceScatter())

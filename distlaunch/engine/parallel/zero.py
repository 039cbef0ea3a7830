"""ZeRO stages 1 and 2: the optimizer updates a 1/dp slice of every parameter.

Every parameter's local tensor (its tp shard, if any) is flattened and cut into dp equal slices
(the last one shorter when dp does not divide it). dp rank r keeps Adam state only for slice r.
With fp32 parameters the slice it optimises is a view into the parameter's own storage, so no
extra copy of the weights exists; with 16-bit parameters (bf16, ``precision.model_dtype_name``)
it is an fp32 master copy of that slice only. After the step each slice is all-gathered back
into the parameter, in the parameter's dtype (bf16: half the bytes of fp32).

Gradients travel in buckets (``parallel/buckets.py``), in ``train.reduce_dtype`` (accumulated
in fp32 whatever it is, ``data.Fp32Gradients``; bf16 on the wire when training in bf16), one
collective per bucket, launched asynchronously from the backward hooks as soon as the bucket is
complete. The slices land in fp32.

- Backends with a reduce-scatter of their own (NCCL): a reduce-scatter (``wire.ReduceScatter``) of a
  send buffer laid out (dp, slots), so that rank r receives slot r of every parameter in it; each
  gradient is copied (and cast) into it once.
- Stage 1 on gloo, whose reduce-scatter is an all-reduce of a copy (``wire.reduces_by_all_reduce``):
  an all-reduce in place of the bucket's gradients packed end to end, as ZeRO-0's
  (``wire.all_reduce_bucket``, the loss riding in the last bucket). The whole dp mean is written
  back into the full gradients, the rank's slices are views of it, and the gradient norm is local.
  The same bytes on the wire, without gloo's copy or the (dp, slots) layout to fill.

- zero=1: gradients stay full-size on every rank; after the last micro-batch each bucket's
  collective leaves each rank the dp average of its slices (written into its part of the full
  gradient buffer).
- zero=2: each bucket is reduced after every micro-batch, added to slice-sized buffers,
  and the full gradients are freed once flattened into the send buffer (DeepSpeed stage 2 also
  reduces on every micro-batch; the full gradient of a bucket lives only until its last
  parameter's hook).

Why not ``ZeroRedundancyOptimizer``: it assigns whole parameters to ranks (uneven memory when
a few tensors are large), it cannot hold DTensor (tp) parameters, and it has no gradient sharding.
"""

from __future__ import annotations

import collections
import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from distlaunch.engine.parallel.buckets import Reduction
from distlaunch.engine.parallel.data import (
    DataParallelBase,
    OptimizerFactory,
    align_grad,
    local,
    tp_sharded,
)
from distlaunch.engine.parallel.wire import ReduceScatter, all_gather, all_reduce_bucket, reduces_by_all_reduce
from distlaunch.engine.watchdog import wait_for_peers
from distlaunch.training.bucketing import GATHERS_IN_FLIGHT


def _finish(work, done) -> None:
    wait_for_peers(work)
    done()


class ParamShard:
    """One parameter's slice on this dp rank, and the buffers to move it around."""

    def __init__(self, param: nn.Parameter, dp_rank: int, dp: int, copy: bool = False):
        self.param = param
        flat = local(param).detach().view(-1)  # a view: the parameter's own storage
        self.numel = flat.numel()
        self.size = math.ceil(self.numel / dp)  # every rank's slot in the collectives
        start = min(dp_rank * self.size, self.numel)
        stop = min(start + self.size, self.numel)
        self.start, self.stop = start, stop
        # the optimizer's parameter aliases this rank's slice of the weights, or (``copy``: the
        # parameter is about to become 16-bit) is an fp32 copy of it taken before the cast
        piece = flat[start:stop]
        self.master = nn.Parameter(piece.float().clone() if copy else piece, requires_grad=True)

    def fill(self, rows: torch.Tensor, column: int, flat: torch.Tensor | None) -> None:
        """Lay ``flat`` (this parameter's whole local gradient, or None: zeros) into a bucket's send
        ``rows`` (dp, slots of the bucket) from ``column``: row r gets slot r, the padding zeros.
        One copy, which casts to the rows' dtype (the reduce dtype)."""
        block = rows[:, column : column + self.size]
        if flat is None:
            block.zero_()
            return
        full_rows, rest = divmod(self.numel, self.size)
        block[:full_rows].copy_(flat[: full_rows * self.size].view(full_rows, self.size))
        if rest:
            block[full_rows, :rest].copy_(flat[full_rows * self.size :])
            block[full_rows, rest:].zero_()
        block[full_rows + (1 if rest else 0) :].zero_()

    def write_back(self, rows: torch.Tensor, column: int) -> None:
        """Copy this parameter's slots out of a bucket's gathered ``rows`` (dp, slots of the
        bucket), starting at ``column``, into the full local parameter: row r holds rank r's
        slice, so the parameter is the rows' slots read in order, cut at ``numel`` (``fill``'s
        reverse)."""
        flat = local(self.param).detach().view(-1)
        full_rows, rest = divmod(self.numel, self.size)
        body = flat[: full_rows * self.size].view(full_rows, self.size)
        body.copy_(rows[:full_rows, column : column + self.size])
        if rest:
            flat[full_rows * self.size :].copy_(rows[full_rows, column : column + rest])


class ShardedDP(DataParallelBase):
    """zero=1 (optimizer state sharded) or zero=2 (+ gradients sharded) over the dp group."""

    def __init__(
        self,
        named_params,
        dp_mesh,
        tp,
        make_optimizer: OptimizerFactory,
        zero: int,
        reduction: Reduction | None = None,
        groups: list[list[nn.Parameter]] | None = None,
        param_dtype: torch.dtype = torch.float32,
        reduce_dtype: torch.dtype = torch.float32,
        carry_loss: bool = False,
    ):
        super().__init__(named_params, dp_mesh, tp)
        self.zero = zero
        self.reduce_dtype = reduce_dtype
        self.group = dp_mesh.get_group()
        self.rank = rank = dp_mesh.get_local_rank()
        # stage 2 reduces every round, and a reduce-scatter frees its send buffer once done, where the
        # all-reduce's whole bucket would stay until its slices are taken: stage 1 only
        self.all_reduces = zero == 1 and reduces_by_all_reduce(self.group)
        self.carries_loss = self.all_reduces and carry_loss
        low = param_dtype != torch.float32
        self.shards = [ParamShard(p, rank, self.dp, copy=low) for p in self.params]
        self.shard_of = {s.param: s for s in self.shards}
        self.masters = [s.master for s in self.shards] if low else []
        self.optimizer = make_optimizer([(s.master, s.param.ndim >= 2) for s in self.shards])
        self._hold_parameters_in(param_dtype)
        # stage 2 reduces every round (the full gradient is freed as soon as its bucket is
        # flattened); stage 1 once per step, after the last round
        reduction = reduction or Reduction()
        self.reducer = reduction.reducer(
            groups or [self.params],
            self._launch,
            per_round=zero == 2,
            hold_last=self.carries_loss,
            grad_of=self.grads.get,
        )

    def _launch(self, params: list[nn.Parameter], extra: list[torch.Tensor]):
        """One collective for a bucket; ``extra`` (the loss) rides along only when all-reducing."""
        shards = [self.shard_of[p] for p in params]
        for shard in shards:
            align_grad(shard.param)
        if self.all_reduces:
            return self._all_reduce(shards, extra)
        # (dp, sum of slots): row r is what rank r receives, contiguous as the collective wants
        send = torch.empty(
            self.dp, sum(s.size for s in shards), dtype=self.reduce_dtype, device=shards[0].master.device
        )
        column = 0
        for shard in shards:
            grad = self.grads.get(shard.param)
            shard.fill(send, column, None if grad is None else local(grad).reshape(-1))
            column += shard.size
        work = ReduceScatter(send, self.group)
        if self.zero == 2:
            for shard in shards:
                self.grads.drop(shard.param)  # the point of stage 2: no full-size gradient survives

        def done() -> None:
            out = work.result().div_(self.dp)  # fp32, this rank's slots
            offset = 0
            for shard in shards:
                part = out[offset : offset + shard.stop - shard.start]  # a view: the slots are the buffer
                offset += shard.size
                grad = self.grads.get(shard.param)
                if self.zero == 1 and grad is not None:
                    # keep the slice inside the full gradient buffer: stage 1 stores no extra bytes
                    own = local(grad).view(-1)[shard.start : shard.stop]
                    own.copy_(part)
                    shard.master.grad = own
                elif shard.master.grad is None:
                    shard.master.grad = part
                else:
                    shard.master.grad.add_(part)

        return work, done

    def _all_reduce(self, shards: list[ParamShard], extra: list[torch.Tensor]):
        """Stage 1 on gloo: the bucket all-reduced in place as ZeRO-0 does it (the loss riding along),
        the whole dp mean written back into the full gradients; this rank's slices are views of it."""
        grads = [local(g) for g in (self.grads.get(s.param) for s in shards) if g is not None]
        work, write_back = all_reduce_bucket(grads, extra, self.reduce_dtype, self.group, self.dp)

        def done() -> None:
            write_back()
            for shard in shards:
                grad = self.grads.get(shard.param)
                if grad is not None:
                    shard.master.grad = local(grad).view(-1)[shard.start : shard.stop]

        return work, done

    def sync_grads(self, loss: torch.Tensor | None = None) -> None:
        self.reducer.finish([loss] if loss is not None and self.carries_loss else [])

    def step(self) -> None:
        self.optimizer.step()
        self.gather_parameters()

    @torch.no_grad()
    def gather_parameters(self) -> None:
        """Every rank's updated slices back into the full parameters, in their own dtype (bf16:
        half the bytes of fp32): one all-gather per gradient bucket, in the order the next
        forward needs them, at most ``GATHERS_IN_FLIGHT`` at a time (each holds a bucket-sized
        buffer until its parameters are written)."""
        in_flight: collections.deque = collections.deque()
        for bucket in reversed(self.reducer.buckets):
            if len(in_flight) == GATHERS_IN_FLIGHT:
                _finish(*in_flight.popleft())
            in_flight.append(self._launch_gather([self.shard_of[p] for p in bucket.params]))
        while in_flight:
            _finish(*in_flight.popleft())

    def _launch_gather(self, shards: list[ParamShard]):
        """One all-gather of this rank's slots of ``shards``; (work, finish callback). In place: this
        rank's row of the gathered buffer is what it sends, filled from the masters with one copy
        (which casts to the parameters' dtype)."""
        param = local(shards[0].param)
        rows = param.new_empty(self.dp, sum(s.size for s in shards))
        send, column = rows[self.rank], 0
        for shard in shards:
            width = shard.stop - shard.start
            send[column : column + width].copy_(shard.master.detach())
            send[column + width : column + shard.size].zero_()  # the last rank's short slice, or none at all
            column += shard.size
        work = all_gather(rows.view(-1), send, group=self.group, async_op=True)

        def done() -> None:
            column = 0
            for shard in shards:
                shard.write_back(rows, column)
                column += shard.size

        return work, done

    def zero_grad(self) -> None:
        self.reducer.reset()
        self.grads.clear()
        for shard in self.shards:
            shard.master.grad = None
        super().zero_grad()

    def grad_pieces(self):
        if self.all_reduces:  # every dp rank holds the whole mean: its slices are views of it
            yield from super().grad_pieces()
            return
        for shard in self.shards:
            if shard.master.grad is not None:
                copies = 1 if tp_sharded(shard.param) else self.tp
                yield shard.master.grad, 1.0 / copies

    def state_tensors(self) -> dict[str, list[torch.Tensor]]:
        state = super().state_tensors()
        state["grads"] += [s.master.grad for s in self.shards if s.master.grad is not None]
        return state

    def full_gradients(self) -> dict[str, torch.Tensor]:
        out = {}
        for (name, param), shard in zip(self.named_params, self.shards, strict=False):
            if shard.master.grad is None:
                continue
            slot = shard.master.grad.new_zeros(shard.size)
            slot[: shard.stop - shard.start] = shard.master.grad
            gathered = slot.new_empty(shard.size * self.dp)
            all_gather(gathered, slot, group=self.group)
            grad = gathered[: shard.numel].view(local(param).shape)
            if isinstance(param, DTensor):
                grad = DTensor.from_local(grad, param.device_mesh, param.placements).full_tensor()
            out[name] = grad
        return out

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
  (``wire.AllReduceMean``); each rank reads its slices out of the sum. The same bytes on the wire,
  without gloo's copy, and one copy of each gradient into the plain packed layout instead of the
  (dp, slots) one.

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
import itertools
import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from distlaunch.engine.parallel.bucketing import GATHERS_IN_FLIGHT
from distlaunch.engine.parallel.buckets import Reduction
from distlaunch.engine.parallel.data import (
    DataParallelBase,
    OptimizerFactory,
    align_grad,
    local,
    tp_sharded,
)
from distlaunch.engine.parallel.wire import AllReduceMean, ReduceScatter, reduces_by_all_reduce
from distlaunch.engine.parallel.wire import all_gather as _all_gather
from distlaunch.engine.watchdog import wait_for_peers


def _finish(work, done) -> None:
    wait_for_peers(work)
    done()


class _ParamShard:
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
    ):
        super().__init__(named_params, dp_mesh, tp)
        self.zero = zero
        self.reduce_dtype = reduce_dtype
        self.group = dp_mesh.get_group()
        self.rank = rank = dp_mesh.get_local_rank()
        # stage 2 reduces every round, and a reduce-scatter frees its send buffer once done, where the
        # all-reduce's whole bucket would stay until its slices are taken: stage 1 only
        self.all_reduces = zero == 1 and reduces_by_all_reduce(self.group)
        low = param_dtype != torch.float32
        self.shards = [_ParamShard(p, rank, self.dp, copy=low) for p in self.params]
        self.shard_of = {s.param: s for s in self.shards}
        self.masters = [s.master for s in self.shards] if low else []
        self.optimizer = make_optimizer([(s.master, s.param.ndim >= 2) for s in self.shards])
        self._hold_parameters_in(param_dtype)
        # stage 2 reduces every round (the full gradient is freed as soon as its bucket is
        # flattened); stage 1 once per step, after the last round
        reduction = reduction or Reduction()
        self.reducer = reduction.reducer(
            groups or [self.params], self._launch, per_round=zero == 2, grad_of=self.grads.get
        )

    def _launch(self, params: list[nn.Parameter], extra: list[torch.Tensor]):
        """One collective for a bucket (its ``extra`` is always empty: the loss travels with the norm)."""
        shards = [self.shard_of[p] for p in params]
        for shard in shards:
            align_grad(shard.param)
        launch = self._all_reduce if self.all_reduces else self._reduce_scatter
        work, means = launch(shards, [self.grads.get(s.param) for s in shards])
        if self.zero == 2:
            for shard in shards:
                self.grads.drop(shard.param)  # the point of stage 2: no full-size gradient survives

        def done() -> None:
            self._take(shards, means())

        return work, done

    def _reduce_scatter(self, shards: list[_ParamShard], grads: list[torch.Tensor | None]):
        """Rank r receives slot r of every parameter in the bucket; (work, this rank's slices of the
        dp mean, in fp32: views of the slots received)."""
        # (dp, sum of slots): row r is what rank r receives, contiguous as the collective wants
        send = torch.empty(
            self.dp, sum(s.size for s in shards), dtype=self.reduce_dtype, device=shards[0].master.device
        )
        column = 0
        for shard, grad in zip(shards, grads, strict=True):
            shard.fill(send, column, None if grad is None else local(grad).reshape(-1))
            column += shard.size
        work = ReduceScatter(send, self.group)

        def means() -> list[torch.Tensor]:
            out = work.result().div_(self.dp)
            starts = itertools.accumulate((s.size for s in shards), initial=0)
            return [out[start : start + s.stop - s.start] for start, s in zip(starts, shards, strict=False)]

        return work, means

    def _all_reduce(self, shards: list[_ParamShard], grads: list[torch.Tensor | None]):
        """The whole bucket's sum on every rank, in place; (work, this rank's slices of the dp mean, in
        fp32). A parameter without a gradient here sends zeros: every rank packs the same elements."""
        full = [
            local(g) if g is not None else local(s.param).new_zeros(local(s.param).shape, dtype=torch.float32)
            for s, g in zip(shards, grads, strict=True)
        ]
        total = AllReduceMean(full, self.reduce_dtype, self.group)

        def means() -> list[torch.Tensor]:
            # divided out of place: the bucket's buffer (or a gradient reduced in place) is not kept
            own = [piece[s.start : s.stop].float() for piece, s in zip(total.sums(), shards, strict=True)]
            return torch._foreach_div(own, self.dp)

        return total, means

    def _take(self, shards: list[_ParamShard], means: list[torch.Tensor]) -> None:
        """This rank's slices of the bucket's dp mean into its masters' gradients: stage 1 inside the
        full gradient buffer (it stores no extra bytes), stage 2 as slice-sized buffers, added up over
        the rounds."""
        inside = []
        for shard, mean in zip(shards, means, strict=True):
            grad = self.grads.get(shard.param)
            if self.zero == 1 and grad is not None:
                shard.master.grad = local(grad).view(-1)[shard.start : shard.stop]
                inside.append((shard.master.grad, mean))
            elif shard.master.grad is None:
                shard.master.grad = mean
            else:
                shard.master.grad.add_(mean)
        if inside:
            torch._foreach_copy_([own for own, _ in inside], [mean for _, mean in inside])

    def sync_grads(self) -> None:
        self.reducer.finish()

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

    def _launch_gather(self, shards: list[_ParamShard]):
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
        work = _all_gather(rows.view(-1), send, group=self.group, async_op=True)

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
            _all_gather(gathered, slot, group=self.group)
            grad = gathered[: shard.numel].view(local(param).shape)
            if isinstance(param, DTensor):
                grad = DTensor.from_local(grad, param.device_mesh, param.placements).full_tensor()
            out[name] = grad
        return out

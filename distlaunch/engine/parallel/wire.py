"""How a gradient bucket travels (ZeRO-0/1/2): packed in the reduce dtype, and ZeRO-1/2's reduce-scatter.

Gradients are accumulated in fp32 whatever ``train.reduce_dtype`` says
(``data.Fp32Gradients``); only the collective's buffer is in the reduce dtype
(``precision.reduce_dtype_name``), filled with one copy that also casts, and the result lands back
in fp32. A bf16 buffer is half the bytes of an fp32 one on the wire and in memory.

Also the two moves ZeRO-3's row-sharded vocabulary tables make (``parallel/vocab.py``): every rank's
tensor stacked (``gather_stacked``) and one rank's slot summed over the group (``sum_own_slot``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from distlaunch.training.bucketing import ALL_REDUCE_BACKENDS

# torch 2.13 renamed the single-tensor collectives; older releases only have the old names
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def reduces_by_all_reduce(group: dist.ProcessGroup) -> bool:
    """Whether ``group``'s reduce-scatter is an all-reduce of a copy of its input (``ALL_REDUCE_BACKENDS``:
    gloo), so that all-reducing our own buffer in place moves the same bytes without the copy."""
    return dist.get_backend(group) in ALL_REDUCE_BACKENDS


def pack(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """``tensors`` end to end in one flat buffer of ``dtype`` (one copy, which casts); a single
    tensor already of ``dtype`` is used as it is (reduced in place)."""
    if len(tensors) == 1 and tensors[0].dtype == dtype and tensors[0].is_contiguous():
        return tensors[0].view(-1)
    flat = torch.empty(sum(t.numel() for t in tensors), dtype=dtype, device=tensors[0].device)
    torch._foreach_copy_(list(pieces(flat, tensors)), [t.reshape(-1) for t in tensors])
    return flat


def pieces(flat: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flat``, one per tensor packed into it, flat."""
    out, offset = [], 0
    for t in tensors:
        out.append(flat[offset : offset + t.numel()])
        offset += t.numel()
    return out


class AllReduceMean:
    """An async all-reduce (sum) of ``tensors`` packed in ``dtype``; ``write_back`` after ``wait()``
    puts the dp mean into them (in their own dtype: fp32 after a 16-bit reduce)."""

    def __init__(self, tensors: list[torch.Tensor], dtype: torch.dtype, group: dist.ProcessGroup):
        self.tensors = tensors
        self.flat = pack(tensors, dtype)
        self.work = dist.all_reduce(self.flat, group=group, async_op=True)

    def wait(self) -> None:
        self.work.wait()

    def write_back(self, dp: int) -> None:
        if self.flat.data_ptr() != self.tensors[0].data_ptr():  # not reduced in place
            torch._foreach_copy_(
                self.tensors, [v.view_as(t) for v, t in zip(pieces(self.flat, self.tensors), self.tensors, strict=True)]
            )
        torch._foreach_div_(self.tensors, dp)  # SUM then divide: ReduceOp.AVG is missing on older gloo


def all_reduce_bucket(
    grads: list[torch.Tensor], extra: list[torch.Tensor], reduce_dtype: torch.dtype, group: dist.ProcessGroup, dp: int
) -> tuple[Collectives, Callable[[], None]]:
    """A bucket's gradients all-reduced in ``reduce_dtype``, and ``extra`` scalars (the loss) with them:
    in the bucket when it travels in fp32, else in an fp32 all-reduce of their own beside it (8 bits
    of mantissa would blur the reported loss). Returns (work, ``done``): ``done`` after the wait
    writes the dp mean back into every tensor."""
    scalars = [t.view(1) for t in extra]
    if reduce_dtype == torch.float32:  # the scalars ride in the bucket
        grads, scalars = grads + scalars, []
    sums = [AllReduceMean(ts, dtype, group) for ts, dtype in ((grads, reduce_dtype), (scalars, torch.float32)) if ts]

    def done() -> None:
        for collective in sums:
            collective.write_back(dp)

    return Collectives(sums), done


class Collectives:
    """Several async collectives, waited on as one work handle."""

    def __init__(self, works: list):
        self.works = works

    def wait(self) -> None:
        for work in self.works:
            work.wait()


class ReduceScatter:
    """An async reduce-scatter (sum) of a (dp, slots) ``send`` buffer; ``result()`` after ``wait()``
    is this rank's row of the sum, in fp32. For backends with a reduce-scatter of their own (NCCL):
    each rank receives 1/dp of the bucket. gloo's is an all-reduce of a copy
    (``reduces_by_all_reduce``), so ZeRO-1 all-reduces there instead (``all_reduce_bucket``)."""

    def __init__(self, send: torch.Tensor, group: dist.ProcessGroup):
        # ``send`` is not kept: the work holds it while the collective runs, and frees it once done
        # (a bucket's send buffer must not live on until the step's last bucket is waited for)
        self.out = send.new_empty(send.shape[1:])
        self.work = reduce_scatter(self.out, send.view(-1), group=group, async_op=True)

    def wait(self) -> None:
        self.work.wait()

    def result(self) -> torch.Tensor:
        return self.out.float()  # fp32: itself, no copy


def gather_stacked(t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's ``t``, stacked in rank order: (ranks, *t.shape)."""
    ranks = group.size()
    out = t.new_empty(ranks * t.numel())
    all_gather(out, t.contiguous().view(-1), group=group)
    return out.view(ranks, *t.shape)


def sum_own_slot(blocks: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Slot ``group.rank()`` of ``blocks`` (ranks, ...) summed over ``group``: a reduce-scatter (gloo: an
    all-reduce of ``blocks`` in place, the same bytes without gloo's copy)."""
    if reduces_by_all_reduce(group):
        dist.all_reduce(blocks, group=group)
        return blocks[group.rank()].clone()
    out = blocks.new_empty(blocks.shape[1:])
    reduce_scatter(out, blocks.reshape(-1), group=group)
    return out

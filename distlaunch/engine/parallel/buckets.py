"""Bucketed, overlapped gradient reduction for ZeRO stages 0, 1 and 2.

Parameters are grouped into buckets of about ``train.bucket_mb`` (DDP's idea and default, 25 MiB),
in reverse definition order (roughly the order backward produces gradients), never across two
pipeline chunks (the chunks of one rank run their backwards interleaved). A
post-accumulate-grad hook on every parameter counts how often its gradient has been accumulated;
when every parameter of a bucket has received its last contribution, the bucket's collective is
launched with ``async_op=True`` and the rest of backward keeps running while it is in flight.
``finish`` (called before the optimizer step) launches whatever did not launch from a hook and
waits for every handle.

"Last contribution" is counted, not signalled: every parameter of this GPT is used once per
forward, so its hook fires once per backward, i.e. ``rounds`` = micro-batches x accumulation
rounds times a step, whether the backwards come from the plain loop or a pipeline schedule.

- ``per_round=False`` (ZeRO-0/1): a bucket launches once per step, after its last round (DDP's
  ``no_sync`` on every round but the last): one collective per bucket and step.
- ``per_round=True`` (ZeRO-2): a bucket launches after every round, so the full-size gradient of a
  round lives only until its bucket is flattened (DeepSpeed stage 2): one collective per bucket and
  round.

What a collective does with a bucket is the strategy's: ``launch(params, extra)`` returns a
(work handle, finish callback) pair; ``params`` is empty when only ``extra`` scalars travel.
Buckets are sized by the fp32 gradients they gather (16-bit parameters have fp32 gradient
accumulators, ``parallel/data.py: Fp32Gradients``), 4 bytes an element, whatever
``train.reduce_dtype`` they travel in (``parallel/wire.py``): the same parameters share a bucket in
either dtype, and a bf16 bucket's collective carries half the bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from distlaunch.engine.parallel.hooks import register_weak_hook
from distlaunch.engine.watchdog import wait_for_peers
from distlaunch.training.bucketing import cut_buckets

DEFAULT_BUCKET_MB = 25.0  # DDP's bucket_cap_mb
REDUCE_BYTES = 4  # a bucket's size counts its fp32 gradients (whatever dtype they travel in)

Launch = Callable[[list[nn.Parameter], list[torch.Tensor]], tuple[object, Callable[[], None]]]
GradOf = Callable[[nn.Parameter], "torch.Tensor | None"]


@dataclass(frozen=True)
class Reduction:
    """How a strategy reduces: bucket size and backwards per step (micro-batches x rounds)."""

    bucket_mb: float = DEFAULT_BUCKET_MB
    rounds: int = 1

    def reducer(
        self,
        groups: Iterable[list[nn.Parameter]],
        launch: Launch,
        per_round: bool = False,
        hold_last: bool = False,
        grad_of: GradOf | None = None,
    ) -> GradReducer:
        bucket_bytes = int(self.bucket_mb * 2**20)
        return GradReducer(groups, bucket_bytes, self.rounds, launch, per_round, hold_last, grad_of)


class Bucket:
    """Parameters reduced by one collective, and how many of their hooks fired."""

    def __init__(self, index: int, params: list[nn.Parameter]):
        self.index = index
        self.params = params
        self.ready = 0  # parameters whose last contribution (of the round or step) arrived
        self.launched = False
        self.in_backward = 0  # launches made from a hook (the overlapped ones), for tests


def plan_buckets(groups: Iterable[list[nn.Parameter]], bucket_bytes: int) -> list[list[nn.Parameter]]:
    """Each group's parameters in reverse order, cut into buckets of at most ``bucket_bytes``
    (``bucketing.cut_buckets``; sized by what the collective carries: the local shard, in fp32)."""
    out: list[list[nn.Parameter]] = []
    for params in groups:
        shards = [p._local_tensor if isinstance(p, DTensor) else p for p in params]
        nbytes = [shard.numel() * REDUCE_BYTES for shard in shards]
        out += [[params[i] for i in bucket] for bucket in cut_buckets(nbytes, bucket_bytes)]
    return out


class GradReducer:
    """Launches each bucket's collective from the backward hooks as soon as the bucket is complete."""

    def __init__(
        self,
        groups: Iterable[list[nn.Parameter]],
        bucket_bytes: int,
        rounds: int,
        launch: Launch,
        per_round: bool = False,
        hold_last: bool = False,
        grad_of: GradOf | None = None,
    ):
        self.buckets = [Bucket(i, ps) for i, ps in enumerate(plan_buckets(groups, bucket_bytes))]
        self.rounds = rounds
        self.launch_fn = launch
        self.per_round = per_round
        self.grad_of = grad_of or (lambda p: p.grad)  # the strategy's (fp32) gradient of a parameter
        # the last bucket fills at the very end of backward: holding it until ``finish`` costs no
        # overlap and lets a scalar (the loss) ride in its collective
        self.hold_last = hold_last
        self.pending: list[tuple[Bucket, object, Callable[[], None]]] = []
        self.collectives = 0  # launched since the last ``reset``
        self.counts: dict[nn.Parameter, int] = {}
        self.bucket_of: dict[nn.Parameter, Bucket] = {}
        for bucket in self.buckets:
            for p in bucket.params:
                self.bucket_of[p] = bucket
                register_weak_hook(p, self._on_grad)

    def reset(self) -> None:
        """Start of a step: no contribution counted, nothing in flight."""
        self.wait()
        for bucket in self.buckets:
            bucket.ready, bucket.launched, bucket.in_backward = 0, False, 0
        self.counts = {}
        self.collectives = 0

    def _on_grad(self, param: torch.Tensor) -> None:
        bucket = self.bucket_of[param]
        count = self.counts.get(param, 0) + 1
        self.counts[param] = count
        if count % (1 if self.per_round else self.rounds) != 0:
            return  # more rounds will add to this gradient before it is reduced
        bucket.ready += 1
        if bucket.ready == len(bucket.params) and not (self.hold_last and bucket is self.buckets[-1]):
            self._launch(bucket, [])
            bucket.in_backward += 1

    def _launch(self, bucket: Bucket, extra: list[torch.Tensor], params: bool = True) -> None:
        if self.per_round:
            self._finish_bucket(bucket)  # its previous round's result must land first
        work, done = self.launch_fn(bucket.params if params else [], extra)
        self.pending.append((bucket, work, done))
        self.collectives += 1
        bucket.launched = True
        bucket.ready = 0 if self.per_round else bucket.ready

    def _finish_bucket(self, bucket: Bucket) -> None:
        for item in [x for x in self.pending if x[0] is bucket]:
            self.pending.remove(item)
            wait_for_peers(item[1])
            item[2]()

    def wait(self) -> None:
        """Wait for every collective in flight and apply its result."""
        pending, self.pending = self.pending, []
        for _, work, done in pending:
            wait_for_peers(work)
            done()

    def finish(self, extra: list[torch.Tensor] | None = None) -> None:
        """After the last backward: launch the buckets the hooks did not (the held one, and any
        whose count fell short, e.g. a parameter without gradient), then wait for all of them.
        ``extra`` tensors ride in the last launched collective."""
        extra = list(extra or [])
        for bucket in self.buckets:
            if bucket.launched and not (self.per_round and bucket.ready):
                continue
            if not any(self.grad_of(p) is not None for p in bucket.params) and not (
                extra and bucket is self.buckets[-1]
            ):
                continue
            self._launch(bucket, extra if bucket is self.buckets[-1] else [])
            if bucket is self.buckets[-1]:
                extra = []
        if extra:  # every bucket went out from a hook: the scalars need their own collective
            self._launch(self.buckets[-1], extra, params=False)
        self.wait()

"""Data parallelism and ZeRO stages 0 and 3, plus what every stage shares.

Each ZeRO stage is a small strategy object with one interface the trainer drives:
``sync_grads`` after the last micro-batch's backward, ``step`` (optimizer step and whatever
must follow it), ``zero_grad``, and read-only views for the gradient norm, memory and tests.

- zero=0 (``ReplicatedDP``): full parameters, gradients and Adam state on every dp rank; the
  gradients are averaged with bucketed all-reduces once per step (what DDP does with
  ``no_sync`` on all but the last micro-batch), each launched asynchronously from the backward
  hooks as soon as its bucket is complete (``parallel/buckets.py``). Not DDP itself: DDP cannot hold DTensor (tp)
  parameters and its reducer expects one backward per forward, which pipeline schedules break.
- zero=1/2: ``distlaunch.engine.parallel.zero.ShardedDP``.
- zero=3 (``shard_fully``, ``FullyShardedDP``): PyTorch's ``fully_shard`` (FSDP2) per block and per stage.

16-bit parameters (bf16 with ZeRO-0/1/2, ``precision.model_dtype_name``): the strategy is built on
the fp32 parameters ``materialize`` filled, takes its fp32 master copies from them, then casts the
parameters (``cast_parameters``); their gradients are accumulated in fp32 (``Fp32Gradients``), and
the optimizer updates the masters.

Every stage reduces the gradients in ``train.reduce_dtype`` (``precision.reduce_dtype_name``: bf16
when training in bf16, else fp32): ZeRO-0/1/2 pack each bucket in it (``parallel/wire.py``), ZeRO-3
hands it to FSDP2's ``MixedPrecisionPolicy``. The reduced gradients land in fp32 either way.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from distlaunch.engine.parallel.buckets import Reduction
from distlaunch.engine.parallel.hooks import register_weak_hook
from distlaunch.engine.parallel.units import tune_unit, unit_groups
from distlaunch.engine.parallel.vocab import shard_vocab_tables
from distlaunch.engine.parallel.wire import all_reduce_bucket
from distlaunch.engine.precision import dtype
from distlaunch.training.precision import reduce_dtype_name

if TYPE_CHECKING:
    from distlaunch.engine.optim import AdamW

OptimizerFactory = Callable[[list[tuple[nn.Parameter, bool]]], "AdamW"]


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor, or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def tp_sharded(param: torch.Tensor) -> bool:
    """Whether ``param`` is split over the tp mesh dim (else every tp rank holds all of it)."""
    if not isinstance(param, DTensor):
        return False
    names = param.device_mesh.mesh_dim_names or ()
    return any(n == "tp" and isinstance(pl, Shard) for n, pl in zip(names, param.placements, strict=False))


def align_grad(param: torch.Tensor) -> None:
    """Give a DTensor parameter's gradient the parameter's own placements.

    DTensor's embedding backward returns a *replicated* gradient for the vocab-sharded
    embedding; keeping it would store the whole table's gradient on every tp rank and break the
    one-shard-per-rank view ZeRO and the gradient norm rely on. Replicate -> Shard is a local
    slice, no communication.
    """
    grad = param.grad
    if isinstance(grad, DTensor) and grad.placements != param.placements:
        param.grad = grad.redistribute(param.device_mesh, param.placements)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: gathers a DTensor over its mesh (a collective), else returns it."""
    return t.full_tensor() if isinstance(t, DTensor) else t


@torch.no_grad()
def cast_parameters(params: list[nn.Parameter], dtype_: torch.dtype) -> None:
    """Cast every parameter to ``dtype_`` in place, keeping each ``Parameter`` object (the
    modules, tp's DTensor wrappers and the strategy keep referring to it). Swapped, as
    ``Module.to`` does for DTensors: ``.data =`` would leave a DTensor's local tensor fp32.
    Called before any gradient hook is registered on them."""
    for p in params:
        if p.dtype != dtype_:
            torch.utils.swap_tensors(p, nn.Parameter(p.detach().to(dtype_), requires_grad=p.requires_grad))


class Fp32Gradients:
    """Where a strategy reads a parameter's gradient: ``param.grad`` itself (fp32 parameters), or,
    for 16-bit parameters, an fp32 accumulator.

    With 16-bit parameters a post-accumulate-grad hook (registered before the reducer's, so it
    runs first) adds each backward's 16-bit gradient into the fp32 accumulator and drops it:
    summing micro-batches and rounds in 16 bits would lose the small contributions, and only
    one parameter's 16-bit gradient exists at a time.
    """

    def __init__(self, params: list[nn.Parameter], accumulate: bool):
        self.accumulate = accumulate
        self.acc: dict[nn.Parameter, torch.Tensor] = {}
        if accumulate:
            for p in params:
                register_weak_hook(p, self._add)

    @torch.no_grad()
    def _add(self, param: nn.Parameter) -> None:
        align_grad(param)
        grad, param.grad = param.grad, None
        acc = self.acc.get(param)
        if acc is None:
            self.acc[param] = grad.float()
        else:
            acc.add_(grad)

    def get(self, param: nn.Parameter) -> torch.Tensor | None:
        """The fp32 gradient of ``param`` so far (None: no backward reached it)."""
        return self.acc.get(param) if self.accumulate else param.grad

    def drop(self, param: nn.Parameter) -> None:
        """Free ``param``'s full-size gradient (ZeRO-2, once it is in a send buffer)."""
        if self.accumulate:
            self.acc.pop(param, None)
        else:
            param.grad = None

    def clear(self) -> None:
        self.acc = {}


class DataParallelBase:
    """What every ZeRO stage shares: parameters by name, the dp group, the optimizer."""

    zero: int = 0
    # the loss rides in the gradient reduction, after which every dp rank holds the whole averaged
    # gradient: no collective of its own for the loss, and the gradient norm is local (plain dp)
    carries_loss: bool = False

    def __init__(self, named_params: list[tuple[str, nn.Parameter]], dp_mesh: DeviceMesh, tp: int):
        self.named_params = named_params
        self.dp_mesh = dp_mesh
        self.dp = dp_mesh.size()
        self.tp = tp
        self.optimizer: AdamW
        self.grads = Fp32Gradients(self.params, accumulate=False)
        # fp32 copies the optimizer updates, when the parameters are 16-bit: whole (ZeRO-0) or
        # this rank's slices (ZeRO-1/2); none when the parameters are their own master weights
        self.masters: list[torch.Tensor] = []

    def _hold_parameters_in(self, param_dtype: torch.dtype) -> None:
        """Cast the parameters to ``param_dtype`` (after the fp32 masters were copied from them);
        16-bit parameters get their gradients accumulated in fp32. Before any reducer hook, so
        the fp32 accumulator is filled first."""
        cast_parameters(self.params, param_dtype)
        self.grads = Fp32Gradients(self.params, accumulate=param_dtype != torch.float32)

    @property
    def master_weights(self) -> bool:
        """Whether the optimizer updates fp32 copies instead of the (16-bit) parameters."""
        return bool(self.masters)

    @property
    def params(self) -> list[nn.Parameter]:
        return [p for _, p in self.named_params]

    def sync_grads(self, loss: torch.Tensor | None = None) -> None:
        """Make the gradients the dp average (after the last micro-batch's backward); with
        ``carries_loss``, ``loss`` (a scalar) too, in place."""

    def step(self) -> None:
        """Apply the optimizer."""
        self.optimizer.step()

    def zero_grad(self) -> None:
        """Drop the gradients (called at the start of a step, so they stay measurable after it)."""
        self.optimizer.zero_grad()
        for p in self.params:
            p.grad = None

    def grad_pieces(self) -> Iterable[tuple[torch.Tensor, float]]:
        """(local gradient, weight) pairs: weight 1/copies, so summing weighted squares over the
        whole world counts every gradient element exactly once."""
        for p in self.params:
            grad = self.grads.get(p)
            if grad is not None:
                copies = (1 if tp_sharded(p) else self.tp) * self._dp_copies()
                yield local(grad), 1.0 / copies

    def _dp_copies(self) -> int:
        return self.dp

    def state_tensors(self) -> dict[str, list[torch.Tensor]]:
        """Local tensors of parameters, gradients and optimizer state (for memory accounting)."""
        opt = [local(v) for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        opt += [local(m) for m in self.masters]  # fp32 master weights count as optimizer state
        grads = [local(g) for g in map(self.grads.get, self.params) if g is not None]
        return {"params": [local(p) for p in self.params], "grads": grads, "optimizer": opt}

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Name -> whole gradient of every parameter this rank holds (collective over tp/dp)."""
        grads = {name: self.grads.get(p) for name, p in self.named_params}
        return {name: full_tensor(g) for name, g in grads.items() if g is not None}


class ReplicatedDP(DataParallelBase):
    """zero=0: replicated state, gradients averaged by bucketed all-reduces launched from backward.

    ``param_dtype`` 16-bit: an fp32 master copy of every parameter, updated by the optimizer and
    copied into the parameter after each step. ``reduce_dtype`` 16-bit: each bucket is all-reduced
    in it; the scalars that ride along (the loss) take their own fp32 all-reduce beside the last
    bucket's, since 8 bits of mantissa would blur the reported loss."""

    zero = 0

    def __init__(
        self,
        named_params,
        dp_mesh,
        tp,
        make_optimizer: OptimizerFactory,
        reduction: Reduction | None = None,
        groups: list[list[nn.Parameter]] | None = None,
        carry_loss: bool = False,
        param_dtype: torch.dtype = torch.float32,
        reduce_dtype: torch.dtype = torch.float32,
    ):
        super().__init__(named_params, dp_mesh, tp)
        self.reduce_dtype = reduce_dtype
        self.carries_loss = carry_loss
        low = param_dtype != torch.float32
        # the masters are taken from the fp32 values before the cast, so they start exact
        self.master_of = {p: nn.Parameter(p.detach().float().clone()) for p in self.params} if low else {}
        self.masters = list(self.master_of.values())
        self.optimizer = make_optimizer([(self.master_of.get(p, p), p.ndim >= 2) for p in self.params])
        self._hold_parameters_in(param_dtype)
        self.reducer = None
        if self.dp > 1:  # groups: one per pipeline chunk (a bucket never spans two)
            reduction = reduction or Reduction()
            self.reducer = reduction.reducer(
                groups or [self.params], self._launch, hold_last=carry_loss, grad_of=self.grads.get
            )

    def _launch(self, params: list[nn.Parameter], extra: list[torch.Tensor]):
        for p in params:
            align_grad(p)
        grads = [local(g) for g in map(self.grads.get, params) if g is not None]
        return all_reduce_bucket(grads, extra, self.reduce_dtype, self.dp_mesh.get_group(), self.dp)

    def zero_grad(self) -> None:
        if self.reducer is not None:
            self.reducer.reset()
        self.grads.clear()
        super().zero_grad()

    def step(self) -> None:
        self.optimizer.step()
        if self.master_of:  # the updated fp32 masters, rounded into the parameters: one fused copy
            with torch.no_grad():
                torch._foreach_copy_([local(p) for p in self.master_of], [local(m) for m in self.master_of.values()])

    def sync_grads(self, loss: torch.Tensor | None = None) -> None:
        """Wait for the bucket all-reduces (launching any a hook did not); ``loss`` (a scalar) is
        dp-averaged in place too, riding in the last bucket, so the step needs no separate
        collective for it."""
        if self.reducer is None:
            for p in self.params:
                align_grad(p)
        else:
            self.reducer.finish([loss] if loss is not None and self.carries_loss else [])
        for p, master in self.master_of.items():
            master.grad = self.grads.get(p)  # the fp32 accumulator, reduced in place


def mixed_precision_policy(precision: str, reduce_dtype: str | None = None) -> MixedPrecisionPolicy:
    """ZeRO-3's precision: with bf16/fp16 every unit all-gathers 16-bit parameters (half the
    bytes of the all-gather and of the unsharded block) and computes in them, while the sharded
    fp32 parameters stay the master weights the optimizer updates. Gradients are reduce-scattered
    in ``train.reduce_dtype`` (``reduce_dtype_name``: bf16 when training in bf16) and land in the
    fp32 shards."""
    reduce = dtype(reduce_dtype_name(precision, reduce_dtype))
    if precision == "fp32" and reduce == torch.float32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=None if precision == "fp32" else dtype(precision), reduce_dtype=reduce)


def shard_fully(
    chunks: list[nn.Module],
    dp_mesh: DeviceMesh,
    precision: str = "fp32",
    reduce_dtype: str | None = None,
    vocab_over_dp: bool = False,
) -> None:
    """ZeRO-3: ``fully_shard`` (FSDP2) every block, the embeddings, the head with the final norm
    (``parallel/units.py``), then every chunk, so only one unit's parameters are unsharded at a
    time. ``vocab_over_dp`` (``dims.shards_vocab_over_dp``): the token embedding and the head
    become ``vocab.ShardedTokenEmbedding`` and ``vocab.ShardedHead`` instead, which FSDP leaves
    alone. Applied to the model while it is still on the meta device, before ``materialize``."""
    mp_policy = mixed_precision_policy(precision, reduce_dtype)
    # with tp the head returns its vocab shard of the logits as a view (DTensor.to_local);
    # the loss only reads it out of place, so FSDP's in-place warning does not apply
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    for chunk in chunks:
        ignored = shard_vocab_tables(chunk, dp_mesh, dtype(precision)) if vocab_over_dp else set()
        for modules in [[b] for b in chunk.blocks.values()] + unit_groups(chunk):
            # the head runs last in forward and first in backward: kept unsharded in between
            fully_shard(modules, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=modules[0] is not chunk.head)
            tune_unit(modules[0], dp_mesh)
        fully_shard(chunk, mesh=dp_mesh, mp_policy=mp_policy, ignored_params=ignored)


class FullyShardedDP(DataParallelBase):
    """zero=3: chunks sharded by ``shard_fully``; FSDP2 reduce-scatters the gradients, and the
    optimizer holds Adam state for this rank's shards only."""

    zero = 3

    def __init__(self, chunks: list[nn.Module], dp_mesh, tp, make_optimizer: OptimizerFactory):
        named = [(n, p) for chunk in chunks for n, p in chunk.named_parameters()]
        super().__init__(named, dp_mesh, tp)
        self.optimizer = make_optimizer([(p, p.ndim >= 2) for p in self.params])

    def _dp_copies(self) -> int:
        return 1  # each dp rank holds a distinct shard (zero padding adds nothing to the norm)

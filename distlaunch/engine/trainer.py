"""The parallel engine: build the model on a (pp, dp, tp) mesh and run training steps.

Parallelism is applied to the built model in a fixed order, each step one small function:

1. the whole model on the meta device (shapes only), of which this pp rank keeps its stage(s)
   (``split_pipeline``),
2. tensor parallel: shard the stage's weights over the tp group (``apply_tp``),
3. ``train.compile`` (``torch.compile`` per block), then activation checkpointing
   (``train.activation_checkpointing``) around each compiled block,
4. ZeRO-3 only: ``fully_shard`` every block and the stage over the dp group (``shard_fully``;
   the token embedding and the head sharded by rows instead where ``shards_vocab_over_dp``:
   ``parallel/vocab.py``),
5. ``materialize``: allocate this rank's shards on the device and fill each with its slice of
   the parameter's initial value (from seed and name, identical in any layout); no rank ever
   holds more than its shards plus one whole parameter,
6. the ZeRO stage's strategy over the dp group, which also builds the optimizer
   (``build_data_parallel``); ZeRO-0/1/2 reduce gradients in buckets launched from backward
   (``parallel/buckets.py``). bf16 with ZeRO-0/1/2: the strategy takes fp32 master copies of
   the parameters, then casts them to bf16 (``precision.model_dtype``).

A step (``train_step``): ``grad_accum_steps`` forward/backward rounds under autocast, one
gradient sync, one all-reduce for the loss and the global gradient norm (with plain data
parallelism the loss rides in the gradient all-reduce and the norm is local), then
``apply_update``: unscale (fp16), clip, optimizer step, loss-scale and learning-rate updates.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from distlaunch.data.source import DataIdentity
from distlaunch.engine.checkpoint.state import OptimizerHyperparams, ScheduleStep, TrainState
from distlaunch.engine.compute import waiting
from distlaunch.engine.data import build_samplers, to_device
from distlaunch.engine.memory import device_peak_bytes, peak_rss_bytes, return_freed_host_memory, storage_bytes
from distlaunch.engine.model import GPT, GPTConfig
from distlaunch.engine.optim import (
    CLIP_EPS,
    build_scheduler,
    clip_coefficient,
    make_optimizer_factory,
    scale_gradients,
    weighted_sq_norm,
)
from distlaunch.engine.parallel.activation import apply_activation_checkpointing
from distlaunch.engine.parallel.buckets import Reduction
from distlaunch.engine.parallel.compile import apply_compile, compile_enabled
from distlaunch.engine.parallel.data import DataParallelBase, FullyShardedDP, ReplicatedDP, shard_fully
from distlaunch.engine.parallel.materialize import materialize
from distlaunch.engine.parallel.pipeline import build_schedule, split_pipeline
from distlaunch.engine.parallel.tensor import apply_tp, cross_entropy, loss_context, loss_value
from distlaunch.engine.parallel.zero import ShardedDP
from distlaunch.engine.precision import (
    DynamicLossScaler,
    apply_tf32,
    autocast,
    dtype,
    model_dtype,
)
from distlaunch.training.config import TrainingConfig, TrainSection
from distlaunch.training.dims import ParallelDims, shards_vocab_over_dp
from distlaunch.training.precision import reduce_dtype_name
from distlaunch.training.presets import model_config


@dataclass(frozen=True)
class StepResult:
    """What one step produced, already reduced over the whole job (same on every rank).

    The loss and the gradient norm stay on the device (``loss_t``, ``grad_norm_t``) so a step does
    not wait for the device; reading ``loss`` or ``grad_norm`` synchronises. The loop reads them
    once per ``train.log_every`` steps (``read_results``).
    """

    step: int
    loss_t: torch.Tensor
    grad_norm_t: torch.Tensor
    lr: float
    seconds: float
    skipped: bool = False  # fp16: inf/nan gradients, no update (the loss scale was halved)

    @property
    def loss(self) -> float:
        return float(self.loss_t)

    @property
    def grad_norm(self) -> float:
        return float(self.grad_norm_t)


def read_results(results: list[StepResult]) -> list[tuple[float, float]]:
    """(loss, grad_norm) of each result, with one device-to-host copy for all of them."""
    if not results:
        return []
    values = torch.stack([torch.stack([r.loss_t.double(), r.grad_norm_t.double()]) for r in results])
    return [(loss, norm) for loss, norm in values.tolist()]


def build_chunks(model_cfg: GPTConfig, dims: ParallelDims, pp_rank: int) -> list[GPT]:
    """This pp rank's model chunks, on the meta device (no memory yet: see ``materialize``)."""
    with torch.device("meta"):
        return split_pipeline(GPT(model_cfg), pp_rank, dims)


def build_data_parallel(
    chunks: list[GPT], dims: ParallelDims, dp_mesh: DeviceMesh, make_optimizer, train: TrainSection
) -> DataParallelBase:
    """The ZeRO stage's strategy (which also owns the optimizer and, for 16-bit parameters, the
    fp32 master weights; it casts the parameters to ``model_dtype``)."""
    if dims.zero == 3:
        return FullyShardedDP(chunks, dp_mesh, dims.tp, make_optimizer)
    param_dtype = model_dtype(train.precision, dims.zero)
    reduce_dtype = dtype(reduce_dtype_name(train.precision, train.reduce_dtype))
    named = [(n, p) for chunk in chunks for n, p in chunk.named_parameters()]
    # every parameter's gradient is accumulated once per backward: micro-batches x rounds a step
    reduction = Reduction(train.bucket_mb, rounds=dims.microbatches * dims.accum_steps)
    groups = [list(chunk.parameters()) for chunk in chunks]
    carry_loss = dims.tp == 1 and dims.pp == 1  # every rank holds a loss: it may ride in the last bucket
    if dims.zero == 0:
        return ReplicatedDP(
            named,
            dp_mesh,
            dims.tp,
            make_optimizer,
            reduction,
            groups,
            carry_loss=carry_loss,
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
        )
    return ShardedDP(
        named, dp_mesh, dims.tp, make_optimizer, dims.zero, reduction, groups, param_dtype, reduce_dtype, carry_loss
    )


class Engine:
    """One rank of a training job: its model chunks, data slice, ZeRO strategy and schedule.

    The whole train state hangs off this object: ``chunks`` (model), ``data_parallel.optimizer``,
    ``scheduler`` (learning rate), ``scaler`` (fp16 loss scale), ``data_position`` (a batch is a
    function of the step number alone, see ``BatchSampler``) and the process's torch RNG.
    """

    def __init__(self, cfg: TrainingConfig, dims: ParallelDims, mesh: DeviceMesh, device: torch.device):
        self.cfg, self.dims, self.mesh, self.device = cfg, dims, mesh, device
        self.model_cfg = model_config(cfg.model.preset, cfg.data.path)  # a prepared dataset sets the vocabulary
        self.pp_rank = mesh["pp"].get_local_rank()
        self.dp_rank = mesh["dp"].get_local_rank()
        self.tp_mesh = mesh["tp"] if dims.tp > 1 else None
        # ZeRO-3 may shard the vocabulary tables over dp instead of gathering them (parallel/vocab.py):
        # the logits are then vocabulary-parallel over dp, as they are over tp with tp
        self.vocab_over_dp = shards_vocab_over_dp(dims, cfg.train.seq_len, self.model_cfg.vocab_size)
        self.vocab_mesh = mesh["dp"] if self.vocab_over_dp else self.tp_mesh
        train = cfg.train
        return_freed_host_memory()  # before the first tensor of the model (memory.py says why)
        self.chunks = build_chunks(self.model_cfg, dims, self.pp_rank)
        for chunk in self.chunks:
            apply_tp(chunk, mesh["tp"])
        apply_tf32(train.tf32, device)  # before compile: Inductor reads it
        if compile_enabled(train.compile, device):
            apply_compile(self.chunks)
        if train.activation_checkpointing:
            apply_activation_checkpointing(self.chunks)
        if dims.zero == 3:
            shard_fully(self.chunks, mesh["dp"], train.precision, train.reduce_dtype, self.vocab_over_dp)
        materialize(self.chunks, device, train.seed)
        make_optimizer = make_optimizer_factory(train.lr, train.weight_decay, (train.beta1, train.beta2))
        self.data_parallel = build_data_parallel(self.chunks, dims, mesh["dp"], make_optimizer, train)
        self.scheduler = build_scheduler(self.data_parallel.optimizer, train)
        self.scaler = DynamicLossScaler(train.precision == "fp16", train.loss_scale)
        # what a checkpoint saves besides model and optimizer tensors (docs/checkpointing.md)
        self.train_state = TrainState()
        self.train_state.register("optimizer_hyperparams", OptimizerHyperparams(self.data_parallel.optimizer))
        self.train_state.register("lr_scheduler", ScheduleStep(self.scheduler))
        self.train_state.register("loss_scaler", self.scaler)
        self.sampler, self.val_sampler, self.data_position = build_samplers(cfg, self.model_cfg.vocab_size)
        self.train_state.register("data_position", self.data_position)
        # plain data parallelism (ZeRO-0; ZeRO-1 on gloo): every rank ends the gradient all-reduce with
        # the whole averaged gradient, so the loss rides in that collective and the gradient norm is local
        self.replicas_only = self.data_parallel.carries_loss
        self.schedule = None
        if dims.pp > 1:
            self.schedule = build_schedule(self.chunks, self.pp_rank, dims, mesh["pp"], device, self._loss_fn)
        # the most this rank held until now, the build included (the summary's init_peak_per_rank)
        self.init_peak = {"rss_bytes": peak_rss_bytes(), "device_bytes": device_peak_bytes(device)}

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.dims.pp - 1

    def _loss_fn(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # divided by the micro-batch count of the whole step, so the accumulated gradient is that
        # of the batch mean; times the fp16 loss scale (1 otherwise). fp32 logits: the softmax
        # of a 16-bit forward is computed in full precision.
        rounds = self.dims.microbatches * self.dims.accum_steps
        loss = cross_entropy(logits.float(), targets, self.vocab_mesh, every_rank=self.vocab_over_dp)
        return loss * (self.scaler.scale / rounds)

    def forward_backward(self, step: int) -> torch.Tensor:
        """Run all micro-batches of ``step``; returns this rank's loss (0 off the last stage),
        already the dp mean with ``replicas_only``."""
        self.data_parallel.zero_grad()
        x, y = self.sampler.local_batch(step, self.dp_rank, self.dims.dp)
        self.data_position.batches = step
        total = self._run_batch(x, y, backward=True)
        self.data_parallel.sync_grads(total)
        return total

    def _run_batch(self, x: torch.Tensor, y: torch.Tensor, backward: bool) -> torch.Tensor:
        """This dp rank's batch in ``accum_steps`` rounds; the (unscaled) mean loss on the last stage."""
        x, y = to_device(x, self.device), to_device(y, self.device)
        total = torch.zeros((), device=self.device)
        precision = self.cfg.train.precision
        with loss_context(self.vocab_mesh):
            for xr, yr in zip(x.chunk(self.dims.accum_steps), y.chunk(self.dims.accum_steps), strict=False):
                if self.schedule is not None:
                    with autocast(precision, self.device):  # forward and backward interleave
                        total += self._pipeline_step(xr, yr, backward)
                    continue
                n = self.dims.microbatches
                for xm, ym in zip(xr.chunk(n), yr.chunk(n), strict=False):
                    with autocast(precision, self.device):
                        loss = self._loss_fn(self.chunks[0](xm), ym)
                    if backward:
                        loss.backward()
                    total += loss_value(loss)
        return total / self.scaler.scale

    def _pipeline_step(self, x: torch.Tensor, y: torch.Tensor, backward: bool = True) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        run = self.schedule.step if backward else self.schedule.eval
        if self.pp_rank == 0:
            run(x)
        elif self.is_last_stage:
            run(target=y, losses=losses)
        else:
            run()
        return sum((loss_value(loss) for loss in losses), torch.zeros((), device=self.device))

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over ``train.eval_batches`` fixed held-out global batches (same on every rank)."""
        total = torch.zeros((), device=self.device, dtype=torch.float64)
        for i in range(1, self.cfg.train.eval_batches + 1):
            x, y = self.val_sampler.local_batch(i, self.dp_rank, self.dims.dp)
            local = self._run_batch(x, y, backward=False)
            if self.is_last_stage:
                total += local.double()
        with waiting():
            dist.all_reduce(total)
        return total.item() / (self.dims.dp * self.dims.tp * self.cfg.train.eval_batches)

    def reduce_loss_and_norm(self, local_loss: torch.Tensor) -> tuple[float, float]:
        """``reduce_loss_and_norm_tensors`` read on the host."""
        loss, norm = self.reduce_loss_and_norm_tensors(local_loss)
        return loss.item(), norm.item()

    def reduce_loss_and_norm_tensors(self, local_loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Job-wide mean loss and global gradient norm as device scalars, in one all-reduce over
        the world (none with ``replicas_only``: the gradient all-reduce already carried the loss)."""
        sq = weighted_sq_norm(list(self.data_parallel.grad_pieces()), self.device)
        if self.replicas_only:
            # the loss was averaged with the gradients; grad_pieces weighs each rank's whole
            # gradient 1/dp (one of dp identical copies), so dp * sq is the job-wide square
            return local_loss.detach(), (sq * self.dims.dp).sqrt()
        # only the last stage's dp*tp ranks hold a loss; all of them hold the same dp-slice mean
        packed = torch.stack([local_loss.double() if self.is_last_stage else sq.new_zeros(()), sq])
        with waiting():  # for the slowest rank: not this rank's compute (compute.py)
            dist.all_reduce(packed)
        return packed[0] / (self.dims.dp * self.dims.tp), packed[1].sqrt()

    def optimizer_step(self) -> None:
        """Optimizer step (and ZeRO-1/2's parameter all-gather)."""
        self.data_parallel.step()

    def apply_update(self, grad_norm: float) -> bool:
        """Unscale, clip to ``train.grad_clip`` and step; False when fp16 found inf/nan (skipped).

        ``grad_norm`` is the job-wide norm of the (unscaled) gradient, identical on every rank,
        so every rank takes the same decision and applies the same coefficient to its pieces.
        """
        found_inf = not math.isfinite(grad_norm)
        if not found_inf:
            factor = clip_coefficient(grad_norm, self.cfg.train.grad_clip) / self.scaler.scale
            scale_gradients(self.data_parallel.grad_pieces(), factor)
            self.optimizer_step()
        self.scaler.update(found_inf)
        self.scheduler.step()  # the rates follow the step number: a skipped step uses up its rate
        return not found_inf

    def train_step(self, step: int) -> StepResult:
        """One full training step, reduced for reporting."""
        start = time.perf_counter()
        lr = self.data_parallel.optimizer.param_groups[0]["lr"]
        local_loss = self.forward_backward(step)
        loss, scaled_norm = self.reduce_loss_and_norm_tensors(local_loss)
        grad_norm = scaled_norm / self.scaler.scale
        if self.scaler.enabled:  # fp16: the skip decision is the host's, so it reads the norm
            applied = self.apply_update(grad_norm.item())
        else:  # fp32 / bf16: the clip coefficient stays on the device, no host sync
            self.apply_update_on_device(grad_norm)
            applied = True
        return StepResult(step, loss, grad_norm, lr, time.perf_counter() - start, skipped=not applied)

    def apply_update_on_device(self, grad_norm: torch.Tensor) -> None:
        """Clip to ``train.grad_clip`` with a device-side coefficient and step (fp32 / bf16)."""
        max_norm = self.cfg.train.grad_clip
        if max_norm > 0:
            factor = (max_norm / (grad_norm + CLIP_EPS)).clamp(max=1.0)
            scale_gradients(self.data_parallel.grad_pieces(), factor)
        self.optimizer_step()
        self.scheduler.step()

    def data_identity(self) -> DataIdentity:
        """What this job trains on, as a checkpoint's ``meta.json`` records it."""
        return DataIdentity(
            fingerprint=self.data_position.fingerprint, path=self.cfg.data.path, vocab_size=self.model_cfg.vocab_size
        )

    def state_bytes(self) -> dict[str, int]:
        """This rank's parameter / gradient / optimizer-state bytes, measured from storages."""
        return storage_bytes(self.data_parallel.state_tensors())

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Whole gradients of this rank's parameters by name (collective over tp and dp)."""
        return {k: v.detach().cpu() for k, v in self.data_parallel.full_gradients().items()}

"""The parallel engine: build the model on a (pp, dp, tp) mesh and run training steps.

Parallelism is applied to the built model in a fixed order, each step one small function:

1. pipeline split: this pp rank keeps its stage(s) (``split_pipeline``); the model is built on
   the meta device first, so a rank only ever allocates its own stage,
2. weights: every parameter initialised from (seed, name), identical in any layout,
3. tensor parallel: shard the stage's weights over the tp group (``apply_tp``),
4. activation checkpointing (``train.activation_checkpointing``),
5. ZeRO / FSDP over the dp group, which also builds the optimizer (``build_data_parallel``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from distlaunch.engine.config import TrainingConfig
from distlaunch.engine.data import BatchSampler, load_tokens
from distlaunch.engine.memory import storage_bytes
from distlaunch.engine.model import GPT, PRESETS, GPTConfig, init_weights
from distlaunch.engine.parallel.activation import apply_activation_checkpointing
from distlaunch.engine.parallel.data import DataParallelBase, FullyShardedDP, ReplicatedDP
from distlaunch.engine.parallel.dims import ParallelDims
from distlaunch.engine.parallel.pipeline import build_schedule, split_pipeline
from distlaunch.engine.parallel.tensor import apply_tp, cross_entropy, loss_context, loss_value
from distlaunch.engine.parallel.zero import ShardedDP


@dataclass(frozen=True)
class StepResult:
    """What one step produced, already reduced over the whole job (same on every rank)."""

    step: int
    loss: float
    grad_norm: float
    lr: float
    seconds: float


def make_optimizer_factory(lr: float, weight_decay: float):
    """AdamW with weight decay on matrices only (not on norms); takes (param, decay) pairs."""

    def make(params: list[tuple[torch.nn.Parameter, bool]]) -> torch.optim.Optimizer:
        groups = [
            {"params": [p for p, decay in params if decay], "weight_decay": weight_decay},
            {"params": [p for p, decay in params if not decay], "weight_decay": 0.0},
        ]
        # foreach=False: the same per-tensor kernels whether a tensor is whole, a DTensor or a
        # ZeRO slice, which keeps every layout bit-compatible with the single-process update
        return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, foreach=False)

    return make


def build_chunks(model_cfg: GPTConfig, dims: ParallelDims, pp_rank: int, seed: int, device) -> list[GPT]:
    """This pp rank's model chunks with their weights initialised on ``device``."""
    with torch.device("meta"):
        full = GPT(model_cfg)
    chunks = split_pipeline(full, pp_rank, dims)
    for chunk in chunks:
        chunk.to_empty(device=device)
        init_weights(chunk, seed)
    return chunks


def build_data_parallel(chunks: list[GPT], dims: ParallelDims, dp_mesh: DeviceMesh, make_optimizer) -> DataParallelBase:
    """The ZeRO stage's strategy (which also owns the optimizer)."""
    if dims.zero == 3:
        return FullyShardedDP(chunks, dp_mesh, dims.tp, make_optimizer)
    named = [(n, p) for chunk in chunks for n, p in chunk.named_parameters()]
    if dims.zero == 0:
        return ReplicatedDP(named, dp_mesh, dims.tp, make_optimizer)
    return ShardedDP(named, dp_mesh, dims.tp, make_optimizer, zero=dims.zero)


class Engine:
    """One rank of a training job: its model chunks, data slice, ZeRO strategy and schedule."""

    def __init__(self, cfg: TrainingConfig, dims: ParallelDims, mesh: DeviceMesh, device: torch.device):
        self.cfg, self.dims, self.mesh, self.device = cfg, dims, mesh, device
        self.model_cfg = PRESETS[cfg.model.preset]
        self.pp_rank = mesh["pp"].get_local_rank()
        self.dp_rank = mesh["dp"].get_local_rank()
        self.tp_mesh = mesh["tp"] if dims.tp > 1 else None
        self.chunks = build_chunks(self.model_cfg, dims, self.pp_rank, cfg.train.seed, device)
        for chunk in self.chunks:
            apply_tp(chunk, mesh["tp"])
        if cfg.train.activation_checkpointing:
            apply_activation_checkpointing(self.chunks)
        make_optimizer = make_optimizer_factory(cfg.train.lr, cfg.train.weight_decay)
        self.data_parallel = build_data_parallel(self.chunks, dims, mesh["dp"], make_optimizer)
        self.schedule = None
        if dims.pp > 1:
            self.schedule = build_schedule(self.chunks, self.pp_rank, dims, mesh["pp"], device, self._loss_fn)
        tokens = load_tokens(cfg.data.path)
        self.sampler = BatchSampler(tokens, cfg.train.seq_len, cfg.train.global_batch_size, cfg.train.seed)

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.dims.pp - 1

    def _loss_fn(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # divided by the micro-batch count so the accumulated gradient is that of the batch mean
        return cross_entropy(logits, targets, self.tp_mesh) / self.dims.microbatches

    def forward_backward(self, step: int) -> torch.Tensor:
        """Run all micro-batches of ``step``; returns this rank's loss (0 off the last stage)."""
        self.data_parallel.zero_grad()
        x, y = self.sampler.local_batch(step, self.dp_rank, self.dims.dp)
        x, y = x.to(self.device), y.to(self.device)
        total = torch.zeros((), device=self.device)
        with loss_context(self.tp_mesh):
            if self.schedule is None:
                n = self.dims.microbatches
                for xm, ym in zip(x.chunk(n), y.chunk(n)):
                    loss = self._loss_fn(self.chunks[0](xm), ym)
                    loss.backward()
                    total += loss_value(loss)
            else:
                total += self._pipeline_step(x, y)
        self.data_parallel.sync_grads()
        return total

    def _pipeline_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        if self.pp_rank == 0:
            self.schedule.step(x)
        elif self.is_last_stage:
            self.schedule.step(target=y, losses=losses)
        else:
            self.schedule.step()
        return sum((loss_value(l) for l in losses), torch.zeros((), device=self.device))

    def reduce_loss_and_norm(self, local_loss: torch.Tensor) -> tuple[float, float]:
        """Job-wide mean loss and global gradient norm, in one all-reduce over the world."""
        sq = torch.zeros((), device=self.device, dtype=torch.float64)
        for grad, weight in self.data_parallel.grad_pieces():
            sq += weight * grad.detach().double().pow(2).sum()
        # only the last stage's dp*tp ranks hold a loss; all of them hold the same dp-slice mean
        packed = torch.stack([local_loss.double() if self.is_last_stage else sq.new_zeros(()), sq])
        dist.all_reduce(packed)
        return packed[0].item() / (self.dims.dp * self.dims.tp), packed[1].sqrt().item()

    def optimizer_step(self) -> None:
        """Optimizer step (and ZeRO-1/2's parameter all-gather)."""
        self.data_parallel.step()

    def train_step(self, step: int) -> StepResult:
        """One full training step, reduced for reporting."""
        start = time.perf_counter()
        local_loss = self.forward_backward(step)
        loss, grad_norm = self.reduce_loss_and_norm(local_loss)
        self.optimizer_step()
        lr = self.data_parallel.optimizer.param_groups[0]["lr"]
        return StepResult(step, loss, grad_norm, lr, time.perf_counter() - start)

    def state_bytes(self) -> dict[str, int]:
        """This rank's parameter / gradient / optimizer-state bytes, measured from storages."""
        return storage_bytes(self.data_parallel.state_tensors())

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Whole gradients of this rank's parameters by name (collective over tp and dp)."""
        return {k: v.detach().cpu() for k, v in self.data_parallel.full_gradients().items()}

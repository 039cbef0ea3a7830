"""AdamW, the warmup + cosine learning-rate schedule, and global-norm gradient clipping.

``AdamW`` is torch's fused AdamW update (``torch._fused_adamw_``, the kernel
``torch.optim.AdamW(fused=True)`` runs) with the same state, without ``torch.optim.Optimizer``
around it: that class imports torch._dynamo on its first call (its methods are wrapped to keep
compilers out), some 2 s of CPU at every rank's start, where the engine needs none of what the
wrapper is for. ``LRSchedule`` is likewise the little of ``LambdaLR`` the engine uses.

Clipping needs the norm of the *whole* gradient, which no single rank holds under tp, pp or
ZeRO. The trainer computes it with one all-reduce over the world from each strategy's
``grad_pieces`` (every element counted once; with plain data parallelism every rank already
holds the whole averaged gradient and needs none), and every rank then multiplies its own pieces
by the same coefficient, so the clipped update equals the single-process one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor

from distlaunch.training.config import TrainSection

CLIP_EPS = 1e-6  # as torch.nn.utils.clip_grad_norm_, so a single process matches it exactly


class AdamW:
    """AdamW over parameter groups, as ``torch.optim.AdamW(groups, lr, betas, fused=True)``: the
    same update, bit for bit, and the same ``param_groups`` and ``state`` (per parameter: ``step``,
    ``exp_avg``, ``exp_avg_sq``), which checkpoints save under single-process names."""

    def __init__(self, groups: list[dict], lr: float, betas: tuple[float, float], eps: float = 1e-8):
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0}  # a group may set its own
        self.param_groups = [defaults | group | {"params": list(group["params"])} for group in groups]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            # one kernel call per (device, dtype), as torch groups them
            batches: dict[tuple, tuple[list, ...]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state.get(p)
                if state is None:
                    state = self.state[p] = {
                        "step": torch.zeros((), dtype=torch.float32, device=p.device),
                        "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                    }
                values = (p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"])
                for kept, value in zip(
                    batches.setdefault((p.device, p.dtype), ([], [], [], [], [])), values, strict=True
                ):
                    kept.append(value)
            beta1, beta2 = group["betas"]
            for params, grads, exp_avgs, exp_avg_sqs, steps in batches.values():
                torch._foreach_add_(steps, 1)
                torch._fused_adamw_(
                    params, grads, exp_avgs, exp_avg_sqs, [], steps,
                    amsgrad=False, lr=group["lr"], beta1=beta1, beta2=beta2,
                    weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
                )  # fmt: skip

    def zero_grad(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None


class LRSchedule:
    """The learning rate of every group as ``train.lr`` times ``lr_factor``: ``last_epoch`` e (the
    steps taken) sets the rate of step e+1, as a ``LambdaLR`` stepped once after every step does."""

    def __init__(self, optimizer: AdamW, train: TrainSection):
        self.optimizer, self.train = optimizer, train
        # each group's base rate, under LambdaLR's key (checkpoints keep it with the rate)
        self.base_lrs = [group.setdefault("initial_lr", group["lr"]) for group in optimizer.param_groups]
        self.last_epoch = -1
        self.step()

    def step(self) -> None:
        self.last_epoch += 1
        self.set_rates()

    def set_rates(self) -> None:
        factor = lr_factor(self.last_epoch + 1, self.train)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * factor


def make_optimizer_factory(lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.999)):
    """AdamW with weight decay on matrices only (not on norms); takes (param, decay) pairs."""

    def make(params: list[tuple[torch.nn.Parameter, bool]]) -> AdamW:
        # fused=True: the whole Adam update of a group in one kernel pass, on GPUs and CPUs alike
        # (bench/adamw_step.py: on one CPU thread 2.5x faster than foreach=True, which runs one
        # multi-tensor kernel per Adam operation, for the tiny GPT and 6.3x for small). Every
        # operation is elementwise, so a shard's update is the whole tensor's, restricted to the
        # shard, whether a tensor is whole, a DTensor or a ZeRO slice. A group may not mix
        # DTensors with plain tensors (tp leaves norms and the position embedding plain), hence
        # a group per (decay, kind).
        groups = []
        for decay in (True, False):
            for dtensor in (True, False):
                members = [p for p, d in params if d == decay and isinstance(p, DTensor) == dtensor]
                if members:
                    groups.append({"params": members, "weight_decay": weight_decay if decay else 0.0})
        return AdamW(groups, lr=lr, betas=betas)

    return make


def lr_factor(step: int, train: TrainSection) -> float:
    """Multiplier of ``train.lr`` for 1-based ``step``: linear warmup, then cosine or constant."""
    if step <= train.warmup_steps:
        return step / train.warmup_steps
    if train.lr_schedule == "constant":
        return 1.0
    min_ratio = (train.lr / 10 if train.min_lr is None else train.min_lr) / train.lr
    # the first step after warmup runs at lr, the last one (train.steps) at min_lr
    decay_steps = max(1, train.steps - train.warmup_steps - 1)
    progress = min(1.0, (step - train.warmup_steps - 1) / decay_steps)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: AdamW, train: TrainSection) -> LRSchedule:
    """The schedule, stepped once after every step."""
    return LRSchedule(optimizer, train)


def clip_coefficient(grad_norm: float, max_norm: float) -> float:
    """The factor that brings ``grad_norm`` down to ``max_norm`` (1 when below it or clipping is off)."""
    if max_norm <= 0:
        return 1.0
    return min(1.0, max_norm / (grad_norm + CLIP_EPS))


@torch.no_grad()
def weighted_sq_norm(pieces: list[tuple[torch.Tensor, float]], device: torch.device) -> torch.Tensor:
    """Sum of ``weight * ||grad||^2`` over the pieces, as a float64 scalar on ``device``.

    One fused kernel per weight for the per-piece norms (``_foreach_norm``, as ``clip_grad_norm_``)
    instead of a Python loop of small ops per tensor; squares and weights are summed in float64.
    The weights (a handful of distinct values) multiply as Python numbers: a tensor of them would
    be a host-to-device copy, which on a GPU waits for the device every step.
    """
    by_weight: dict[float, list[torch.Tensor]] = {}
    for grad, weight in pieces:
        by_weight.setdefault(weight, []).append(grad.detach())
    total = torch.zeros((), device=device, dtype=torch.float64)
    for weight, grads in by_weight.items():
        norms = torch.stack(torch._foreach_norm(grads)).double()
        total += norms.square().sum().to(device) * weight
    return total


@torch.no_grad()
def scale_gradients(pieces: Iterable[tuple[torch.Tensor, float]], factor: float | torch.Tensor) -> None:
    """Multiply every local gradient piece in place (each rank scales exactly what it optimises).

    ``factor`` may be a device scalar (the clip coefficient computed without a host sync)."""
    if isinstance(factor, float) and factor == 1.0:
        return
    # the local storage of DTensor pieces, so the list is plain tensors (foreach may not mix them)
    grads = [grad._local_tensor if isinstance(grad, DTensor) else grad for grad, _ in pieces]
    if not grads:
        return
    if isinstance(factor, torch.Tensor):
        factor = factor.to(grads[0].device, torch.float32)
    torch._foreach_mul_(grads, factor)  # one fused call, not one small op per tensor

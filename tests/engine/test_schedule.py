"""The learning rate per step, as the trainer's scheduler sets it on a real optimizer: linear warmup to
``train.lr``, then a cosine from ``train.lr`` at the first step after warmup down to ``min_lr`` at the
last step (docs/train.md), or constant."""

from __future__ import annotations

import math

import pytest
import torch

from distlaunch.engine.optim import build_scheduler
from distlaunch.training.config import TrainSection


def rates(train: TrainSection) -> list[float]:
    """The rate each step 1..train.steps runs with (the scheduler steps once after every step)."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=train.lr)
    scheduler = build_scheduler(optimizer, train)
    seen = []
    for _ in range(train.steps):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return seen


@pytest.mark.parametrize(("steps", "warmup"), [(8, 2), (200, 10), (5, 0), (3, 1)])
def test_cosine_runs_from_lr_after_warmup_to_min_lr_at_the_last_step(steps, warmup):
    lr = 3e-3
    seen = rates(TrainSection(steps=steps, warmup_steps=warmup, lr=lr))
    assert seen[:warmup] == pytest.approx([lr * (s + 1) / warmup for s in range(warmup)])
    assert seen[warmup] == pytest.approx(lr)
    assert seen[-1] == pytest.approx(lr / 10)  # min_lr's default
    assert all(a >= b for a, b in zip(seen[warmup:], seen[warmup + 1 :], strict=False))
    middle = warmup + (steps - warmup - 1) / 2  # 0-based step halfway down the cosine
    if middle == int(middle):
        assert seen[int(middle)] == pytest.approx(lr / 10 + (lr - lr / 10) * 0.5 * (1 + math.cos(math.pi / 2)))


def test_min_lr_is_where_the_cosine_ends_and_constant_stays_at_lr():
    assert rates(TrainSection(steps=6, warmup_steps=0, lr=1e-3, min_lr=0.0))[-1] == pytest.approx(0.0, abs=1e-12)
    assert rates(TrainSection(steps=6, warmup_steps=2, lr=1e-3, lr_schedule="constant"))[2:] == pytest.approx(
        [1e-3] * 4
    )

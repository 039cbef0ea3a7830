"""The small, layout-free parts of the training state: registered extras and per-rank RNG.

``TrainState`` is where anything with ``state_dict`` / ``load_state_dict`` (an LR scheduler, a
loss scaler, the optimizer's schedule-driven hyperparameters) registers under a name; the
checkpoint saves and restores every registered part without knowing what it is. The model and the
optimizer's tensors are layout-dependent and handled by ``distlaunch.engine.checkpoint.shards``.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from distlaunch.engine.optim import AdamW, LRSchedule

# per-group optimizer settings an LR schedule changes between steps (the rest comes from the config)
SCHEDULED_KEYS = ("lr", "initial_lr")


class Stateful(Protocol):
    """Anything the checkpoint can save and restore."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class TrainState:
    """Named stateful parts of training besides model and optimizer tensors."""

    def __init__(self) -> None:
        self.parts: dict[str, Stateful] = {}

    def register(self, name: str, part: Stateful) -> None:
        """Save ``part`` in every checkpoint under ``name`` and restore it on resume."""
        if name in self.parts:
            raise ValueError(f"train state part {name!r} registered twice")
        self.parts[name] = part


class OptimizerHyperparams:
    """The optimizer's per-group learning rate, which an LR schedule moves (not its tensors).

    Restored per group index; the number of groups may differ between layouts (tp adds a group per
    kind of tensor), which is harmless because one schedule moves every group alike.
    """

    def __init__(self, optimizer: AdamW):
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        groups = [{k: g[k] for k in SCHEDULED_KEYS if k in g} for g in self.optimizer.param_groups]
        return {"param_groups": groups}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["param_groups"]
        for i, group in enumerate(self.optimizer.param_groups):
            group.update(saved[min(i, len(saved) - 1)])


class ScheduleStep:
    """An LR schedule's position. Only the step is saved, never a rate per parameter group: the number
    of groups differs between layouts (the fused update needs DTensors and plain tensors apart). The
    rates follow from the step. The key is the one a ``LambdaLR``'s state has."""

    def __init__(self, scheduler: LRSchedule):
        self.scheduler = scheduler

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.scheduler.last_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.last_epoch = int(state["last_epoch"])
        self.scheduler.set_rates()


def rng_state() -> dict[str, Any]:
    """This process's random generators (torch CPU and CUDA, Python's ``random``)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])

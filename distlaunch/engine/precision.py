"""Mixed precision: autocast for the compute, fp32 for everything that is kept.

bf16 and fp16 use ``torch.autocast``: parameters, gradients and AdamW state stay fp32 (they are
the master weights; nothing is cast and copied back), while matmuls and attention run in the
low precision. fp16 also needs loss scaling: small gradients underflow in fp16, so the loss is
multiplied by a scale before backward and the gradients divided by it before the update.

``DynamicLossScaler`` works with sharded gradients because it never looks at a gradient itself:
the trainer hands it the *global* gradient norm, which is already all-reduced over every group
(tp, pp, dp); a non-finite element anywhere makes that sum non-finite on every rank, so all
ranks skip the same step and shrink the scale together.
"""

from __future__ import annotations

import contextlib

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward pass's autocast context (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])


class DynamicLossScaler:
    """Loss scale for fp16: halve it after a step with inf/nan gradients, double it after
    ``growth_interval`` good steps in a row. Disabled (scale 1) for fp32 and bf16."""

    def __init__(self, enabled: bool, init_scale: float = 2.0**16, growth_interval: int = 2000):
        self.enabled = enabled
        self.scale = init_scale if enabled else 1.0
        self.growth_interval = growth_interval
        self.good_steps = 0
        self.skipped_steps = 0

    def update(self, found_inf: bool) -> None:
        """Adjust the scale after a step; ``found_inf`` must be the same on every rank."""
        if not self.enabled:
            return
        if found_inf:
            self.scale /= 2
            self.good_steps = 0
            self.skipped_steps += 1
            return
        self.good_steps += 1
        if self.good_steps % self.growth_interval == 0:
            self.scale *= 2

    def state_dict(self) -> dict:
        """What a checkpoint needs to resume with the same scale."""
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``'s values."""
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
        self.skipped_steps = int(state["skipped_steps"])

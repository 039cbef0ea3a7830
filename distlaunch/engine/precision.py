"""Mixed precision: which dtype the model holds, autocast for the compute, fp32 for the updates.

``model_dtype_name`` is the one rule for the dtype of the model's own parameters:

- bf16 with ZeRO-0/1/2: the model holds bf16 parameters. The strategy (``parallel/data.py``,
  ``parallel/zero.py``) keeps fp32 master weights for the optimizer (ZeRO-0 a copy of every
  parameter, ZeRO-1/2 of this rank's slice only), accumulates and reduces the gradients in fp32,
  and casts the updated master back into the bf16 parameter after each step (ZeRO-1/2 all-gather
  bf16 slots: half the bytes). Nothing casts a weight per forward.
- bf16/fp16 with ZeRO-3: the sharded fp32 parameters are the master weights; FSDP2 all-gathers
  16-bit copies (``parallel/data.py: mixed_precision_policy``).
- fp16 with ZeRO-0/1/2 and fp32 everywhere: fp32 parameters, which are their own master weights.

``reduce_dtype_name`` is the one rule for what the gradients travel in (``train.reduce_dtype``), for
every ZeRO stage: bf16 when training in bf16 (half the bytes, as Megatron and FSDP choose), else
fp32. Gradients are still accumulated in fp32 and land in fp32; only the collective is 16-bit.

``apply_tf32`` turns TF32 tensor cores for fp32 matmuls on or off (``train.tf32``), on CUDA only.

The forward runs under ``torch.autocast`` for bf16 and fp16 (matmuls and attention in 16 bits,
the loss policy in fp32); with bf16 parameters autocast has no weight to cast. fp16 also needs
loss scaling: small gradients underflow in fp16, so the loss is multiplied by a scale before
backward and the gradients divided by it before the update.

``DynamicLossScaler`` works with sharded gradients because it never looks at a gradient itself:
the trainer hands it the *global* gradient norm, which is already all-reduced over every group
(tp, pp, dp); a non-finite element anywhere makes that sum non-finite on every rank, so all
ranks skip the same step and shrink the scale together.

torch is imported inside the functions. The dtype rules themselves (which dtype, by name) are torch-free, in
``distlaunch.training.precision``, where the memory planner reads them too.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from distlaunch.training.precision import model_dtype_name

if TYPE_CHECKING:
    import torch

# Inductor's (and its attention pass's) advice on every rank of an fp32 CUDA job; moot once the
# user chose either way with train.tf32
TF32_ADVICE = r"TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled"


def dtype(precision: str) -> torch.dtype:
    """The torch dtype of ``fp32`` / ``bf16`` / ``fp16``."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def model_dtype(precision: str, zero: int) -> torch.dtype:
    """``model_dtype_name`` as a torch dtype."""
    return dtype(model_dtype_name(precision, zero))


def apply_tf32(tf32: bool | None, device: torch.device) -> None:
    """``train.tf32`` on a CUDA device: TF32 tensor cores for fp32 matmuls (and cuDNN's convolutions)
    on or off. None (the key left out) keeps fp32 exact and leaves Inductor's advice to say the key
    exists; set either way, the advice is moot and silenced. CPUs have no TF32: nothing is set for a
    CPU device (``set_float32_matmul_precision`` would also switch oneDNN's CPU matmul mode)."""
    if tf32 is None or device.type != "cuda":
        return
    import warnings

    import torch

    # torch's one call for both of its matmul precision APIs (setting one of them alone makes the
    # other raise when read: metrics.peak_flops reads allow_tf32)
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = tf32
    warnings.filterwarnings("ignore", message=TF32_ADVICE)


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward pass's autocast context (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device.type, dtype=dtype(precision))


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

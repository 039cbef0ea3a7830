"""``train.tf32``: TF32 matmuls on CUDA GPUs when set, nothing on CPUs, Inductor's advice silenced when chosen.

No GPU is needed: torch's precision switches and the warning filter are process state that a
``cuda`` device object sets without touching a device.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from distlaunch.engine.precision import TF32_ADVICE, apply_tf32
from distlaunch.errors import UsageError
from distlaunch.training.config import load_config

ADVICE = (
    "TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled. "
    "Consider setting `torch.set_float32_matmul_precision('high')` for better performance."
)


def _switches() -> tuple:
    return (
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )


@pytest.fixture
def restored():
    """torch's switches and the warning filters as they were before the test."""
    before = _switches()
    with warnings.catch_warnings():
        yield
    torch.set_float32_matmul_precision(before[0])
    torch.backends.cudnn.allow_tf32 = before[2]


def test_the_key_is_a_switch_left_unset_by_default():
    assert load_config(None, []).train.tf32 is None
    assert load_config(None, ["train.tf32=true"]).train.tf32 is True
    with pytest.raises(UsageError, match=r"train\.tf32"):
        load_config(None, ["train.tf32='yes'"])


def test_a_cpu_device_changes_nothing(restored):
    before = _switches()
    apply_tf32(True, torch.device("cpu"))
    assert _switches() == before
    assert not any(getattr(f[1], "pattern", None) == TF32_ADVICE for f in warnings.filters)


@pytest.mark.parametrize("tf32", [True, False])
def test_set_either_way_it_applies_and_silences_the_advice(restored, tf32):
    apply_tf32(tf32, torch.device("cuda"))
    assert _switches() == (("high" if tf32 else "highest"), tf32, tf32)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", append=True)  # behind the engine's filter, which must win
        warnings.warn(ADVICE, UserWarning, stacklevel=1)
    assert not seen


def test_left_unset_it_keeps_fp32_exact_and_the_advice(restored):
    before = _switches()
    apply_tf32(None, torch.device("cuda"))
    assert _switches() == before
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", append=True)
        warnings.warn(ADVICE, UserWarning, stacklevel=1)
    assert seen

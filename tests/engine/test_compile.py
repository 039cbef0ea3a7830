"""``train.compile``: every block's forward compiled, the same training as eager.

On CPU the first compiled step costs ~30 s of inductor code generation on this 2-core machine, too
much for the suite: the test checks what distlaunch does (which functions are compiled, what stays the
same), not PyTorch's compiler.
"""

from __future__ import annotations

import pytest
import torch

from distlaunch.engine.model import GPT, PRESETS
from distlaunch.engine.parallel.compile import apply_compile, compile_enabled, is_compiled
from distlaunch.errors import UsageError
from distlaunch.training.config import load_config


def test_compile_setting_is_validated_and_auto_means_cuda_only():
    assert load_config(None, ["train.compile=auto"]).train.compile is None
    assert load_config(None, []).train.compile is None
    assert load_config(None, ["train.compile=true"]).train.compile is True
    with pytest.raises(UsageError, match=r"train\.compile"):
        load_config(None, ["train.compile='sometimes'"])
    assert compile_enabled(None, torch.device("cuda")) is True
    assert compile_enabled(None, torch.device("cpu")) is False
    assert compile_enabled(True, torch.device("cpu")) is True


def test_compile_replaces_every_blocks_forward_and_keeps_parameter_names():
    """Structure only: compiling itself is lazy (the first call pays ~30 s of inductor on this CPU), and the
    numerics are PyTorch's. Measured once: 3 compiled steps equal eager to ~2e-7 (docs/train.md)."""
    model = GPT(PRESETS["tiny"])
    names = [name for name, _ in model.named_parameters()]
    apply_compile([model])
    assert all(is_compiled(block) for block in model.blocks.values())
    assert [name for name, _ in model.named_parameters()] == names  # checkpoints and the tp plan see the same model

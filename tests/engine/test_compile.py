"""``train.compile``: every block's forward compiled, the same training as eager.

One plain process on CPU (inductor's C++ backend): the first step compiles one block graph
(~30 s measured on a shared 2-core machine), the later steps reuse it.
"""

from __future__ import annotations

import pytest
import torch

from distlaunch.engine.config import load_config
from distlaunch.engine.parallel.compile import compile_enabled
from distlaunch.errors import UsageError
from tests.engine.harness import run_layouts
from tests.engine.test_parity import BASE

pytestmark = pytest.mark.timeout(600)


def test_compile_setting_is_validated_and_auto_means_cuda_only():
    assert load_config(None, ["train.compile=auto"]).train.compile is None
    assert load_config(None, []).train.compile is None
    assert load_config(None, ["train.compile=true"]).train.compile is True
    with pytest.raises(UsageError, match=r"train\.compile"):
        load_config(None, ["train.compile='sometimes'"])
    assert compile_enabled(None, torch.device("cuda")) is True
    assert compile_enabled(None, torch.device("cpu")) is False
    assert compile_enabled(True, torch.device("cpu")) is True


def test_compiled_blocks_train_like_eager(tmp_path):
    results = run_layouts(tmp_path, 0, [*BASE, "train.steps=3"], {"eager": [], "compiled": ["train.compile=true"]})
    eager, compiled = results["eager"][0], results["compiled"][0]
    assert eager["compiled_blocks"] == 0
    assert compiled["compiled_blocks"] == 4  # every block of the tiny GPT
    # measured: equal to ~2e-7 (inductor fuses the elementwise ops, so rounding differs slightly)
    for a, b in zip(compiled["losses"], eager["losses"], strict=True):
        assert abs(a - b) <= 1e-5 * abs(b), (compiled["losses"], eager["losses"])
    for name, grad in compiled["grads"].items():
        torch.testing.assert_close(grad, eager["grads"][name], rtol=1e-4, atol=1e-6, msg=name)

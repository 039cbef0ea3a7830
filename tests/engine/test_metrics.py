"""Throughput arithmetic (FLOPs per token, GPU peaks) and when the training loop reads its metrics."""

from __future__ import annotations

import pytest

from distlaunch.engine.loop import read_due
from distlaunch.engine.metrics import flops_per_token, peak_flops_of
from distlaunch.engine.model import PRESETS
from distlaunch.training.config import load_config


@pytest.mark.parametrize(("preset", "seq_len"), [("125m", 1024), ("1.3b", 2048), ("tiny", 256)])
def test_flops_per_token_count_the_multiplying_weights_and_attention_not_the_lookups(preset, seq_len):
    """6 FLOPs per weight that multiplies (per block: wqkv 3d², wo d², fc and proj 4d² each, and
    the biases and weights of two norms; the head and the final norm) plus 12·L·d·T: the
    torchtitan/PaLM count, written out here from the shapes rather than from the model."""
    cfg = PRESETS[preset]
    d, L, v = cfg.d_model, cfg.n_layer, cfg.vocab_size
    per_block = 3 * d * d + d * d + 2 * (cfg.mlp_ratio * d * d) + 4 * d
    multiplying = L * per_block + 2 * d + v * d
    assert flops_per_token(cfg, seq_len) == 6 * multiplying + 12 * L * d * seq_len


@pytest.mark.parametrize(
    ("gpu", "precision", "tf32", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", False, 989e12),
        ("NVIDIA H100 PCIe", "bf16", False, 756e12),
        ("NVIDIA H100 NVL", "fp16", False, 835e12),
        ("NVIDIA H200", "bf16", False, 989e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", False, 312e12),
        ("NVIDIA A100-SXM4-80GB", "fp32", True, 156e12),  # TF32 tensor cores: half the bf16 peak
        ("NVIDIA A100-SXM4-80GB", "fp32", False, 19.5e12),  # true fp32
        ("NVIDIA A10", "bf16", False, 125e12),
        ("NVIDIA A10G", "bf16", False, None),  # another chip than the A10: unknown, no MFU
        ("NVIDIA GeForce RTX 4090", "bf16", False, None),
    ],
)
def test_peak_flops_by_gpu_name(gpu, precision, tf32, peak):
    assert peak_flops_of(gpu, precision, tf32) == peak


def test_the_first_step_is_read_on_its_own_then_every_log_interval():
    """On a GPU a record's time is its read interval's mean: the first step (compilation, allocator
    growth) must not be averaged into the steady steps after it, also when a run resumes."""
    cfg = load_config(None, ["train.steps=25", "train.log_every=10"])

    def reads(first_step: int) -> list[int]:
        return [s for s in range(first_step, 26) if read_due(cfg, s, first_step, evaluated=False, saving=False)]

    assert reads(1) == [1, 10, 20, 25]
    assert reads(13) == [13, 20, 25]
    assert read_due(cfg, 7, 1, evaluated=True, saving=False) and read_due(cfg, 7, 1, evaluated=False, saving=True)

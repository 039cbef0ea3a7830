"""Rank 0's JSON-lines metrics and the console line, plus throughput arithmetic.

Where the metrics go, first match wins: ``--metrics-file PATH``, ``$DISTLAUNCH_METRICS_FILE``,
``$DISTLAUNCH_LOG_DIR/metrics.jsonl`` (``distlaunch train --log-dir`` passes ``--metrics-file``); otherwise only
the console line is printed. Lines: one ``{"event": "start", ...}``, one per step
``{"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "mem_bytes", "mem", ...}``, and a
final ``{"event": "summary", ...}``. The file is appended to, so a restarted job keeps its
history and every run starts with its own ``start`` line.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch

from distlaunch.engine.model import GPTConfig, num_params
from distlaunch.training.checkpoint.folder import os_reason
from distlaunch.training.places import METRICS_FILE, check_place, place_refusal

if TYPE_CHECKING:
    from distlaunch.engine.tracking import Tracking

# Dense (no sparsity) peaks per GPU, from NVIDIA's data sheets: (bf16/fp16 tensor cores, fp32 without
# TF32). The most specific name first: an "H100 PCIe" is an H100 too, and the word match keeps an
# "A10G" (another chip) from reading as an A10.
PEAK_FLOPS: list[tuple[str, float, float]] = [
    ("H100 NVL", 835e12, 60e12),
    ("H100 PCIe", 756e12, 51e12),
    ("H100", 989e12, 67e12),  # SXM
    ("H200 NVL", 835e12, 60e12),
    ("H200", 989e12, 67e12),
    ("A100", 312e12, 19.5e12),
    ("L40S", 362e12, 91.6e12),
    ("A10", 125e12, 31.2e12),
]


def flops_per_token(cfg: GPTConfig, seq_len: int) -> float:
    """Training FLOPs per token, the PaLM / torchtitan count: 6 per weight that multiplies (forward 2,
    backward 4) plus 12*L*d*T for the attention scores (counted whole, as is usual, though causal
    attention computes half). The embedding tables are looked up, not multiplied, so they are left
    out; counting them would add 7% to the MFU of 1.3b at seq 2048 and 28% to that of 125m at 1024."""
    lookups = (cfg.vocab_size + cfg.max_seq_len) * cfg.d_model  # tok_emb, pos_emb
    return 6 * (num_params(cfg) - lookups) + 12 * cfg.n_layer * cfg.d_model * seq_len


def peak_flops_of(gpu_name: str, precision: str, tf32: bool) -> float | None:
    """The dense peak of the GPU called ``gpu_name`` for ``precision``: bf16/fp16 on tensor cores,
    fp32 on TF32 tensor cores (half the bf16 peak) when ``tf32`` matmuls are allowed, else on the
    fp32 units; None for a GPU not in ``PEAK_FLOPS``."""
    for key, bf16, fp32 in PEAK_FLOPS:
        if re.search(rf"\b{re.escape(key)}\b", gpu_name):
            if precision in ("bf16", "fp16"):
                return bf16
            return bf16 / 2 if tf32 else fp32
    return None


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The device's dense peak for ``precision``, when known (CPUs have no reliable one)."""
    if device.type != "cuda":
        return None
    return peak_flops_of(torch.cuda.get_device_name(device), precision, torch.backends.cuda.matmul.allow_tf32)


def open_metrics_file(path: Path) -> IO[str]:
    """``path`` opened for appending (missing folders created), or UsageError in one line naming the
    path and why it cannot be written: a folder, under a file, not writable."""
    check_place(METRICS_FILE, path, folder=False)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("a", encoding="utf-8")
    except OSError as err:  # what the check cannot foresee: a read-only or special filesystem
        raise place_refusal(METRICS_FILE, path, f"cannot be written: {os_reason(path, err)}") from None


class MetricsWriter:
    """Appends JSON lines on rank 0; every other rank holds a writer that does nothing. ``tracking``
    (``train.report_to``) gets every record too, written to the file or not."""

    def __init__(self, path: Path | None, enabled: bool, tracking: Tracking | None = None):
        self._file: IO[str] | None = None
        self.path = path if enabled else None
        self.tracking = tracking
        if enabled and path is not None:
            self._file = open_metrics_file(path)

    def write(self, record: dict[str, Any]) -> None:
        """One JSON object per line, flushed so a tail -f sees it at once. A write that fails (a full disk)
        is one warning, and the metrics stop there: the training goes on, as it is worth more than its log."""
        if self.tracking is not None:
            self.tracking.write(record)
        if self._file is None:
            return
        try:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        except OSError as err:
            print(
                f"warning: metrics file {self.path} cannot be written ({os_reason(self.path, err)}): "
                "no more metrics are written; the training goes on",
                file=sys.stderr,
                flush=True,
            )
            self.close()
            self.path = None  # nor a loss curve beside it

    def close(self) -> None:
        """Close the file and the trackers (safe to call twice; what a failed write left unflushed is dropped)."""
        if self.tracking is not None:
            self.tracking.close()
        if self._file is not None:
            file, self._file = self._file, None
            with contextlib.suppress(OSError):
                file.close()

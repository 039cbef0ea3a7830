"""Rank 0's JSON-lines metrics and the console line, plus throughput arithmetic.

Where the metrics go, first match wins: ``--metrics-file PATH``, ``$DISTLAUNCH_METRICS_FILE``,
``$DISTLAUNCH_LOG_DIR/metrics.jsonl`` (the launcher sets ``--log-dir`` there); otherwise only
the console line is printed. Lines: one ``{"event": "start", ...}``, one per step
``{"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "mem_bytes", "mem", ...}``, and a
final ``{"event": "summary", ...}``. The file is appended to, so a restarted job keeps its
history and every run starts with its own ``start`` line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

import torch

from distlaunch.engine.model import GPTConfig, num_params

# dense bf16 peak per GPU (fp32 matmuls run as TF32 at half of it); CPUs have no reliable peak
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def metrics_path(cli_value: str | None, environ: dict[str, str] | None = None) -> Path | None:
    """Where rank 0 writes metrics.jsonl (see the module docstring for the order)."""
    env = os.environ if environ is None else environ
    if cli_value:
        return Path(cli_value)
    if env.get("DISTLAUNCH_METRICS_FILE"):
        return Path(env["DISTLAUNCH_METRICS_FILE"])
    if env.get("DISTLAUNCH_LOG_DIR"):
        return Path(env["DISTLAUNCH_LOG_DIR"]) / "metrics.jsonl"
    return None


def flops_per_token(cfg: GPTConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6N for the weights plus 12*L*d*T for attention scores (PaLM)."""
    return 6 * num_params(cfg) + 12 * cfg.n_layer * cfg.d_model * seq_len


def peak_flops(device: torch.device, precision: str) -> float | None:
    """The device's dense peak for ``precision``, when known."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, bf16 in PEAK_BF16_FLOPS.items():
        if key in name:
            return bf16 if precision in ("bf16", "fp16") else bf16 / 2
    return None


class MetricsWriter:
    """Appends JSON lines on rank 0; every other rank holds a writer that does nothing."""

    def __init__(self, path: Path | None, enabled: bool):
        self._file: IO[str] | None = None
        self.path = path if enabled else None
        if enabled and path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        """One JSON object per line, flushed so a tail -f sees it at once."""
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        """Close the file (safe to call twice)."""
        if self._file is not None:
            self._file.close()
            self._file = None

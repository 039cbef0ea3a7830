"""The GPU benchmark on a machine without a visible GPU: one line and exit 1, not a CPU run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_throughput_refuses_without_a_gpu():
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "gpu_throughput.py")],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},  # no GPU visible, whatever the machine has
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: a run it starts by mistake ends with it
    )
    try:
        out, err = proc.communicate(timeout=60)  # without the check: 125m training on the CPU
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 1
    assert err.strip().splitlines() == [
        "error: no CUDA GPU is visible (torch.cuda.is_available() is False); run this on a GPU machine"
    ]
    assert out == ""

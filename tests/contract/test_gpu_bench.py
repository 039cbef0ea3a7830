"""The GPU benchmarks on a machine without a visible GPU: one line and exit 1, not a CPU run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", ["gpu_throughput.py", "gpu_checks.py"])
def test_a_gpu_benchmark_refuses_without_a_gpu(script):
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / script)],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},  # no GPU visible, whatever the machine has
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: a run it starts by mistake ends with it
    )
    try:
        out, err = proc.communicate(timeout=60)  # without the check: 125m and 1.3b training on the CPU
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 1
    assert err.strip().splitlines() == [
        "error: no CUDA GPU is visible (torch.cuda.is_available() is False); run this on a GPU machine"
    ]
    assert out == ""


def test_gpu_checks_names_an_unknown_section_in_one_line():
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_checks.py"), "--only", "doctor,nccl"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: --only nccl: no such section (sections: device, duplicate-gpu, nccl-hang, doctor, template, tf32, layouts)"
    ]

"""Every benchmark runs as docs/benchmarks.md writes it, ``python bench/NAME.py``, from any folder: its imports
(distlaunch, and the suite's fixtures for the ones that start a real sshd) resolve without PYTHONPATH.
``bench/_NAME.py`` are the benchmarks' shared parts, not benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "bench").glob("*.py") if not p.name.startswith("_")))
def test_a_benchmark_imports_and_answers_help_from_any_folder(script, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), "--help"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]  # before: No module named 'tests' (doctor_scaling, ssh_fanout)
    assert "usage:" in done.stdout

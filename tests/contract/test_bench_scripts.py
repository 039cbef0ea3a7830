"""Every benchmark runs as docs/benchmarks.md writes it, ``python bench/NAME.py``, from any folder: its imports
(distlaunch, and the suite's fixtures for the ones that start a real sshd) resolve without PYTHONPATH.
``bench/_NAME.py`` are the benchmarks' shared parts, not benchmarks."""

from __future__ import annotations

import json
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


def test_step_interleaved_phases_time_zero1s_all_gather_and_zero0_has_none(tmp_path):
    """``--phases``: where each engine's step goes, as docs/benchmarks.md quotes it for ZeRO-1 against ZeRO-0."""
    out = tmp_path / "steps.json"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(REPO / "bench" / "step_interleaved.py"), "--zero", "1", "--against", "zero0", "--steps", "4",
         "--global-batch-size", "4", "--seq-len", "32", "--out", str(out), "--phases"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    times = json.loads(out.read_text())
    gather = "  of which the parameter all-gather"
    assert set(times["engine_phases_ms"]) - set(times["reference_phases_ms"]) == {gather}
    assert all(ms > 0 for ms in times["engine_phases_ms"].values())
    assert times["engine_phases_ms"]["optimizer step"] >= times["engine_phases_ms"][gather]
    rows = {line[:40].strip(): line[40:].split() for line in done.stdout.splitlines()}  # rank 0's table
    assert rows[gather.strip()][1] == "-" and len(rows["whole step"]) == 2, done.stdout

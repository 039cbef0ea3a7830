"""No false straggler: a healthy 200-step run of 2 ranks names nobody, even with a CPU-burning process of our own
taking a core away from them the whole time (on a 2-core machine: 3 busy processes on 2 cores)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.helpers import run_cli

SETS = ["model.preset='tiny'", "train.steps=200", "train.global_batch_size=4", "train.seq_len=32"]


def test_a_healthy_run_on_a_busy_machine_names_no_straggler():
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        r = run_cli(
            "-v", "run", "-n", "2", "--json", "-m", "distlaunch.engine",
            *[arg for s in SETS for arg in ("--set", s)],
            env={"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}, timeout=240,
        )  # fmt: skip
    finally:
        burner.kill()  # ours, by pid
        burner.wait()
    assert r.returncode == 0, r.stderr[-3000:]
    # -v says how close it came (measured: 1.04-1.3x on 2 cores with the burner; a straggler is named from 1.5x,
    # held for 20 steps); without the line the ranks' compute times were never compared, and this proves nothing
    peak = re.search(r"the largest compute ratio seen was ([\d.]+)× \(rank \d\)", r.stderr)
    assert peak, r.stderr[-2000:]
    assert json.loads(r.stdout)["stragglers_found"] == [], peak[0]
    assert "straggler:" not in r.stderr

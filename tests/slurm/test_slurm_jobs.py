"""Batch jobs submitted by ``distlaunch slurm sbatch`` in the job registry, on the real two-node test cluster:
listed with Slurm's state, their output file shown by ``logs``, stopped by ``stop`` (scancel)."""

from __future__ import annotations

import json
import subprocess
import textwrap

from tests.helpers import distlaunch_cmd, wait_until

TICKER = textwrap.dedent(
    """
    import os, sys, time
    for i in range(int(sys.argv[1])):
        print(f"tick {i} of rank {os.environ['RANK']}", flush=True)
        time.sleep(0.2)
    """
)


def test_sbatch_job_is_listed_logged_and_stopped(slurm_cluster, tmp_path):
    env = {**slurm_cluster.env, "DISTLAUNCH_STATE_DIR": str(tmp_path / "state")}
    (tmp_path / "ticker.py").write_text(TICKER)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(distlaunch_cmd(*args), capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)

    submitted = cli("slurm", "sbatch", "-N", "2", "--ntasks-per-node", "1", "-o", "out-%j.log", "ticker.py", "100000")
    assert submitted.returncode == 0, submitted.stderr
    slurm_id = submitted.stdout.split()[-1]

    def status() -> dict:
        return json.loads(cli("status", slurm_id, "--json").stdout)  # Slurm's own id finds the record

    assert wait_until(lambda: status()["state"] == "running", 60, interval=0.5)
    [listed] = json.loads(cli("jobs", "--json").stdout)
    assert (listed["job_id"], listed["backend"], listed["world_size"]) == (f"slurm-{slurm_id}", "slurm", 2)
    assert listed["output"] == str(tmp_path / f"out-{slurm_id}.log")

    assert wait_until(lambda: "tick 2 of rank 1" in cli("logs", f"slurm-{slurm_id}").stdout, 60, interval=0.5)
    rank1 = cli("logs", slurm_id, "--rank", "1", "--tail", "2").stdout.splitlines()
    assert len(rank1) == 2 and all(line.startswith("1: tick") for line in rank1)  # srun --label lines

    stopped = cli("stop", slurm_id, "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["state"] == "stopped"
    assert slurm_cluster.client("squeue", "-h", "-j", slurm_id).stdout.strip() == ""
    assert "stopped" in cli("jobs").stdout

"""On the real Slurm cluster: ``--env`` values reach every rank through the environment, never through an argv
that ``ps`` shows (srun, slurmstepd, the rank's launcher) nor the batch script."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

from tests.helpers import distlaunch_cmd

SCRIPTS = Path(__file__).parent / "scripts"
SECRET = "hf_s3cretValue42"  # the probe greps every process's command line for it


def probes(stdout: str) -> list[str]:
    """The probe lines, leaving out the user's own ``distlaunch slurm ...`` command (on the login node, where
    the user typed the value; the cluster's nodes are these same processes' neighbours here)."""
    found = []
    for line in stdout.splitlines():
        if "PROBE " in line:
            head, leaks = line.split("PROBE ", 1)[1].split(" leaks=", 1)
            others = [argv for argv in ast.literal_eval(leaks) if " -m distlaunch slurm " not in argv]
            found.append(f"{head} leaks={others}")
    return sorted(found)


def test_slurm_run_env_values_never_appear_on_a_command_line(slurm_cluster, tmp_path):
    argv = distlaunch_cmd(
        "slurm",
        "run",
        "-N",
        "2",
        "--ntasks-per-node",
        "1",
        "--env",
        f"HF_TOKEN={SECRET}",
        str(SCRIPTS / "secret_probe.py"),
    )
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=slurm_cluster.env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert probes(r.stdout) == [f"rank={rank} token_len={len(SECRET)} leaks=[]" for rank in (0, 1)], r.stdout
    dry = subprocess.run(
        [*argv[:5], "--dry-run", *argv[5:]], capture_output=True, text=True, timeout=60, env=slurm_cluster.env
    )
    assert dry.returncode == 0 and "--export=ALL,HF_TOKEN" in dry.stdout and SECRET not in dry.stdout


def test_sbatch_env_values_stay_out_of_the_batch_script(slurm_cluster, tmp_path):
    common = ["-N", "2", "--ntasks-per-node", "1", "--env", f"HF_TOKEN={SECRET}"]
    script = subprocess.run(
        distlaunch_cmd("slurm", "sbatch", "--dry-run", *common, str(SCRIPTS / "secret_probe.py")),
        capture_output=True,
        text=True,
        timeout=60,
        env=slurm_cluster.env,
        cwd=tmp_path,
    )
    assert script.returncode == 0 and SECRET not in script.stdout and "#SBATCH --export=ALL,HF_TOKEN" in script.stdout
    argv = distlaunch_cmd("slurm", "sbatch", *common, "--output", "job.out", "--wait", str(SCRIPTS / "secret_probe.py"))
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=slurm_cluster.env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert probes(r.stdout) == [f"rank={rank} token_len={len(SECRET)} leaks=[]" for rank in (0, 1)], r.stdout

"""On a real two-node Slurm cluster (node1 + node2 on this machine): srun tasks become ranks, gloo all-reduces
across nodes through ``distlaunch slurm run`` and ``sbatch``, and a failing rank fails the step with its code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import distlaunch_cmd

SCRIPTS = Path(__file__).parent / "scripts"
ALLREDUCE = ["-m", "distlaunch.examples.allreduce"]
TIMEOUT_S = 120


def run(cluster, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=cluster.env, cwd=cwd)


def rank_envs(stdout: str) -> list[dict]:
    """The RANKENV lines of scripts/rank_env.py (srun --label puts 'N: ' in front), ordered by rank."""
    found = [json.loads(line.split("RANKENV ", 1)[1]) for line in stdout.splitlines() if "RANKENV " in line]
    return sorted(found, key=lambda e: int(e["RANK"]))


def assert_allreduce_ok(result: subprocess.CompletedProcess, world_size: int) -> None:
    assert result.returncode == 0, result.stdout + result.stderr
    ok = [line for line in result.stdout.splitlines() if f"/{world_size} (gloo): all_reduce" in line and "(ok)" in line]
    assert len(ok) == world_size, result.stdout + result.stderr


def test_plain_srun_distlaunch_run_sets_every_variable(slurm_cluster, tmp_path):
    # The user writes nothing but srun: ranks, nodes, master and port all come from Slurm.
    argv = [
        "srun",
        "-N",
        "2",
        "--ntasks-per-node",
        "2",
        *distlaunch_cmd("run", "--parallel", "tp=2"),
        str(SCRIPTS / "rank_env.py"),
    ]
    result = run(slurm_cluster, argv, tmp_path)
    assert result.returncode == 0, result.stderr
    envs = rank_envs(result.stdout)
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [(e["SLURMD_NODENAME"], e["NODE_RANK"], e["LOCAL_RANK"]) for e in envs] == [
        ("node1", "0", "0"),
        ("node1", "0", "1"),
        ("node2", "1", "0"),
        ("node2", "1", "1"),
    ]
    # node1 does not resolve outside Slurm: its NodeAddr from scontrol is the master address.
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({(e["MASTER_PORT"], e["DISTLAUNCH_JOB_ID"]) for e in envs}) == 1
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["NNODES"], e["OMP_NUM_THREADS"]) for e in envs} == {
        ("4", "2", "2", "1")
    }
    assert {e["DISTLAUNCH_PARALLEL"] for e in envs} == {"dp=2,tp=2,pp=1,zero=0"}
    assert {e["parent"] for e in envs} == {"slurmstepd"}  # distlaunch exec'd into the rank: no process in between


def test_allreduce_across_two_nodes_via_slurm_run(slurm_cluster, tmp_path):
    result = run(
        slurm_cluster, distlaunch_cmd("slurm", "run", "-N", "2", "--ntasks-per-node", "2", *ALLREDUCE), tmp_path
    )
    assert_allreduce_ok(result, 4)
    assert {line.split(":")[0] for line in result.stdout.splitlines()} == {"0", "1", "2", "3"}  # srun --label


def test_allreduce_via_sbatch_wait(slurm_cluster, tmp_path):
    argv = distlaunch_cmd(
        "slurm", "sbatch", "-N", "2", "--ntasks-per-node", "2", "--output", "logs/%x-%j.out", "--wait", *ALLREDUCE
    )
    result = run(slurm_cluster, argv, tmp_path)
    assert_allreduce_ok(result, 4)
    job_id = result.stdout.splitlines()[0].removeprefix("submitted batch job ")
    assert job_id.isdigit(), result.stdout
    assert (tmp_path / "logs" / f"allreduce-{job_id}.out").exists()
    assert f"job {job_id} ended with exit code 0" in result.stderr


def test_failing_rank_fails_the_step_with_its_exit_code(slurm_cluster, tmp_path):
    argv = distlaunch_cmd("slurm", "run", "-N", "2", "--ntasks-per-node", "2", str(SCRIPTS / "fail_rank.py"), "2", "7")
    result = run(slurm_cluster, argv, tmp_path)  # the others sleep 120 s: a quick end means srun stopped them
    assert result.returncode == 7, result.stdout + result.stderr
    assert "distlaunch: rank 2 on node2 exited with code 7; srun stopped the other ranks (exit 7)" in result.stderr


def test_failing_rank_fails_the_batch_job_with_its_exit_code(slurm_cluster, tmp_path):
    argv = distlaunch_cmd(
        "slurm", "sbatch", "-N", "2", "--ntasks-per-node", "1", "--wait", str(SCRIPTS / "fail_rank.py"), "1", "5"
    )
    result = run(slurm_cluster, argv, tmp_path)
    assert result.returncode == 5, result.stdout + result.stderr
    assert "rank 1 fails with 5" in result.stdout and "ended with exit code 5" in result.stderr


def test_tp_spanning_nodes_is_refused_in_a_real_step(slurm_cluster, tmp_path):
    argv = [
        "srun",
        "-N",
        "2",
        "--ntasks-per-node",
        "2",
        "--kill-on-bad-exit=1",
        *distlaunch_cmd("run", "--parallel", "tp=4"),
        str(SCRIPTS / "rank_env.py"),
    ]
    result = run(slurm_cluster, argv, tmp_path)
    assert result.returncode != 0 and "RANKENV" not in result.stdout
    assert "error: --parallel tp=4: tensor-parallel group of ranks 0..3 spans nodes (node1, node2" in result.stderr


def test_launcher_slurm_is_pure_python_without_torch():
    # Every task imports this path before exec: it must stay light (torch would cost seconds per rank).
    code = "import sys, distlaunch.cli.app, distlaunch.slurm.task; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


AFFINITY = "import os\nprint('CPUS', os.environ['RANK'], sorted(os.sched_getaffinity(0)), flush=True)\n"


def rank_cpus(stdout: str) -> dict[int, list[int]]:
    """Each rank's CPUs as it printed them (srun --label puts 'N: ' in front)."""
    rows = [line.split("CPUS ", 1)[1].split(" ", 1) for line in stdout.splitlines() if "CPUS " in line]
    return {int(rank): json.loads(cpus) for rank, cpus in rows}


def test_cpu_bind_reaches_every_task_and_a_binding_slurm_made_is_kept(slurm_cluster, tmp_path):
    """slurm run --cpu-bind: every task binds itself by it, among its node's tasks; with srun's own binding asked
    (SLURM_CPU_BIND, what srun --cpu-bind sets), the tasks keep what Slurm gave them."""
    (tmp_path / "cpus.py").write_text(AFFINITY, encoding="utf-8")
    usable = sorted(os.sched_getaffinity(0))  # what slurmd, started by this suite, gives its tasks
    first, second = usable[0], usable[-1]
    argv = distlaunch_cmd("slurm", "run", "-N", "2", "--ntasks-per-node", "2", "--cpu-bind", f"{second}:{first}")
    result = run(slurm_cluster, [*argv, "cpus.py"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert rank_cpus(result.stdout) == {0: [second], 1: [first], 2: [second], 3: [first]}
    env = {**slurm_cluster.env, "SLURM_CPU_BIND": f"map_cpu:{first},{first}"}
    kept = subprocess.run([*argv, "cpus.py"], capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=tmp_path)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert rank_cpus(kept.stdout) == {rank: usable for rank in range(4)}  # task/none: Slurm bound nothing


def test_a_cpu_bind_list_short_of_a_nodes_tasks_is_one_line_before_srun(tmp_path):
    (tmp_path / "cpus.py").write_text(AFFINITY, encoding="utf-8")
    argv = distlaunch_cmd("slurm", "run", "-N", "2", "--ntasks-per-node", "2", "--cpu-bind", "0", "cpus.py")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2 and "--cpu-bind 0 gives 1 CPU set for 2 ranks" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    sbatch = distlaunch_cmd("slurm", "sbatch", "-N", "2", "--ntasks-per-node", "2", "--cpu-bind", "cores")
    script = subprocess.run([*sbatch, "--dry-run", "cpus.py"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert "slurm run --requeue --cpu-bind cores -- cpus.py" in script.stdout, script.stdout + script.stderr

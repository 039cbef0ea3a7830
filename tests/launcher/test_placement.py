"""--cpu-bind for real: each rank prints the CPUs it may run on (os.sched_getaffinity), and they are what the
plan's policy gives on its host and what the report says, locally, under a taskset, over real OpenSSH, with
simulated NUMA nodes and GPUs (the probe's files, in a mount namespace of the launch's own) and in an srun task."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from distlaunch.hostprobe import format_cpulist
from distlaunch.placement import share
from tests.fixtures.hardware import FakeGpu, Hardware
from tests.helpers import distlaunch_cmd, run_cli
from tests.slurm.test_slurm_env import task_env

AFFINITY = "import os\nprint('CPUS', os.environ['RANK'], sorted(os.sched_getaffinity(0)), flush=True)\n"
USABLE = sorted(os.sched_getaffinity(0))
# the launch's own CPUs, two of them: the tests below give each of two ranks one
pytestmark = pytest.mark.skipif(len(USABLE) < 2, reason="placement tests need two usable CPUs")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "affinity.py"
    path.write_text(AFFINITY)
    return path


def rank_cpus(output: str) -> dict[int, list[int]]:
    """Each rank's CPUs, as it printed them."""
    found = {}
    for line in output.splitlines():
        if "CPUS " in line:
            rank, cpus = line.split("CPUS ", 1)[1].split(" ", 1)
            found[int(rank)] = json.loads(cpus)
    return found


def launched(*args: str, prefix: tuple[str, ...] = (), env: dict | None = None) -> tuple[dict, dict[int, list[int]]]:
    """``distlaunch run --json ARGS``: its report, and each rank's CPUs as the rank saw them."""
    argv = [*prefix, *distlaunch_cmd("run", "--json", *args)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), rank_cpus(done.stderr)


def reported(report: dict) -> dict[int, str]:
    return {int(rank): cpus for rank, cpus in report["attempts"][-1]["cpus"].items()}


def test_by_default_each_local_rank_gets_its_own_share_of_the_cpus(script):
    report, cpus = launched("-n", "2", str(script))
    expected = {r: share(USABLE, r, 2) for r in (0, 1)}
    assert cpus == expected and not set(cpus[0]) & set(cpus[1])
    assert reported(report) == {r: format_cpulist(c) for r, c in expected.items()}


def test_none_leaves_every_rank_every_cpu_and_a_list_is_followed(script):
    _, cpus = launched("-n", "2", "--cpu-bind", "none", str(script))
    assert cpus == {0: USABLE, 1: USABLE}
    first, second = USABLE[:2]
    _, cpus = launched("-n", "2", "--cpu-bind", f"{second}:{first}", str(script))
    assert cpus == {0: [second], 1: [first]}


def test_a_taskset_the_launch_runs_under_is_never_left(script):
    assert shutil.which("taskset"), "taskset (util-linux) is part of every machine this suite runs on"
    one = USABLE[-1]
    _, cpus = launched("-n", "2", str(script), prefix=("taskset", "-c", str(one)))
    assert cpus == {0: [one], 1: [one]}
    done = subprocess.run(
        ["taskset", "-c", str(one), *distlaunch_cmd("run", "-n", "2", "--cpu-bind", f"{USABLE[0]}:{one}", str(script))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and f"outside the usable CPUs {one} on localhost" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "bind, words",
    [
        ("0-1:x", "is not none, numa, cores or a list of CPU sets"),
        ("0", "gives 1 CPU set for 2 ranks on localhost"),
        ("0:1:0:1:0:1:0:1:0:1:0:1:0:1:0:1:0:1:0:1:0:1:0:1:0:1:0:1:0:1:0:1:0:1", "more than the"),
        ("0:4096", "names CPU 4096, outside the usable CPUs"),
    ],
)
def test_a_bad_list_is_one_line_and_exit_2_before_any_rank_starts(script, bind, words):
    done = run_cli("run", "-n", "2", "--cpu-bind", bind, str(script), timeout=60)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "CPUS" not in done.stdout + done.stderr


def test_the_plan_says_the_policy(script):
    done = run_cli("run", "-n", "2", "--cpu-bind", "cores", "--dry-run", str(script), timeout=60)
    assert done.returncode == 0 and "placement cores: an equal share of the host's CPUs" in done.stdout, done.stdout
    done = run_cli("run", "-n", "2", "--cpu-bind", "0:1", "--dry-run", "--json", str(script), timeout=60)
    assert json.loads(done.stdout)["cpu_bind"] == "0:1"


def test_each_ranks_gpu_decides_its_numa_node(script, tmp_path):
    """Two simulated GPUs, GPU 0 on the NUMA node of the second CPU and GPU 1 on the first's: under nccl rank 0
    (cuda:0) runs on the second CPU, rank 1 on the first. The ranks are tiny scripts: no CUDA is touched."""
    first, second = USABLE[:2]
    hw = Hardware(
        gpus=[FakeGpu("0000:18:00.0", numa="1"), FakeGpu("0000:9a:00.0", numa="0")],
        nodes={"node0": str(first), "node1": str(second)},
    )
    prefix = tuple(hw.prefix(tmp_path / "hw"))
    report, cpus = launched("-n", "2", "--backend", "nccl", str(script), prefix=prefix)
    assert cpus == {0: [second], 1: [first]}
    assert reported(report) == {0: str(second), 1: str(first)}
    _, cpus = launched("-n", "2", "--backend", "gloo", "--cpu-bind", "numa", str(script), prefix=prefix)
    assert cpus == {0: [first], 1: [second]}  # no GPU: the NUMA nodes by local rank


def test_every_ssh_host_binds_its_own_ranks(sshd_cluster, tmp_path, script):
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", nhosts=2, slots=2)
    ssh = ("-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config))
    report, cpus = launched(*ssh, str(script))
    expected = {r: share(USABLE, r % 2, 2) for r in range(4)}  # each host's local ranks 0 and 1
    assert cpus == expected
    assert reported(report) == {r: format_cpulist(c) for r, c in expected.items()}
    done = run_cli("run", *ssh, "--cpu-bind", "0:4096", str(script), timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "names CPU 4096, outside the usable CPUs" in lines[0] and "node1, node2" in lines[0]
    assert "CPUS" not in done.stdout + done.stderr


def srun_task(script, **extra: str) -> subprocess.CompletedProcess:
    """``distlaunch run SCRIPT`` as the second task of a node of an srun step (its SLURM_* variables): it execs
    into the script on this machine."""
    env = {**os.environ, **task_env(1, 0, 1), "MASTER_ADDR": "127.0.0.1", "SLURMD_NODENAME": "gpu07", **extra}
    argv = [sys.executable, "-m", "distlaunch", "run", str(script)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def test_an_srun_task_binds_itself_unless_slurm_did(script):
    done = srun_task(script)
    assert done.returncode == 0, done.stderr
    assert rank_cpus(done.stdout) == {1: share(USABLE, 1, 2)}  # local id 1 of the node's 2 tasks
    done = srun_task(script, SLURM_CPU_BIND_TYPE="mask_cpu:", SLURM_CPU_BIND_LIST="0x3")
    assert rank_cpus(done.stdout) == {1: USABLE}  # Slurm's binding (here: none narrower than ours) is kept
    done = srun_task(script, SLURM_CPU_BIND_TYPE="none")
    assert rank_cpus(done.stdout) == {1: share(USABLE, 1, 2)}

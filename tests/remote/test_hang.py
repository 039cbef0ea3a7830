"""A real hang across two hosts over real SSH: 4 gloo ranks on node1 and node2, rank 3 (on node2) sleeps
before the all_reduce the others wait in; the launcher gathers every rank's stack and names it."""

from __future__ import annotations

import re
import subprocess

from tests.helpers import distlaunch_cmd, left_behind
from tests.launcher.scripts.nccl_dumper import dump_bytes
from tests.launcher.test_hang import DUMPER, LATE
from tests.remote.test_multihost import cli_env


def test_a_late_rank_on_a_remote_host_is_named_with_its_host_and_the_job_exits_124(sshd_cluster, tmp_path):
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", nhosts=2)
    logs = tmp_path / "logs"
    r = subprocess.run(
        distlaunch_cmd(
            "run", "-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config), "--env", "LATE_RANK=3",
            "--hang-timeout", "15", "--grace-period", "1", "--log-dir", str(logs), LATE,
        ),
        capture_output=True, text=True, env=cli_env(), timeout=120,
    )  # fmt: skip
    assert r.returncode == 124, r.stderr
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("distlaunch: hang: "))
    assert re.search(r"ranks 0-2 wait in all_reduce \(late_rank\.py:30\)", line), line
    assert re.search(r"rank 3 in <module> \(late_rank\.py:28\) on node2(;|$)", line), line
    (job,) = logs.glob("dl-*")
    stacks = {p.name: p.read_text() for p in (job / "stacks").iterdir()}
    assert sorted(stacks) == ["rank0.txt", "rank1.txt", "rank2.txt", "rank3.txt"]
    assert stacks["rank3.txt"].startswith("# rank 3 on node2 ")
    assert 'late_rank.py", line 28 in <module>' in stacks["rank3.txt"]
    assert stacks["rank1.txt"].startswith("# rank 1 on node1 ") and "all_reduce" in stacks["rank1.txt"]
    assert f"full stacks: {job / 'stacks'}" in r.stderr
    assert not (left := left_behind("DISTLAUNCH_JOB_ID", job.name, 10)), f"job processes left behind: {left}"


def test_nccl_flight_recorder_dumps_of_remote_ranks_reach_the_job_folder(sshd_cluster, tmp_path):
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", nhosts=2)
    logs = tmp_path / "logs"
    r = subprocess.run(
        distlaunch_cmd(
            "run", "-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config), "--hang-timeout", "3",
            "--grace-period", "1", "--log-dir", str(logs), DUMPER,
        ),
        capture_output=True, text=True, env=cli_env(COLUMNS="300"), timeout=120,
    )  # fmt: skip
    assert r.returncode == 124, r.stderr
    (folder,) = logs.glob("dl-*/stacks")
    for rank in range(2):  # on node1: rank 0 dumped at once, rank 1 through its pipe; rank 2 (node2) was cut
        assert (folder / f"nccl_trace_rank_{rank}").read_bytes() == dump_bytes(rank)
    assert (folder / "nccl_trace_rank_2").read_bytes() == dump_bytes(2)[: 4 << 20]
    assert f"NCCL flight recorder dumps of ranks 0-2: {folder} " in r.stderr
    assert not (left := left_behind("DISTLAUNCH_JOB_ID", folder.parent.name, 10)), f"left behind: {left}"

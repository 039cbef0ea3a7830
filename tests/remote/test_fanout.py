"""A launch on many hosts through OpenSSH's client, the default transport, for real: 20 loopback hosts served by
two test sshd daemons (tests/fixtures/sshd.py). Every rank runs, one thread reads every host (the launcher's
threads do not grow with its hosts, as paramiko's transport threads did), a frozen agent is given up within the
heartbeat bound, and nothing of the job is left on any host or here: ranks, agents and ssh clients all carry
DISTLAUNCH_JOB_ID."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures import require
from tests.fixtures.sshd import sshd_missing_reason, start_sshd_fleet
from tests.helpers import wait_until
from tests.remote.test_multihost import WORKER, Job

HOSTS = 20
HEARTBEAT_S = 3.0


@dataclass
class Hosts:
    """What ``Job`` needs of a cluster: a hostfile and an ssh_config."""

    hostfile: Path
    ssh_config: Path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    require(sshd_missing_reason())
    fleet = start_sshd_fleet(tmp_path_factory.mktemp("fleet"), HOSTS)
    try:
        yield fleet
    finally:
        fleet.stop()


def hosts(fleet, tmp_path: Path, n: int) -> Hosts:
    return Hosts(fleet.write_hostfile(tmp_path / f"hosts{n}", n), fleet.ssh_config)


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def ssh_clients(job: Job) -> list[int]:
    """The job's processes on this machine that are the launcher's children: its OpenSSH clients."""
    mine = []
    for pid in job.processes():
        try:
            if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == job.proc.pid:
                mine.append(pid)
        except OSError:
            continue
    return mine


def test_every_rank_on_20_hosts_runs_one_reader_thread_serves_them_and_nothing_is_left(fleet, tmp_path):
    job = Job(hosts(fleet, tmp_path, HOSTS), "--grace-period", "1", WORKER, "hold").wait_ready(HOSTS, timeout=120)
    try:
        assert {line.split("node=")[1].split()[0] for line in job.lines if "ready rank=" in line} == {
            str(n) for n in range(HOSTS)
        }
        assert len(ssh_clients(job)) == HOSTS  # one client per host, each marked with the job's id
        # main, the pipe reader, the job's event drain and a few of the CLI's: not one or two per host
        assert threads(job.proc.pid) <= 8, threads(job.proc.pid)
        job.proc.send_signal(signal.SIGINT)
        _out, err = job.finish(timeout=60)
        assert job.proc.returncode == 130, err
        assert wait_until(lambda: not job.processes(), 10), f"left behind: {job.processes()}"
    finally:
        job.proc.kill()
        job.proc.wait()


def test_a_frozen_agent_is_given_up_within_the_heartbeat_bound(fleet, tmp_path):
    job = Job(
        hosts(fleet, tmp_path, 4), "--heartbeat-timeout", f"{HEARTBEAT_S:g}", "--grace-period", "1", WORKER, "hold"
    ).wait_ready(4, timeout=60)
    agent = agent_of(job, node_rank=2)
    try:
        os.kill(agent, signal.SIGSTOP)
        frozen = time.monotonic()
        _out, err = job.finish(timeout=60)
        took = time.monotonic() - frozen
        assert job.proc.returncode == 3, err
        assert "node3 has been silent for" in err and f"--heartbeat-timeout {HEARTBEAT_S:g}" in err, err
        # judged every third of the timeout: given up within 4/3 of it, then the others stop within their grace
        assert took < HEARTBEAT_S * 4 / 3 + 1 + 3, f"took {took:.1f}s"
    finally:
        os.kill(agent, signal.SIGCONT)  # thawed, it reads EOF (its ssh client is gone) and stops its ranks
        job.proc.kill()
        job.proc.wait()
    assert wait_until(lambda: not job.processes(), 15), f"left behind: {job.processes()}"


def agent_of(job: Job, node_rank: int) -> int:
    """The agent of ``node_rank``: the parent of its ranks (which carry NODE_RANK; the agent does not)."""
    mark = f"NODE_RANK={node_rank}".encode()
    for pid in job.processes():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark not in f.read().split(b"\0"):
                    continue
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if b"distlaunch.agent" in Path(f"/proc/{parent}/cmdline").read_bytes():
                return parent
        except OSError:
            continue
    raise AssertionError(f"no agent of node {node_rank} among {job.processes()}")


def test_the_paramiko_transport_still_launches_and_a_bad_choice_is_one_line(fleet, tmp_path):
    job = Job(hosts(fleet, tmp_path, 2), "--grace-period", "1", WORKER, "hold", DISTLAUNCH_SSH_TRANSPORT="paramiko")
    job.wait_ready(2, timeout=60)
    try:
        assert not ssh_clients(job) and threads(job.proc.pid) > 4  # paramiko: threads of its own, no clients
        job.proc.send_signal(signal.SIGINT)
        _out, err = job.finish(timeout=60)
        assert job.proc.returncode == 130, err
    finally:
        job.proc.kill()
        job.proc.wait()
    assert wait_until(lambda: not job.processes(), 10), f"left behind: {job.processes()}"
    bad = Job(hosts(fleet, tmp_path, 2), WORKER, "hold", DISTLAUNCH_SSH_TRANSPORT="telnet")
    _out, err = bad.finish(timeout=60)
    assert bad.proc.returncode == 2, err
    assert "DISTLAUNCH_SSH_TRANSPORT='telnet' is not a transport (hint: set it to openssh or paramiko)" in err, err

"""A partitioned host, for real: node1 is the loopback test cluster, ``nsnode`` an sshd inside a network
namespace of its own. Mid-job a DROP rule inside that namespace makes every packet over its veth vanish
(no reset, no refusal: the TCP connection just goes quiet, as when a switch or a cable fails)."""

from __future__ import annotations

import contextlib
import subprocess
import time

import pytest
from fixtures.netns import need_root_netns, netns_sshd

from tests.doctor.conftest import host_block, write_config
from tests.fixtures import require
from tests.helpers import distlaunch_cmd, wait_until
from tests.remote.test_multihost import WORKER, Job, cli_env

HEARTBEAT_S = 3.0


@pytest.fixture(scope="module")
def partitionable(tmp_path_factory):
    reason = need_root_netns()
    require(reason)
    with netns_sshd(tmp_path_factory.mktemp("partition-sshd"), "dlpart") as host:
        yield host


@contextlib.contextmanager
def partitioned(host):
    """Drop every packet that crosses the namespace's veth, both ways, until the block ends."""
    rules = [["INPUT", "-i", host.inside, "-j", "DROP"], ["OUTPUT", "-o", host.inside, "-j", "DROP"]]
    for rule in rules:
        host.ns("iptables", "-I", *rule)
    try:
        yield
    finally:
        for rule in rules:
            host.ns("iptables", "-D", *rule)


class PartitionJob(Job):
    """``Job`` on node1 (2 ranks) and nsnode (2 ranks)."""

    def __init__(self, cluster, host, tmp_path, *args: str):
        ns = host.cluster
        config = write_config(
            tmp_path / "ssh_config", cluster, host_block("nsnode", host.address, ns.port, ns.user_key, ns.known_hosts)
        )
        hostfile = tmp_path / "hosts"
        hostfile.write_text("node1 slots=2\nnsnode slots=2\n", encoding="utf-8")
        self.proc = subprocess.Popen(
            distlaunch_cmd("run", "-H", str(hostfile), "--ssh-config", str(config), *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
        self.lines, self.job_id = [], ""


def ranks_on(job: Job, node_rank: int) -> list[int]:
    """The job's processes on one node: those whose environment says NODE_RANK=node_rank."""
    mark = f"NODE_RANK={node_rank}".encode()
    found = []
    for pid in job.processes():
        with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as f:
            if mark in f.read().split(b"\0"):
                found.append(pid)
    return found


def test_a_partitioned_host_is_named_and_the_job_stops_with_exit_3(sshd_cluster, partitionable, tmp_path):
    job = PartitionJob(
        sshd_cluster, partitionable, tmp_path, "--heartbeat-timeout", f"{HEARTBEAT_S:g}", "--grace-period", "1",
        WORKER, "hold",
    ).wait_ready(count=4)  # fmt: skip
    try:
        assert ranks_on(job, 0) and ranks_on(job, 1)
        with partitioned(partitionable):
            cut = time.monotonic()
            _out, err = job.finish(timeout=30)
            took = time.monotonic() - cut
            assert job.proc.returncode == 3, err
            assert "nsnode has been silent for" in err and f"--heartbeat-timeout {HEARTBEAT_S:g}" in err, err
            assert "nsnode went silent" in err, err
            # heartbeats are checked every third of the timeout; the healthy node then stops within its grace period
            assert took < HEARTBEAT_S * 4 / 3 + 4, f"took {took:.1f}s to give nsnode up"
            assert wait_until(lambda: not ranks_on(job, 0), 5), f"node1 left {ranks_on(job, 0)}"
            # nsnode's agent heard nothing from the launcher for the whole timeout: it stops its ranks itself,
            # while still cut off.
            assert wait_until(lambda: not ranks_on(job, 1), 10), f"nsnode left {ranks_on(job, 1)}"
            print(f"partition to exit 3: {took:.1f}s")
        # Reconnected, nothing of the job is left anywhere (agents included).
        assert wait_until(lambda: not job.processes(), 10), f"left behind: {job.processes()}"
    finally:
        job.proc.kill()
        job.proc.wait()

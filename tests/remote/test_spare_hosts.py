"""A host lost for real in a job with a spare (``--nnodes 2:2`` over node1..node3 of the test sshd, one rank
each): node2 freezes (every process serving it stopped with SIGSTOP: its heartbeats stop) or dies (every
process serving it killed, and its SSH port rejected by an iptables rule). Either way node2 is quarantined,
node3 takes its place, the job finishes, and nothing of node2's is left behind once it thaws."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from tests.doctor.conftest import host_block, write_config
from tests.fixtures import require
from tests.helpers import descendants, distlaunch_cmd, pids_with_env, run_cli, wait_until
from tests.remote.test_heartbeat import NODE2, frozen, sshd_sessions_serving
from tests.remote.test_multihost import cli_env

OK_RANK = Path(__file__).parent / "ok_rank.py"  # a rank that does nothing
# Holds on the first try (until the job stops it), finishes at once on the next.
RANK = """import os, time
print(f"ready rank={os.environ['RANK']} try={os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    time.sleep(600)
"""


class SpareJob:
    def __init__(self, cluster, tmp_path):
        script = tmp_path / "rank.py"
        script.write_text(RANK, encoding="utf-8")
        hostfile = cluster.write_hostfile(tmp_path / "hosts", nhosts=3, slots=1)
        self.mark = uuid.uuid4().hex
        args = [
            *["run", "-H", str(hostfile), "--ssh-config", str(cluster.ssh_config), "--nnodes", "2:2"],
            *["--heartbeat-timeout", "3", "--grace-period", "1", "--env", f"DLTEST_MARK={self.mark}", str(script)],
        ]
        self.proc = subprocess.Popen(
            distlaunch_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env()
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [
            threading.Thread(target=lambda: self.out.extend(self.proc.stdout), daemon=True),
            threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    def wait_ready(self) -> None:
        assert wait_until(lambda: sum("try=0" in line for line in self.out) == 2, 60), self.out

    def finish(self) -> str:
        try:
            self.proc.wait(timeout=120)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        for reader in self.readers:
            reader.join(timeout=10)
        return "".join(self.err)


@contextlib.contextmanager
def dead(cluster):
    """node2 dies: its SSH port rejects connections, every process serving it is killed."""
    rule = ["INPUT", "-d", NODE2, "-p", "tcp", "--dport", str(cluster.port), "-j", "REJECT"]
    subprocess.run(["iptables", "-I", *rule], check=True)
    try:
        sessions = sshd_sessions_serving(cluster, NODE2)
        for pid in [*sessions, *(p for s in sessions for p in descendants(s))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        yield
    finally:
        subprocess.run(["iptables", "-D", *rule], check=False)


@pytest.mark.parametrize("fault", ["frozen", "dead"])
def test_a_lost_host_is_replaced_by_the_spare_and_the_job_finishes(sshd_cluster, tmp_path, fault):
    if fault == "dead":
        require(None if os.geteuid() == 0 else "the dead-host rehearsal adds an iptables rule: root only")
    job = SpareJob(sshd_cluster, tmp_path)
    job.wait_ready()
    how = frozen(sshd_sessions_serving(sshd_cluster, NODE2)) if fault == "frozen" else dead(sshd_cluster)
    with how:
        err = job.finish()
    assert job.proc.returncode == 0, err
    why = "went silent" if fault == "frozen" else "lost contact with its agent"
    assert f"quarantined node2 for the rest of the job: {why}" in err, err
    assert "node3 in place of node2" in err, err
    assert any("[node3 rank 1] ready rank=1 try=1" in line for line in job.out), job.out
    # node2's agent, thawed, reads EOF and stops its rank; killed, it left nothing
    assert wait_until(lambda: not pids_with_env("DLTEST_MARK", job.mark), 60), pids_with_env("DLTEST_MARK", job.mark)


def test_a_host_that_fails_the_first_preflight_is_replaced_and_the_hosts_that_start_decide(sshd_cluster, tmp_path):
    """node1, nolisten (nothing answers there) and node2, ``--nnodes 2:2``: nolisten is quarantined at the first
    preflight, node2 takes its place, and node1 and node2 decide the backend, as any launch's hosts do."""
    c = sshd_cluster
    nolisten = host_block("nolisten", "127.0.0.99", c.port, c.user_key, c.known_hosts)
    config = write_config(tmp_path / "ssh_config", c, nolisten)
    (tmp_path / "hosts").write_text("node1 slots=1\nnolisten slots=1\nnode2 slots=1\n", encoding="utf-8")
    argv = ["run", "--json", "-H", str(tmp_path / "hosts"), "--ssh-config", str(config), "--nnodes", "2:2"]
    done = run_cli(*argv, str(OK_RANK), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "preflight: nolisten: connection refused" in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert report["attempts"][0]["hosts"] == ["node1", "node2"]
    assert sorted(report["hosts"]) == ["node1", "node2"]  # what the hosts that ran the ranks reported

"""The test sshd's teardown: stopping the server ends its sessions too.

A session is a forked child that leaves the server's process group, so killing the server alone
leaves it behind; after a partition test such a session waits on a dead connection for hours.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from distlaunch.agent import is_running
from tests.fixtures import require
from tests.fixtures.sshd import sshd_missing_reason, start_sshd, stop_sshd
from tests.helpers import descendants, wait_until


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""  # ended meanwhile


def test_stopping_the_server_ends_its_open_sessions(tmp_path):
    require(sshd_missing_reason())
    cluster = start_sshd(tmp_path / "sshd", nhosts=1)
    client = subprocess.Popen(
        ["ssh", "-F", str(cluster.ssh_config), "-o", "BatchMode=yes", cluster.aliases[0], "sleep 300"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Wait for the remote command itself: a connection still authenticating has forks to come.
        assert wait_until(lambda: any(_comm(p) == "sleep" for p in descendants(cluster.pid)), 20), "no session"
        sessions = descendants(cluster.pid)  # the session's processes, the remote command among them
        stop_sshd(cluster.dir)
        alive = [pid for pid in sessions if is_running(pid)]
        assert not alive, f"sessions outlived their server: {alive}"
        assert client.wait(timeout=10) != 0  # the client saw its connection closed
    finally:
        client.kill()
        client.wait()
        stop_sshd(cluster.dir)

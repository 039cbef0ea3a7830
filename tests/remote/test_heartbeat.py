"""A host that goes silent mid-run, for real: the test sshd's session process serving node2 is frozen with
SIGSTOP (found by pid among the server's own descendants, by the address its socket serves)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from tests.fixtures.sshd import SSHD
from tests.helpers import descendants
from tests.remote.test_multihost import WORKER, Job

NODE2 = "127.0.0.12"


def socket_inodes_on(address: str, port: int) -> set[str]:
    """Inodes of TCP sockets whose local end is address:port (from /proc/net/tcp)."""
    want = "".join(f"{int(o):02X}" for o in reversed(address.split("."))) + f":{port:04X}"
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == want:
            inodes.add(fields[9])
    return inodes


def sshd_sessions_serving(cluster, address: str) -> list[int]:
    """The test sshd's per-connection processes holding a connection to ``address``."""
    inodes = socket_inodes_on(address, cluster.port)
    found = []
    for pid in descendants(cluster.pid):
        with contextlib.suppress(OSError):
            if os.path.realpath(f"/proc/{pid}/exe") != SSHD:
                continue  # the agent, its shell and ranks run under sshd too: never those
            fds = os.listdir(f"/proc/{pid}/fd")
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds}
            if any(f"socket:[{inode}]" in links for inode in inodes):
                found.append(pid)
    return found


@contextlib.contextmanager
def frozen(pids: list[int]):
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def test_a_frozen_host_is_named_and_the_job_stops_with_exit_3(sshd_cluster):
    job = Job(sshd_cluster, "--heartbeat-timeout", "4", "--grace-period", "1", WORKER, "hold").wait_ready()
    sessions = sshd_sessions_serving(sshd_cluster, NODE2)
    assert sessions, "no sshd session serves node2"
    with frozen(sessions):
        _out, err = job.finish(timeout=120)
        assert job.proc.returncode == 3, err
        assert "node2 has been silent for" in err and "--heartbeat-timeout 4" in err
        assert "node2 went silent" in err
        # node2's agent hears nothing from the launcher either (its sshd is frozen, so not even EOF
        # arrives): it stops its ranks by its own heartbeat deadline, while the session is still frozen.
        deadline = time.monotonic() + 60
        while job.processes():
            assert time.monotonic() < deadline, f"left behind: {job.processes()}"
            time.sleep(0.2)


def test_a_second_interrupt_leaves_within_seconds_naming_the_unconfirmed_host(sshd_cluster):
    job = Job(sshd_cluster, "--heartbeat-timeout", "120", "--grace-period", "1", WORKER, "hold").wait_ready()
    sessions = sshd_sessions_serving(sshd_cluster, NODE2)
    assert sessions
    try:
        with frozen(sessions):
            job.proc.send_signal(signal.SIGINT)
            time.sleep(3)  # node1 and node3 confirm; node2 cannot
            assert job.proc.poll() is None
            job.proc.send_signal(signal.SIGINT)
            _out, err = job.finish(timeout=30)
            assert job.proc.returncode == 130, err
            assert "could not confirm that every rank stopped on node2" in err
            assert "not confirmed clean: node2" in err
        # Thawed, node2's agent reads EOF and stops its ranks.
        deadline = time.monotonic() + 60
        while job.processes():
            assert time.monotonic() < deadline, f"left behind: {job.processes()}"
            time.sleep(0.2)
    finally:
        job.proc.kill()

"""The OpenSSH transport's parts without a server: the one pipe reader, the client's command line (host keys kept
strict), ssh_config lookups that read only the blocks that may apply, and the agent's clock placed within a
round trip."""

from __future__ import annotations

import math
import os
import queue
import threading

import paramiko
import pytest

from distlaunch.protocol import READY, AgentConnection, clock_bounds
from distlaunch.remote.openssh import is_final, ssh_command
from distlaunch.remote.pipes import MAX_LINE_BYTES, PipeHub
from distlaunch.remote.sshconfig import SshTarget, _lookup


class Collected:
    """A reader that keeps what the hub hands it."""

    def __init__(self):
        self.got: list[bytes] = []
        self.over = threading.Event()

    def lines(self, lines):
        self.got += lines

    def ended(self):
        self.over.set()


def test_one_hub_reads_many_pipes_whole_lines_a_last_piece_and_a_runaway_line_in_parts():
    hub = PipeHub()
    try:
        pipes = [os.pipe() for _ in range(40)]
        readers = [Collected() for _ in pipes]
        for (r, _), reader in zip(pipes, readers, strict=True):
            hub.add(r, reader)
        for i, (_, w) in enumerate(pipes):
            os.write(w, f"a{i}\nb".encode())
            os.write(w, f"{i}\nlast".encode())
            os.close(w)
        for i, reader in enumerate(readers):
            assert reader.over.wait(5)
            assert reader.got == [f"a{i}".encode(), f"b{i}".encode(), b"last"]
        r, w = os.pipe()
        runaway = Collected()
        hub.add(r, runaway)
        writer = threading.Thread(target=lambda: (os.write(w, b"x" * (MAX_LINE_BYTES + 10) + b"\n"), os.close(w)))
        writer.start()
        assert runaway.over.wait(10)
        writer.join()
        assert b"".join(runaway.got) == b"x" * (MAX_LINE_BYTES + 10) and len(runaway.got) == 2
        for r, _ in pipes:
            os.close(r)
    finally:
        hub.close()


class Unsent:
    """A writer for a pipe nobody reads yet: what the pipe does not take, the hub writes once it can."""

    def __init__(self, fd: int, data: bytes):
        self.fd, self.data, self.lock = fd, bytearray(data), threading.Lock()

    def flush(self) -> bool:
        with self.lock:
            try:
                del self.data[: os.write(self.fd, self.data)]
            except BlockingIOError:
                return False
            return not self.data


def test_what_a_full_pipe_does_not_take_is_written_by_the_hub_in_order():
    hub = PipeHub()
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        payload = bytes(range(256)) * 2048  # 512 KiB: far more than a pipe holds
        taken = os.write(w, payload)
        assert taken < len(payload)
        hub.flush_later(w, Unsent(w, payload[taken:]))
        received = bytearray()
        while len(received) < len(payload):
            received += os.read(r, 65536)
        assert bytes(received) == payload
    finally:
        hub.close()
        os.close(r)
        os.close(w)


def target(**fields) -> SshTarget:
    base = {"alias": "node1", "hostname": "10.0.0.11", "port": 2222, "user": "alice"}
    return SshTarget(**{**base, "known_hosts_files": ["/k/known hosts", "/k/two"], **fields})


def options(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, word in enumerate(argv) if word == "-o")


def test_the_client_checks_host_keys_strictly_against_the_files_distlaunch_resolved():
    argv = ssh_command(target(), "echo hi", config="/c/ssh_config")
    o = options(argv)
    assert argv[-3:] == ["--", "node1", "echo hi"] and argv[argv.index("-F") + 1] == "/c/ssh_config"
    assert o["StrictHostKeyChecking"] == "yes" and o["BatchMode"] == "yes" and o["UpdateHostKeys"] == "no"
    assert o["UserKnownHostsFile"] == '"/k/known hosts" /k/two' and o["GlobalKnownHostsFile"] == "none"
    assert (o["HostName"], o["Port"], o["User"]) == ("10.0.0.11", "2222", "alice")
    assert o["ControlPath"] == "none" and o["ClearAllForwardings"] == "yes"  # nothing outlives the job
    assert "-T" in argv and "-F" not in ssh_command(target(), "true", config=None)
    # accepting new keys never accepts a changed one: accept-new, not "no", even where ssh_config says no
    assert (
        options(ssh_command(target(), "true", config=None, accept_new_host_keys=True))["StrictHostKeyChecking"]
        == "accept-new"
    )
    lax = target(strict_host_key_checking="no")
    assert options(ssh_command(lax, "true", config=None))["StrictHostKeyChecking"] == "accept-new"


def test_only_what_no_retry_mends_is_final():
    assert is_final(["ssh: Could not resolve hostname x: Name or service not known"])
    assert is_final(["alice@10.0.0.11: Permission denied (publickey)."])
    assert is_final(
        [
            "No ED25519 host key is known for [x]:22 and you have requested strict checking.",
            "Host key verification failed.",
        ]
    )
    assert not is_final(["ssh: connect to host 10.0.0.11 port 22: Connection refused"])
    assert not is_final(["kex_exchange_identification: read: Connection reset by peer"])


CONFIG = """
Host node1 node2
  User one
Host node2
  Port 2202
Host !node3 node*
  IdentityFile ~/.ssh/star
Host node3
  HostName 10.0.0.3
Match host 10.0.0.3
  User matched
Host *
  User everyone
  Port 22
"""


@pytest.mark.parametrize("alias", ["node1", "node2", "node3", "node4", "other"])
def test_lookups_that_read_only_the_blocks_that_may_apply_find_what_paramiko_finds(alias):
    config = paramiko.SSHConfig.from_text(CONFIG)
    assert dict(_lookup(config, alias)) == dict(config.lookup(alias))


def test_a_config_that_canonicalizes_names_is_looked_up_whole():
    config = paramiko.SSHConfig.from_text("CanonicalizeHostname yes\nCanonicalDomains invalid\nHost node1\n  Port 2\n")
    assert dict(_lookup(config, "node1")) == dict(config.lookup("node1"))


class Bare(AgentConnection):
    def start(self, payload):
        pass

    def send(self, message):
        pass

    def close(self, wait_s=None):
        pass


def test_ready_places_a_clock_30s_behind_within_a_round_trip_where_the_hello_left_a_slow_start():
    conn = Bare(0, "node2", queue.Queue())
    # the hello: read 2 s into a slow start (ssh handshake, login, interpreter), 30 s behind
    conn.clock_bounds = clock_bounds(1002.0 - 30, 1000.0, 1002.1)
    assert conn.clock_bounds == pytest.approx((-30.1, -28.0))
    conn.plan_sent = 1010.0  # the plan went out; the agent read it 5 ms later and said ready 2 s after (its checks)
    conn.take(f'{{"ev": "{READY}", "problems": [], "plan_at": {1010.005 - 30}}}')
    assert conn.clock_offset == pytest.approx(-29.995) and conn.clock_bounds == pytest.approx((-30.1, -29.995))
    conn.take(f'{{"ev": "{READY}", "problems": [], "plan_at": null}}')  # an agent that does not say: as it was
    assert conn.clock_offset == pytest.approx(-29.995)
    stepped = Bare(0, "node3", queue.Queue())
    stepped.clock_bounds = (-1.0, 1.0)
    stepped.plan_sent = 0.0
    stepped.narrow_clock(100.0, 0.0, 0.5)  # a clock stepped between the two readings: what was known stays
    assert stepped.clock_bounds == (-1.0, 1.0) and stepped.clock_offset == 0.0
    assert Bare(0, "x", queue.Queue()).clock_bounds == (-math.inf, math.inf)

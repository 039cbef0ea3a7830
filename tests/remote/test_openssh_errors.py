"""The OpenSSH transport (the default) says what went wrong in the same words as paramiko's connection tests
(tests/remote/test_ssh_connect.py): the real CLI against the test sshd, one host that fails in one way each.
Refused connections, unknown names, unknown host keys and a remote Python that cannot run the agent are in
tests/remote/test_multihost.py."""

from __future__ import annotations

import socket

import paramiko
import pytest

from tests.helpers import run_cli
from tests.remote.test_multihost import WORKER, cli_env
from tests.remote.test_ssh_connect import UNUSED_ADDRESS, write_config


def launch(tmp_path, config: str, name: str):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"node1 slots=1\n{name} slots=1\n", encoding="utf-8")
    return run_cli("run", "-H", str(hostfile), "--ssh-config", config, WORKER, "dump", env=cli_env(), timeout=120)


def test_an_unknown_user_is_named_with_the_keys_tried_and_the_copy_id_line(sshd_cluster, tmp_path):
    r = launch(tmp_path, write_config(tmp_path, sshd_cluster, "stranger", User="nosuchuser"), "stranger")
    assert r.returncode == 3, r.stderr
    assert "stranger: authentication failed as user 'nosuchuser'" in r.stderr and str(sshd_cluster.user_key) in r.stderr
    assert f"ssh-copy-id -i {sshd_cluster.user_key}.pub -p {sshd_cluster.port} nosuchuser@127.0.0.11" in r.stderr
    assert "DUMP" not in r.stdout  # no rank anywhere, node1's included


def test_a_changed_host_key_is_refused_with_both_fingerprints_even_when_new_keys_are_accepted(sshd_cluster, tmp_path):
    other = paramiko.ECDSAKey.generate()
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(
        f"[127.0.0.11]:{sshd_cluster.port} {other.get_name()} {other.get_base64()}\n"
        f"[127.0.0.12]:{sshd_cluster.port} {sshd_cluster.host_key_line.split()[0]} "
        f"{paramiko.Ed25519Key(filename=str(sshd_cluster.dir / 'user_ed25519')).get_base64()}\n"
    )
    config = write_config(tmp_path, sshd_cluster, "spoofed", HostName="127.0.0.12", UserKnownHostsFile=wrong)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("spoofed slots=1\n", encoding="utf-8")
    before = wrong.read_text()
    r = run_cli(
        "run", "-H", str(hostfile), "--ssh-config", config, "--accept-new-host-keys", WORKER, "dump",
        env=cli_env(), timeout=120,
    )  # fmt: skip
    assert r.returncode == 3, r.stderr
    assert f"spoofed: host key of 127.0.0.12:{sshd_cluster.port} CHANGED" in r.stderr, r.stderr
    assert f"ssh-keygen -R '[127.0.0.12]:{sshd_cluster.port}' -f {wrong}" in r.stderr
    assert wrong.read_text() == before and "DUMP" not in r.stdout


@pytest.fixture
def silent_port():
    """A port on loopback that accepts TCP connections and never says a word."""
    with socket.socket() as silent:
        silent.bind((UNUSED_ADDRESS, 0))
        silent.listen(16)
        yield silent.getsockname()[1]


def test_a_server_that_never_speaks_ssh_is_a_handshake_timeout(sshd_cluster, tmp_path, silent_port):
    config = write_config(tmp_path, sshd_cluster, "mute", HostName=UNUSED_ADDRESS, Port=silent_port, ConnectTimeout=1)
    r = launch(tmp_path, config, "mute")
    assert r.returncode == 3, r.stderr
    assert (
        f"mute: {UNUSED_ADDRESS}:{silent_port} accepted the connection but did not finish the SSH handshake within 1s"
        in r.stderr
    ), r.stderr
    assert "Traceback" not in r.stderr and "DUMP" not in r.stdout

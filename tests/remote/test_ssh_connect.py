"""The SSH layer against a real sshd: ssh_config resolution, every failure kind with its fix, parallel
fan-out where one bad host never hides the others, and remote commands quoted byte for byte."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import uuid

import paramiko
import pytest

from distlaunch.errors import ExitCode
from distlaunch.remote.command import run_command
from distlaunch.remote.ssh import HostsFailed, SshError, connect, connect_all, require_all
from distlaunch.remote.sshconfig import resolve_targets
from tests.helpers import distlaunch_cmd, left_behind

UNUSED_ADDRESS = "127.0.0.99"  # on loopback, nothing listens here: connections are refused at once


def write_config(tmp_path, cluster, name: str, **overrides) -> str:
    """An ssh_config with one Host ``name`` set up like node1, with some settings replaced."""
    settings = {
        "HostName": cluster.addresses[0],
        "Port": cluster.port,
        "User": cluster.user,
        "IdentityFile": cluster.user_key,
        "IdentitiesOnly": "yes",
        "UserKnownHostsFile": cluster.known_hosts,
        "StrictHostKeyChecking": "yes",
        **overrides,
    }
    path = tmp_path / f"ssh_config_{name}"
    body = "".join(f"  {k} {v}\n" for k, v in settings.items() if v is not None)
    path.write_text(f"Host {name}\n{body}\n" + cluster.ssh_config.read_text(), encoding="utf-8")
    return str(path)


def connect_error(config: str, alias: str, **kwargs) -> SshError:
    target = resolve_targets([alias], config)[alias]
    with pytest.raises(SshError) as info:
        connect(target, **kwargs).close()
    return info.value


def test_resolves_ssh_config(sshd_cluster):
    target = resolve_targets(["node2"], sshd_cluster.ssh_config)["node2"]
    assert (target.hostname, target.port, target.user) == ("127.0.0.12", sshd_cluster.port, sshd_cluster.user)
    assert target.identity_files == [str(sshd_cluster.user_key)] and target.identities_only
    assert target.known_hosts_files == [str(sshd_cluster.known_hosts)]
    assert target.known_hosts_name == f"[127.0.0.12]:{sshd_cluster.port}"


def test_connect_and_run_command_quotes_every_word(sshd_cluster):
    target = resolve_targets(["node1"], sshd_cluster.ssh_config)["node1"]
    tricky = ["a b", "it's", '"q"', "$(touch /tmp/pwned)", "x; exit 7", "new\nline", "ünï 🚀", "*", "~"]
    client = connect(target)
    try:
        result = run_command(client, ["python3", "-c", "import sys; print(repr(sys.argv[1:]))", *tricky], timeout=10)
        assert result.rc == 0, result.stderr
        assert result.stdout.strip() == repr(tricky)
        assert run_command(client, ["cat"], timeout=10, stdin="in é\n").stdout == "in é\n"
        assert run_command(client, ["sh", "-c", "echo oops >&2; exit 5"], timeout=10).model_dump() == {
            "rc": 5,
            "stdout": "",
            "stderr": "oops\n",
        }
    finally:
        client.close()


def test_refused(sshd_cluster, tmp_path):
    err = connect_error(write_config(tmp_path, sshd_cluster, "down", HostName=UNUSED_ADDRESS), "down")
    assert (err.kind, err.check_id, err.host, err.exit_code) == ("refused", "ssh.connect", "down", ExitCode.HOST)
    assert f"{UNUSED_ADDRESS}:{sshd_cluster.port}" in err.detail and "sshd" in err.hint


def test_dns(sshd_cluster, tmp_path):
    err = connect_error(write_config(tmp_path, sshd_cluster, "ghost", HostName="no-such-host.invalid"), "ghost")
    assert (err.kind, err.check_id) == ("dns", "dns") and "no-such-host.invalid" in err.detail


def test_auth_names_user_and_keys(sshd_cluster, tmp_path):
    err = connect_error(write_config(tmp_path, sshd_cluster, "stranger", User="nosuchuser"), "stranger")
    assert (err.kind, err.check_id) == ("auth", "ssh.auth")
    assert "'nosuchuser'" in err.detail and str(sshd_cluster.user_key) in err.detail
    assert f"ssh-copy-id -i {sshd_cluster.user_key}.pub -p {sshd_cluster.port} nosuchuser@127.0.0.11" in err.hint


def test_unknown_host_key_gives_keyscan_line(sshd_cluster, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    err = connect_error(write_config(tmp_path, sshd_cluster, "fresh", UserKnownHostsFile=empty), "fresh")
    assert (err.kind, err.check_id) == ("hostkey-unknown", "ssh.hostkey")
    assert (
        f"ssh-keyscan -p {sshd_cluster.port} -H 127.0.0.11 >> {empty}" in err.hint
        and "--accept-new-host-keys" in err.hint
    )
    assert empty.read_text() == ""  # refused keys are never recorded


def test_accept_new_host_keys_records_the_key(sshd_cluster, tmp_path):
    empty = tmp_path / "new_known_hosts"
    target = resolve_targets(["fresh"], write_config(tmp_path, sshd_cluster, "fresh", UserKnownHostsFile=empty))[
        "fresh"
    ]
    connect(target, accept_new_host_keys=True).close()
    assert empty.read_text() == f"[127.0.0.11]:{sshd_cluster.port} {sshd_cluster.host_key_line}\n"
    connect(target).close()  # now known: no opt-in needed


def test_changed_host_key_is_refused(sshd_cluster, tmp_path):
    other = paramiko.ECDSAKey.generate()
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(
        f"[127.0.0.11]:{sshd_cluster.port} {sshd_cluster.host_key_line.split()[0]} "
        f"{paramiko.Ed25519Key(filename=str(sshd_cluster.dir / 'user_ed25519')).get_base64()}\n"
        f"[127.0.0.11]:{sshd_cluster.port} {other.get_name()} {other.get_base64()}\n"
    )
    err = connect_error(
        write_config(tmp_path, sshd_cluster, "spoofed", UserKnownHostsFile=wrong), "spoofed", accept_new_host_keys=True
    )
    assert (err.kind, err.check_id) == ("hostkey-changed", "ssh.hostkey") and "CHANGED" in err.detail
    assert f"ssh-keygen -R '[127.0.0.11]:{sshd_cluster.port}' -f {wrong}" in err.hint


def test_handshake_timeout(sshd_cluster, tmp_path):
    with socket.socket() as silent:  # accepts TCP but never speaks SSH
        silent.bind((UNUSED_ADDRESS, 0))
        silent.listen(4)
        config = write_config(tmp_path, sshd_cluster, "mute", HostName=UNUSED_ADDRESS, Port=silent.getsockname()[1])
        started = time.monotonic()
        err = connect_error(config, "mute", timeout=0.5)
    assert err.kind == "timeout" and time.monotonic() - started < 5


def test_a_proxy_command_that_never_connects_is_named_and_ended(sshd_cluster, tmp_path):
    mark = uuid.uuid4().hex
    config = write_config(tmp_path, sshd_cluster, "tunnelled", ProxyCommand=f"env DLTEST_MARK={mark} sleep 300")
    err = connect_error(config, "tunnelled", timeout=0.5)
    assert err.kind == "timeout", err
    assert f"no SSH handshake came through ProxyCommand 'env DLTEST_MARK={mark} sleep 300' within 0.5s" in str(err)
    assert "run the ProxyCommand by hand" in str(err)
    assert not (left := left_behind("DLTEST_MARK", mark, 10)), f"the ProxyCommand still runs: {left}"


def test_proxy_jump(sshd_cluster, tmp_path):
    config = write_config(tmp_path, sshd_cluster, "behind", HostName="127.0.0.13", ProxyJump="node1")
    target = resolve_targets(["behind"], config)["behind"]
    assert [hop.alias for hop in target.jumps] == ["node1"]
    client = connect(target)
    try:
        assert run_command(client, ["echo", "via jump"], timeout=10).stdout == "via jump\n"
        assert client.get_transport().getpeername()  # rides on a channel of node1's connection
    finally:
        client.close()
    assert not client.hops[0].get_transport()  # the hop was closed with it


def test_connect_all_reports_every_host(sshd_cluster, tmp_path):
    config = write_config(tmp_path, sshd_cluster, "down", HostName=UNUSED_ADDRESS)
    targets = resolve_targets(["node1", "down", "node2", "ghost.invalid"], config)
    results = connect_all(targets, retries=1)
    assert list(results) == ["node1", "down", "node2", "ghost.invalid"]
    assert isinstance(results["node1"], paramiko.SSHClient) and isinstance(results["node2"], paramiko.SSHClient)
    assert (results["down"].kind, results["ghost.invalid"].kind) == ("refused", "dns")
    with pytest.raises(HostsFailed) as info:
        require_all(results)
    lines = str(info.value).splitlines()
    assert lines[0] == "2 hosts could not be reached:" and lines[1].startswith("  down: connection refused")
    assert lines[2].startswith("  ghost.invalid: cannot resolve") and info.value.exit_code == ExitCode.HOST
    assert results["node1"].get_transport() is None  # require_all closed the good ones


def test_connect_all_eight_hosts(sshd_cluster):
    results = connect_all(resolve_targets(sshd_cluster.aliases, sshd_cluster.ssh_config), max_parallel=4)
    try:
        assert list(results) == sshd_cluster.aliases
        assert all(isinstance(r, paramiko.SSHClient) for r in results.values()), results
    finally:
        for r in results.values():
            r.close()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_the_ssh_preflight_ends_the_launch_at_once_and_is_recorded(sshd_cluster, tmp_path, sig, code):
    """Before: Ctrl-C waited for every handshake to time out (here 30 s), silently; SIGTERM left a 'lost' job."""
    with socket.socket() as silent:  # accepts TCP but never speaks SSH: its handshake waits for ConnectTimeout
        silent.bind((UNUSED_ADDRESS, 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        config = write_config(tmp_path, sshd_cluster, "mute", HostName=UNUSED_ADDRESS, Port=port, ConnectTimeout=30)
        hostfile = tmp_path / "hosts"
        hostfile.write_text("node1 slots=1\nmute slots=1\n")
        (tmp_path / "x.py").write_text("pass\n")
        env = {**os.environ, "DISTLAUNCH_STATE_DIR": str(tmp_path / "state"), "NO_COLOR": "1"}
        # Started as a script's background job (``distlaunch run ... &``): SIGINT ignored from the start. A signal
        # sent to the launcher still ends the launch, before its job starts as after (SignalTrap).
        proc = subprocess.Popen(
            distlaunch_cmd("run", "-H", str(hostfile), "--ssh-config", config, "x.py"),
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )  # fmt: skip
        try:
            # Once mute's connection comes, the launcher is in the preflight, however slowly it started on a
            # busy machine; mute's handshake then waits, and the signal comes meanwhile.
            silent.settimeout(60)
            try:
                conn, _ = silent.accept()
            except TimeoutError:
                proc.kill()
                pytest.fail(f"the launcher never connected to mute: {proc.communicate()}")
            with conn:
                sent = time.monotonic()
                proc.send_signal(sig)
                _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()  # our own child, by its handle
                proc.communicate()
    assert proc.returncode == code, err
    assert time.monotonic() - sent < 5, err
    assert f"interrupted by {sig.name}" in err, err
    jobs = subprocess.run(distlaunch_cmd("jobs", "--json"), env=env, capture_output=True, text=True, timeout=60)
    [record] = json.loads(jobs.stdout)
    assert (record["state"], record["exit_code"]) == ("interrupted", code), record


def test_a_server_that_hangs_up_after_its_banner_is_said_in_plain_words(sshd_cluster, tmp_path):
    import threading

    with socket.socket() as server:
        server.bind((UNUSED_ADDRESS, 0))
        server.listen(4)

        def answer_once() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")  # a banner, then nothing more: it hangs up
                time.sleep(0.5)
                conn.recv(65536)  # what the client sent (its banner, its key exchange): a clean close, not a reset
                conn.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=answer_once, daemon=True).start()
        port = server.getsockname()[1]
        config = write_config(tmp_path, sshd_cluster, "quitter", HostName=UNUSED_ADDRESS, Port=port)
        err = connect_error(config, "quitter", timeout=5)
    assert "began the SSH handshake, then stopped answering or hung up" in str(err), str(err)
    assert "ssh -v quitter" in str(err)

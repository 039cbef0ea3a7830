"""Doctor against the real test sshd: a healthy cluster passes everything, and each broken host fails
exactly the check that names its problem, while the healthy hosts beside it still pass."""

from __future__ import annotations

import re
import socket
import subprocess
import sys

import pytest

from tests.doctor.conftest import assert_healthy, doctor, free_port, host_block, write_config


def test_healthy_cluster_passes_every_check(sshd_cluster, tmp_path):
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", 3)
    run = doctor("-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config), "--master-port", str(free_port()))
    assert run.exit_code == 0, run.report
    assert run.report["ok"] is True
    for host in ("node1", "node2", "node3"):
        assert_healthy(run, host)
    assert run.status("master-port", "node1") == "pass"
    assert run.status("master-reachable", "node3") == "pass"
    clock = run.get("clock", "node3")  # NTP-style: several round trips to a helper on the host, with its error bar
    assert "round trips" in clock["detail"] and "±" in clock["detail"]


@pytest.fixture(scope="module")
def broken_run(sshd_cluster, tmp_path_factory):
    """One doctor run over two healthy hosts and four hosts that each fail in one real way."""
    d = tmp_path_factory.mktemp("broken")
    stranger = d / "stranger_ed25519"  # a key the server does not know
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    empty_known = d / "empty_known_hosts"
    empty_known.write_text("", encoding="utf-8")
    c = sshd_cluster
    extra = (
        host_block("ghost.invalid", "ghost.invalid", c.port, c.user_key, c.known_hosts)  # RFC 2606: never resolves
        + host_block("nolisten", "127.0.0.99", c.port, c.user_key, c.known_hosts)  # loopback, nothing listens
        + host_block("badkey", c.addresses[1], c.port, stranger, c.known_hosts)
        + host_block("newkey", c.addresses[2], c.port, c.user_key, empty_known)
    )
    config = write_config(d / "ssh_config", c, extra)
    hostfile = d / "hosts"
    hostfile.write_text(
        "node1 slots=2\nghost.invalid slots=1\nnolisten slots=1\nbadkey slots=1\nnewkey slots=1\nnode2 slots=2\n"
    )
    return doctor("-H", str(hostfile), "--ssh-config", str(config), "--master-port", str(free_port()))


def test_broken_hosts_fail_the_run(broken_run):
    assert broken_run.exit_code == 1
    assert broken_run.report["ok"] is False


def test_unresolvable_name_fails_dns(broken_run):
    dns = broken_run.get("dns", "ghost.invalid")
    assert dns["status"] == "fail"
    assert "cannot resolve" in dns["detail"] and "ghost.invalid" in dns["detail"]
    assert "troubleshooting.md#dns" in dns["hint"]
    assert broken_run.status("ssh.connect", "ghost.invalid") == "skip"
    assert broken_run.status("python", "ghost.invalid") == "skip"


def test_loopback_address_without_sshd_fails_connect(broken_run):
    connect = broken_run.get("ssh.connect", "nolisten")
    assert connect["status"] == "fail"
    assert "refused" in connect["detail"] and "127.0.0.99" in connect["detail"]
    assert broken_run.status("ssh.auth", "nolisten") == "skip"


def test_wrong_user_key_fails_auth(broken_run):
    auth = broken_run.get("ssh.auth", "badkey")
    assert auth["status"] == "fail"
    assert "authentication failed" in auth["detail"] and "ssh-copy-id" in auth["hint"]
    assert broken_run.status("ssh.hostkey", "badkey") == "pass"  # the server was verified before we were refused
    assert broken_run.status("ssh.connect", "badkey") == "pass"


def test_unknown_host_key_fails_hostkey(broken_run):
    hostkey = broken_run.get("ssh.hostkey", "newkey")
    assert hostkey["status"] == "fail"
    assert "not in known_hosts" in hostkey["detail"] and "ssh-keyscan" in hostkey["hint"]
    assert broken_run.status("ssh.auth", "newkey") == "skip"


def test_healthy_hosts_beside_broken_ones_still_pass(broken_run):
    for host in ("node1", "node2"):
        assert_healthy(broken_run, host)


def test_accept_new_host_keys_records_an_unknown_key_as_run_does(sshd_cluster, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("", encoding="utf-8")
    c = sshd_cluster
    config = write_config(tmp_path / "ssh_config", c, host_block("newkey", c.addresses[2], c.port, c.user_key, known))
    hostfile = tmp_path / "hosts"
    hostfile.write_text("newkey slots=1\n", encoding="utf-8")
    run = doctor(
        "-H", str(hostfile), "--ssh-config", str(config), "--master-port", str(free_port()), "--accept-new-host-keys"
    )
    assert run.status("ssh.hostkey", "newkey") == "pass", run.report
    assert known.read_text(encoding="utf-8").strip(), "the key was not recorded"


@pytest.fixture
def port_holder():
    """A real listener on the master's address, in a child process of ours."""
    port = free_port()
    code = (
        "import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.11', int(sys.argv[1]))); s.listen(); "
        "print('ready', flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield port, proc.pid
    proc.kill()  # our own child, by its handle
    proc.wait()


def test_master_port_held_names_the_holder(sshd_cluster, tmp_path, port_holder):
    port, pid = port_holder
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", 2)
    run = doctor("-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config), "--master-port", str(port))
    assert run.exit_code == 1
    held = run.get("master-port", "node1")
    assert held["status"] == "fail"
    assert f"pid {pid}" in held["detail"] and "127.0.0.11" in held["detail"]
    assert f"kill {pid}" in held["hint"] and re.search(r"--master-port \d+ \(free on node1 now\)", held["hint"])
    assert run.status("master-reachable", "node2") == "skip"
    assert run.status("python", "node2") == "pass"


@pytest.fixture
def greedy_holder():
    """One process of ours listening on port P at three of the cluster's addresses, and on P+1 too."""
    while True:
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.11", port + 1))
                break
            except OSError:
                continue
    code = (
        "import socket,sys,time; p=int(sys.argv[1]); socks=[]\n"
        "for a, q in (('127.0.0.11', p), ('127.0.0.12', p), ('127.0.0.13', p), ('127.0.0.11', p + 1)):\n"
        "    s=socket.socket(); s.bind((a, q)); s.listen(); socks.append(s)\n"
        "print('ready', flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield port, proc.pid
    proc.kill()  # our own child, by its handle
    proc.wait()


def test_a_held_port_names_each_holder_once_and_suggests_a_free_port(sshd_cluster, tmp_path, greedy_holder):
    port, pid = greedy_holder
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", 2)
    run = doctor("-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config), "--master-port", str(port))
    held = run.get("master-port", "node1")
    assert held["status"] == "fail"
    assert held["detail"].count(f"pid {pid}") == 1 and "\n" not in held["detail"], held
    addresses = re.search(r"listens on ([\d., ]+);", held["detail"]).group(1).split(", ")
    assert sorted(addresses) == ["127.0.0.11", "127.0.0.12", "127.0.0.13"], held  # each address once
    assert f"(kill {pid}) " in held["hint"], held  # once, not once per address
    suggested = int(re.search(r"--master-port (\d+)", held["hint"]).group(1))
    assert suggested not in (port, port + 1) and 1024 <= suggested <= 65535, held  # port+1 is taken too
    with socket.socket() as s:
        s.bind(("127.0.0.11", suggested))  # and it really is free


def test_a_master_that_does_not_resolve_fails_dns_and_nothing_that_depends_on_it(sshd_cluster, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("nosuchhost.invalid\nnode1\n", encoding="utf-8")
    run = doctor("-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config), "--master-port", str(free_port()))
    assert run.exit_code == 1
    bad = {(c["host"], c["id"]) for c in run.report["checks"] if c["status"] in ("fail", "warn")}
    assert bad == {("nosuchhost.invalid", "dns"), ("node1", "dns")}, run.report
    assert "MASTER_ADDR 'nosuchhost.invalid' does not resolve on node1" in run.get("dns", "node1")["detail"]
    for id in ("nic", "loopback-hostname"):
        check = run.get(id, "node1")
        if check["status"] == "skip":  # (loopback-hostname passes where this machine's name is no loopback)
            assert "MASTER_ADDR does not resolve on node1 (see dns)" in check["detail"], check
    assert run.status("nic", "node1") == "skip"
    assert run.status("python", "node1") == "pass"


def test_remote_interpreter_without_torch(sshd_cluster, tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    # A bare interpreter: also without a PYTHONPATH that the test session may hand to remote hosts.
    wrapper = tmp_path / "bare-python"
    wrapper.write_text(f'#!/bin/sh\nunset PYTHONPATH\nexec {tmp_path / "venv" / "bin" / "python"} "$@"\n')
    wrapper.chmod(0o755)
    python = str(wrapper)
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", 2)
    run = doctor(
        "-H",
        str(hostfile),
        "--ssh-config",
        str(sshd_cluster.ssh_config),
        "--master-port",
        str(free_port()),
        "--remote-python",
        python,
    )
    assert run.exit_code == 1
    for host in ("node1", "node2"):
        torch = run.get("torch-version", host)
        assert torch["status"] == "fail"
        assert torch["detail"] == f"torch is not installed for {tmp_path / 'venv' / 'bin' / 'python'}"
        assert "pip install torch" in torch["hint"]
        assert run.status("python", host) == "fail"  # distlaunch itself is missing there too
        assert run.status("master-reachable", host) == "pass"  # the probe itself ran on the bare interpreter


def test_missing_remote_interpreter(sshd_cluster, tmp_path):
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", 1)
    run = doctor(
        "-H",
        str(hostfile),
        "--ssh-config",
        str(sshd_cluster.ssh_config),
        "--master-port",
        str(free_port()),
        "--remote-python",
        "/nonexistent/bin/python3",
    )
    python = run.get("python", "node1")
    assert python["status"] == "fail" and "/nonexistent/bin/python3" in python["detail"]
    assert run.status("master-port", "node1") == "skip"

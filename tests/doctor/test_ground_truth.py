"""Doctor's verdict against what really happens: for each broken (or only odd-looking) cluster the real job
runs too where that is cheap, and READY / NOT READY must agree with the job's success. Faults are real: a
login banner from ~/.bashrc, a ~/.bashrc that hangs, a service that is not sshd on the SSH port, a port that
accepts and stays silent, an interpreter that hangs, Ctrl-C while connects are pending. No traceback, and no
process left behind."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fixtures.sshd import start_sshd
from helpers import distlaunch_cmd, left_behind, pids_with_env, run_cli, wait_until

from tests.doctor.conftest import free_port, host_block, write_config

ALLREDUCE = ["-m", "distlaunch.examples.allreduce"]


def doctor_cli(*args: str, timeout: float = 120) -> tuple[int, dict, str]:
    """The real CLI in a subprocess (so stderr is exactly what a user sees)."""
    done = run_cli("doctor", *args, "--json", timeout=timeout)
    assert done.stdout.strip(), f"no JSON (exit {done.returncode}): {done.stderr}"
    return done.returncode, json.loads(done.stdout), done.stderr


def get(report: dict, id: str, host: str) -> dict:
    found = [c for c in report["checks"] if c["id"] == id and c["host"] == host]
    assert len(found) == 1, json.dumps(report, indent=1)
    return found[0]


@pytest.fixture(scope="module")
def banner_cluster(tmp_path_factory):
    """Our own sshd (two hosts) whose login shell prints a welcome line before the non-interactive guard."""
    cluster = start_sshd(tmp_path_factory.mktemp("banner-sshd"), nhosts=2)
    try:
        (cluster.dir / "home" / ".bashrc").write_text(
            'echo "Welcome to the lab cluster!"\n[ -z "$PS1" ] && return\n', encoding="utf-8"
        )
        yield cluster
    finally:
        cluster.stop()


def test_login_banner_is_no_false_alarm_and_the_job_runs(banner_cluster, tmp_path):
    hostfile = banner_cluster.write_hostfile(tmp_path / "hosts", 2, slots=1)
    common = ["-H", str(hostfile), "--ssh-config", str(banner_cluster.ssh_config)]
    rc, report, err = doctor_cli(*common)
    job = run_cli("run", *common, *ALLREDUCE, timeout=180)
    assert job.returncode == 0, job.stderr
    assert rc == 0 and report["ok"] is True, json.dumps(report, indent=1)
    assert get(report, "python", "node1")["status"] == "pass"
    assert "Traceback" not in err


def test_startup_output_without_an_answer_names_the_shell_files(banner_cluster, tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'module load failed'\nexit 0\n", encoding="utf-8")
    fake.chmod(0o755)
    hostfile = banner_cluster.write_hostfile(tmp_path / "hosts", 1, slots=1)
    rc, report, _ = doctor_cli(
        "-H", str(hostfile), "--ssh-config", str(banner_cluster.ssh_config), "--remote-python", str(fake)
    )
    python = get(report, "python", "node1")
    assert rc == 1 and python["status"] == "fail"
    assert "~/.bashrc" in python["detail"] and "install Python" not in python["hint"]


@pytest.fixture(scope="module")
def hung_shell_cluster(tmp_path_factory):
    """Our own sshd (two hosts) whose login shell hangs in ~/.bashrc before it runs any command, as one does
    that waits on a network mount or a license server."""
    cluster = start_sshd(tmp_path_factory.mktemp("hung-shell-sshd"), nhosts=2)
    try:
        (cluster.dir / "home" / ".bashrc").write_text("sleep 120\n", encoding="utf-8")
        yield cluster
    finally:
        cluster.stop()  # with its sessions: the hung shells go too


def test_a_login_shell_that_hangs_is_named_not_the_interpreter_and_the_job_agrees(hung_shell_cluster, tmp_path):
    hostfile = hung_shell_cluster.write_hostfile(tmp_path / "hosts", 2, slots=1)
    common = ["-H", str(hostfile), "--ssh-config", str(hung_shell_cluster.ssh_config)]
    rc, report, err = doctor_cli(*common, "--start-timeout", "2")
    assert rc == 1 and report["ok"] is False
    for host in ("node1", "node2"):
        python = get(report, "python", host)
        assert python["status"] == "fail" and "the login shell did not get to run" in python["detail"], python
        assert "~/.bashrc" in python["detail"] and f"ssh {host} true" in python["hint"], python
        assert "the interpreter hangs" not in python["detail"]
    assert "login shell" in get(report, "master-port", "node1")["detail"]
    assert "Traceback" not in err, err
    job = run_cli("run", *common, *ALLREDUCE, timeout=180, env={"DISTLAUNCH_AGENT_START_TIMEOUT": "5"})
    assert job.returncode == 3, job.stderr
    for host in ("node1", "node2"):  # both waited as long as the launch did, not what was left of its wait
        assert f"{host}: the login shell did not get to run the agent within 5s" in job.stderr, job.stderr
    assert "Traceback" not in job.stderr, job.stderr


def _serve(sock: socket.socket, greeting: bytes | None, stop: threading.Event, accepted: threading.Event) -> None:
    sock.settimeout(0.2)
    held = []
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            continue
        held.append(conn)
        accepted.set()
        if greeting is not None:
            conn.sendall(greeting)
    for conn in held:
        conn.close()


@pytest.fixture
def odd_ports():
    """Two real listeners here: one speaks HTTP on accept, one accepts and stays silent."""
    stop = threading.Event()
    socks, threads = [], []
    accepted = {}
    for greeting in (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", None):
        s = socket.socket()
        s.bind(("127.0.0.11", 0))
        s.listen(16)
        socks.append(s)
        accepted[s.getsockname()[1]] = threading.Event()
        t = threading.Thread(target=_serve, args=(s, greeting, stop, accepted[s.getsockname()[1]]), daemon=True)
        t.start()
        threads.append(t)
    yield [s.getsockname()[1] for s in socks], accepted
    stop.set()
    for t in threads:
        t.join(5)
    for s in socks:
        s.close()


def test_non_ssh_service_and_silent_port_are_clear_checks_without_tracebacks(sshd_cluster, tmp_path, odd_ports):
    (http, silent), _ = odd_ports
    c = sshd_cluster
    config = write_config(
        tmp_path / "ssh_config",
        c,
        host_block("web", "127.0.0.11", http, c.user_key, c.known_hosts)
        + host_block("silent", "127.0.0.11", silent, c.user_key, c.known_hosts),
    )
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=1\nweb slots=1\nsilent slots=1\n", encoding="utf-8")
    rc, report, err = doctor_cli("-H", str(hostfile), "--ssh-config", str(config))
    assert rc == 1 and report["ok"] is False
    for host in ("web", "silent"):
        assert get(report, "ssh.connect", host)["status"] == "fail"
    assert "within 3s" in get(report, "ssh.connect", "silent")["detail"]  # one try: the message says what was tried
    assert get(report, "python", "node1")["status"] == "pass"
    assert "Traceback" not in err and "Error reading SSH protocol banner" not in err, err
    # what paramiko said is kept for the report, not lost and not printed
    assert "SSH library: " in get(report, "ssh.connect", "web")["detail"], get(report, "ssh.connect", "web")
    job = run_cli("run", "-H", str(hostfile), "--ssh-config", str(config), *ALLREDUCE, timeout=180)
    assert job.returncode != 0  # the job agrees: it cannot start either
    assert "Traceback" not in job.stderr, job.stderr


def _hanging_python(tmp_path: Path, marker: str) -> Path:
    """An 'interpreter' that exists and hangs, with a child, both marked in their environment."""
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nexport DOCTOR_TEST_MARK={marker}\nsleep 300 &\nwait\n", encoding="utf-8")
    fake.chmod(0o755)
    return fake


def test_hung_interpreter_is_named_a_hang_and_nothing_is_left(sshd_cluster, tmp_path):
    marker = secrets.token_hex(6)
    fake = _hanging_python(tmp_path, marker)
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", 2, slots=1)
    args = ["-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config), "--remote-python", str(fake)]
    rc, report, err = doctor_cli(*args, "--start-timeout", "4")
    assert rc == 1
    python = get(report, "python", "node2")
    assert python["status"] == "fail" and "hangs" in python["detail"], python
    assert "within 4s" in get(report, "master-port", "node1")["detail"]
    assert "install Python" not in python["hint"]
    assert "hangs" in get(report, "master-port", "node1")["detail"]
    assert "Traceback" not in err, err
    assert not (left := left_behind("DOCTOR_TEST_MARK", marker, 10)), f"processes left behind: {left}"
    # the job agrees, within the start time it is given (a cold Python on a network file system may need more)
    job = run_cli("run", *args, *ALLREDUCE, timeout=180, env={"DISTLAUNCH_AGENT_START_TIMEOUT": "4"})
    assert job.returncode == 3, job.stderr
    assert "node2: " in job.stderr and "did not say hello within 4s: the interpreter hangs at startup" in job.stderr
    assert "DISTLAUNCH_AGENT_START_TIMEOUT=SECONDS" in job.stderr, job.stderr
    assert not (left := left_behind("DOCTOR_TEST_MARK", marker, 10)), f"processes left behind: {left}"
    bad = run_cli("run", *args, *ALLREDUCE, timeout=180, env={"DISTLAUNCH_AGENT_START_TIMEOUT": "soon"})
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip() == (
        "error: DISTLAUNCH_AGENT_START_TIMEOUT='soon' is not a number of seconds (hint: set it to e.g. 120, or "
        "unset it (30 s))"
    ), bad.stderr


def test_ctrl_c_during_connect_exits_at_once_and_cleanly(sshd_cluster, tmp_path, odd_ports):
    (_, silent), accepted = odd_ports
    c = sshd_cluster
    block = host_block("silent", "127.0.0.11", silent, c.user_key, c.known_hosts).replace(
        "ConnectTimeout 3", "ConnectTimeout 120"
    )
    config = write_config(tmp_path / "ssh_config", c, block)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("silent slots=1\n", encoding="utf-8")
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.Popen(
        distlaunch_cmd("doctor", "-H", str(hostfile), "--ssh-config", str(config)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    # doctor's connect reached the silent port and now waits for a banner (it would wait 120 s)
    assert accepted[silent].wait(120), "doctor never connected"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)  # our own child
    try:
        _, err = proc.communicate(timeout=30)  # far below the 120 s connect: the doctor did not wait for it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err


def _env_value(pid: int, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return None
    prefix = name.encode() + b"="
    return next((e[len(prefix) :].decode() for e in entries if e.startswith(prefix)), None)


def test_ctrl_c_while_probes_hang_leaves_no_marked_process(sshd_cluster, tmp_path):
    """Ctrl-C while the master's listener hangs and the other hosts wait for it: killing the listener lets
    them go on, and none of them may start a probe after the final sweep."""
    marker = secrets.token_hex(6)
    fake = _hanging_python(tmp_path, marker)
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", 3, slots=1)
    args = ["-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config), "--remote-python", str(fake)]
    proc = subprocess.Popen(
        distlaunch_cmd("doctor", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )
    nonce = None
    try:
        # the listener's interpreter hangs on node1 (its child carries our marker): the doctor is mid-gather
        assert wait_until(lambda: pids_with_env("DOCTOR_TEST_MARK", marker), timeout=60), "the listener never started"
        nonce = next(
            filter(None, (_env_value(p, "DISTLAUNCH_DOCTOR_RUN") for p in pids_with_env("DOCTOR_TEST_MARK", marker)))
        )
        time.sleep(3)
        proc.send_signal(signal.SIGINT)  # our own child
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    def marked() -> list[int]:
        return sorted(set(pids_with_env("DOCTOR_TEST_MARK", marker) + pids_with_env("DISTLAUNCH_DOCTOR_RUN", nonce)))

    try:
        assert proc.returncode == 130, err
        assert "Traceback" not in err, err
        assert wait_until(lambda: not marked(), timeout=10), f"left running after Ctrl-C: {marked()}"
        time.sleep(1.5)  # a probe started after the sweep would be running by now
        assert not marked(), f"started after the sweep: {marked()}"
    finally:
        for pid in marked():  # what this test caused to run, by pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_free_port_probed_is_what_run_picks_for_auto(sshd_cluster, tmp_path):
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", 1, slots=1)
    rc, report, _ = doctor_cli("-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config))
    port = get(report, "master-port", "node1")
    assert rc == 0 and port["status"] == "pass" and "--master-port auto" in port["detail"]
    # MASTER_ADDR as run resolves it: the first host's address from ssh_config, as in run's plan
    plan = json.loads(
        run_cli(
            "run", "-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config), "--dry-run", "--json", "x.py"
        ).stdout
    )
    assert plan["master_addr"] in port["detail"], (plan, port)


def test_fixed_port_is_checked_as_given(sshd_cluster, tmp_path):
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", 1, slots=1)
    port = free_port()
    rc, report, _ = doctor_cli(
        "-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config), "--master-port", str(port)
    )
    assert rc == 0 and f":{port} is free" in get(report, "master-port", "node1")["detail"]
    rc, report, _err = doctor_cli("-H", str(hostfile), "--master-port", "http")
    assert rc == 2 and "--master-port 'http' is not a port" in get(report, "master-port", "(local)")["detail"]


def test_a_port_an_open_connection_uses_fails_in_doctor_as_in_run(sshd_cluster, tmp_path):
    """Nothing listens on it and MASTER_ADDR:PORT alone binds, but rank 0's store binds every address."""
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", 1, slots=2)
    config = str(sshd_cluster.ssh_config)
    with socket.create_server(("127.0.0.1", 0)) as server, socket.socket() as taker:
        port = free_port()
        taker.bind(("127.0.0.1", port))  # an outgoing connection from this port, as any client's
        taker.connect(server.getsockname())
        rc, report, err = doctor_cli("-H", str(hostfile), "--ssh-config", config, "--master-port", str(port))
        job = run_cli("run", "-H", str(hostfile), "--ssh-config", config, "--master-port", str(port), *ALLREDUCE)
    check = get(report, "master-port", "node1")
    assert rc == 1 and check["status"] == "fail", check
    assert "a connection on this host uses it as its local port" in check["detail"] and "Traceback" not in err
    assert job.returncode != 0 and "all_reduce" not in job.stdout, job.stdout  # the job cannot run either
    assert "an open connection uses it" in job.stderr, job.stderr

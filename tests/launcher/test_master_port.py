"""A fixed --master-port that is already taken on the local master is refused before any rank starts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid

from tests.helpers import run_cli


def test_a_taken_fixed_master_port_is_refused_before_start(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(marker)!r}, 'a').close()\n")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for dry in ([], ["--dry-run"]):  # a dry-run says what the run would refuse
            r = run_cli("run", "-n", "2", "--master-port", str(port), *dry, str(script), timeout=60)
            assert r.returncode == 2, r.stdout + r.stderr
            assert r.stderr.count("\n") == 1, r.stderr
            assert r.stderr.startswith(f"error: --master-port {port} is already in use on this machine (the master): ")
            assert f"pid {os.getpid()} (" in r.stderr and "--master-port auto" in r.stderr
            assert not marker.exists()  # no rank started
    free = run_cli("run", "-n", "2", "--master-port", str(port), str(script), timeout=60)
    assert free.returncode == 0 and marker.exists(), free.stderr


def test_two_jobs_started_at_once_on_one_fixed_port_never_share_it(tmp_path):
    """Nothing listens on the port until rank 0 starts its store: the first job holds the port from its
    launch on, so a second launch at that moment is refused instead of joining the first job's store."""
    from distlaunch.contract.endpoint import free_port
    from tests.helpers import distlaunch_cmd, left_behind

    # The mark finds this job's processes among every process on the machine: a suite running beside this one
    # has a tmp_path of the same name, so the mark is random.
    port, mark = free_port(), uuid.uuid4().hex
    slow = tmp_path / "slow.py"  # waits before it would bind the store, holding the window open
    slow.write_text("import time\nprint('up', flush=True)\ntime.sleep(30)\n")
    first = subprocess.Popen(
        distlaunch_cmd("run", "-n", "1", "--master-port", str(port), "--env", f"DLTEST_MARK={mark}", str(slow)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = first.stdout.readline()  # the first job runs; nothing listens on the port yet
        assert "up" in line, line or f"the first job ended (code {first.wait()}): {first.stderr.read()}"
        second = run_cli("run", "-n", "1", "--master-port", str(port), str(slow), timeout=60)
        assert second.returncode == 2, second.stdout + second.stderr
        assert second.stderr.startswith(f"error: --master-port {port} is held by distlaunch job dl-"), second.stderr
        assert second.stderr.count("\n") == 1
    finally:
        first.terminate()  # our own child
        first.communicate(timeout=30)
    assert not (left := left_behind("DLTEST_MARK", mark, 10)), f"the first job's processes outlived it: {left}"
    again = run_cli("run", "-n", "1", "--master-port", str(port), "--", sys.executable, "-c", "pass", timeout=60)
    assert again.returncode == 0, again.stderr  # released when the first job ended


def test_an_auto_port_lies_outside_the_range_outgoing_connections_draw_from():
    """An auto port is free when chosen and bound by rank 0 seconds later. Any outgoing connection
    on the machine takes its local port from the kernel's ephemeral range, so a port from there could
    be gone by then (rank 0: EADDRINUSE); one outside it can only be taken by an explicit bind."""
    from distlaunch.contract.endpoint import ephemeral_ports, free_port

    ephemeral = ephemeral_ports()
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as out:
        assert out.getsockname()[1] in ephemeral  # where outgoing connections' ports come from
    plan = json.loads(run_cli("run", "-n", "2", "--dry-run", "--json", "--", sys.executable, "-c", "pass").stdout)
    ports = [plan["master_port"], *(free_port() for _ in range(200))]
    assert [port for port in ports if port in ephemeral] == []
    for port in ports[1:20]:  # and free: rank 0 can bind it
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_fixed_port_an_open_connection_uses_is_refused_before_start(tmp_path):
    """Nothing listens on a connection's local port, yet rank 0's store could not bind it."""
    marker = tmp_path / "ran"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(marker)!r}, 'a').close()\n")
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as out:
        port = out.getsockname()[1]
        r = run_cli("run", "-n", "2", "--master-port", str(port), str(script), timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert r.stderr.startswith(
        f"error: --master-port {port} is already in use on this machine (the master): an open connection uses it"
    )
    assert not marker.exists()  # no rank started


def test_a_process_holding_the_port_on_several_addresses_is_named_once(tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    with socket.socket() as first, socket.socket() as second:
        first.bind(("127.0.0.1", 0))
        port = first.getsockname()[1]
        second.bind(("127.0.0.2", port))
        first.listen()
        second.listen()
        r = run_cli("run", "-n", "1", "--master-port", str(port), str(script), timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count(f"pid {os.getpid()} (") == 1, r.stderr
    assert "listens on 127.0.0.1, 127.0.0.2" in r.stderr or "listens on 127.0.0.2, 127.0.0.1" in r.stderr, r.stderr

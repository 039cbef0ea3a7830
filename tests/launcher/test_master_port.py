"""A fixed --master-port that is already taken on the local master is refused before any rank starts."""

from __future__ import annotations

import os
import socket

from tests.helpers import run_cli


def test_a_taken_fixed_master_port_is_refused_before_start(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(marker)!r}, 'a').close()\n")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = run_cli("run", "-n", "2", "--master-port", str(port), str(script), timeout=60)
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"error: --master-port {port} is already in use on this machine (the master): ")
        assert f"pid {os.getpid()} (" in r.stderr and "--master-port auto" in r.stderr
        assert not marker.exists()  # no rank started
    free = run_cli("run", "-n", "2", "--master-port", str(port), str(script), timeout=60)
    assert free.returncode == 0 and marker.exists(), free.stderr

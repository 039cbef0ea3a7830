"""Hosts whose clocks disagree: a rank's exit is read on the launcher's clock, so the failure table's times and
the root cause (the earliest failure) hold. Real sshd on loopback; node2's agent runs with its clock 30 s behind
(a sitecustomize on the PYTHONPATH of the interpreter it is started with, chosen by the address sshd answered on)."""

from __future__ import annotations

import json
import sys

import pytest

from distlaunch.protocol import clock_offset
from tests.helpers import run_cli
from tests.remote.test_multihost import WORKER, cli_env

BEHIND_S = 30.0


def test_an_exit_on_a_host_whose_clock_is_behind_is_timed_on_the_launchers_clock(sshd_cluster, tmp_path):
    skew = tmp_path / "skew"
    skew.mkdir()
    (skew / "sitecustomize.py").write_text(f"import time\n_now = time.time\ntime.time = lambda: _now() - {BEHIND_S}\n")
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        f'case "$SSH_CONNECTION" in *" {sshd_cluster.addresses[1]} "*) export PYTHONPATH={skew} ;; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hostfile", nhosts=2, slots=1)
    r = run_cli(
        "run", "-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config), "--remote-python", str(python),
        "--grace-period", "1", "--json", WORKER, "hold", "1", "7",
        env=cli_env(), timeout=120,
    )  # fmt: skip
    assert r.returncode == 7, r.stderr[-3000:]
    (failure,) = json.loads(r.stdout)["failures"]
    assert (failure["rank"], failure["host"], failure["exit_code"]) == (1, "node2", 7), failure
    # rank 1 fails a second after it starts: read on node2's clock, that was 29 s before the job began
    assert 0.5 < failure["time_s"] < 20, failure


def test_the_offset_is_never_more_than_the_true_one_and_zero_within_the_start_up_time():
    sent, heard = 1000.0, 1000.8  # our clock: the agent started, then its hello arrived
    assert clock_offset(1000.3, sent, heard) == 0.0  # agreeing clocks: no correction at all
    assert clock_offset(1000.3 - BEHIND_S, sent, heard) == pytest.approx(-29.7)  # its hello at 1000.3: 29.7 of 30 s
    assert clock_offset(1000.3 + 5, sent, heard) == pytest.approx(4.5)  # its hello at 1000.3: 4.5 of 5 s
    for true_offset in (-7.0, -0.5, 0.0, 0.2, 3.0):
        for at in (sent, 1000.4, heard):  # whenever in the window it said hello, it is never overcorrected
            found = clock_offset(at + true_offset, sent, heard)
            assert abs(found) <= abs(true_offset) + 1e-9 and found * true_offset >= 0, (true_offset, at, found)
    assert clock_offset(None, sent, heard) == 0.0 and clock_offset("soon", sent, heard) == 0.0
    assert clock_offset(True, sent, heard) == 0.0

"""``distlaunch doctor`` through the CLI: this machine only, the table, exit codes, --bench, no torch import."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import invoke

from tests.doctor.conftest import assert_healthy, doctor, free_port


def test_this_machine_only_passes():
    run = doctor("--master-port", str(free_port()))
    assert run.exit_code == 0 and run.report["ok"] is True
    assert_healthy(run, "localhost", local=True)
    assert run.status("hostfile", "(local)") == "pass"


def test_the_ranks_workdir_and_python_are_checked_as_run_would_use_them(tmp_path):
    """--workdir and --python change what is checked: the folder the ranks start in, the interpreter they run
    (a relative one from that folder), whose torch is the one judged."""
    (tmp_path / "venv").symlink_to(sys.prefix)  # this interpreter's environment, torch included
    python = f"venv/bin/{Path(sys.executable).name}"
    good = doctor("--master-port", str(free_port()), "--workdir", str(tmp_path), "--python", python)
    assert good.exit_code == 0, good.report
    assert good.get("workdir", "localhost")["detail"].startswith(f"{tmp_path} ")
    assert good.status("python", "localhost") == "pass"
    missing = str(tmp_path / "gone")
    bad = doctor("--master-port", str(free_port()), "--workdir", missing, "--python", python)
    assert bad.exit_code == 1
    workdir, found = bad.get("workdir", "localhost"), bad.get("python", "localhost")
    assert workdir["status"] == "fail" and f"{missing} does not exist" in workdir["detail"], workdir
    assert found["status"] == "fail" and f"{missing}/{python} could not run" in found["detail"], found
    assert bad.status("torch-version", "localhost") == "skip"  # the ranks' torch: their interpreter did not run


def test_table_groups_by_host_with_fix_and_verdict(sshd_cluster, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\nnowhere.invalid slots=2\n", encoding="utf-8")
    result = invoke(
        ["doctor", "-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config), "--master-port", str(free_port())]
    )
    assert result.exit_code == 1
    out = result.stdout
    assert "node1" in out and "nowhere.invalid" in out
    assert (
        "FAIL" in out
        and "fix:" in out
        and "troubleshooting.md#dns" in out.replace("\n", "").replace("│", "").replace(" ", "")
    )
    assert out.strip().splitlines()[-1].startswith("NOT READY: 1 check failed on nowhere.invalid")


def test_bad_hostfile_is_a_usage_error(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 gpus=8\n", encoding="utf-8")
    run = doctor("-H", str(hostfile))
    assert run.exit_code == 2  # as for run: the input is wrong, no host was checked
    found = run.get("hostfile", "(local)")
    assert found["status"] == "fail" and "line 1" in found["detail"] and "slots=8" in found["hint"]
    plain = invoke(["doctor", "-H", str(hostfile)])  # without --json: one line, as run says it
    assert plain.exit_code == 2 and plain.stdout == ""
    assert plain.stderr.startswith("error: hostfile ") and len(plain.stderr.strip().splitlines()) == 1, plain.stderr


def test_parallel_that_does_not_fit_fails(tmp_path):
    run = doctor("-n", "2", "--parallel", "tp=4", "--master-port", str(free_port()))
    assert run.exit_code == 1 and run.status("parallel", "(local)") == "fail"


@pytest.mark.parametrize(
    "spec, words",
    [
        ("foo=1", "unknown entry 'foo=1'"),
        ("tp=0", "tp=0 must be at least 1"),
        ("zero=9", "zero=9 is not a ZeRO stage"),
        ("dp=2,dp=3", "dp is given twice"),
    ],
)
def test_a_parallel_spec_that_does_not_parse_is_refused_before_any_host(tmp_path, spec, words):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\nnowhere.invalid slots=2\n", encoding="utf-8")  # never looked up
    run = doctor("-H", str(hostfile), "--parallel", spec)
    assert run.exit_code == 2, run.report
    [found] = run.report["checks"]  # no host was checked
    assert (found["id"], found["status"]) == ("parallel", "fail") and words in found["detail"], found
    plain = invoke(["doctor", "-H", str(hostfile), "--parallel", spec])
    assert plain.exit_code == 2 and plain.stdout == ""
    lines = plain.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], plain.stderr


def test_this_machines_names_ignore_case(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("LOCALHOST slots=1\n", encoding="utf-8")
    run = doctor("-H", str(hostfile), "--master-port", str(free_port()))
    assert run.exit_code == 0, run.report  # not 'connection refused by LOCALHOST:22'
    assert run.get("ssh.connect", "LOCALHOST")["detail"] == "this machine: no SSH needed"
    assert_healthy(run, "LOCALHOST", local=True)


def _failed(run) -> set[tuple[str, str]]:
    return {(c["id"], c["status"]) for c in run.report["checks"] if c["status"] in ("fail", "warn")}


def test_a_master_address_that_does_not_resolve_fails_once(tmp_path):
    """Only the real finding (MASTER_ADDR does not resolve) fails: checks that need to know where the master is
    skip and say why, instead of failing again (loopback-hostname) or warning of no route (nic)."""
    run = doctor("--master-addr", "nosuchhost.invalid", "--master-port", str(free_port()))
    assert run.exit_code == 1
    assert _failed(run) == {("dns", "fail"), ("master-port", "fail")}, run.report
    nic = run.get("nic", "localhost")
    assert nic["status"] == "skip" and "does not resolve" in nic["detail"] and "see dns" in nic["detail"]
    assert run.status("loopback-hostname", "localhost") in ("pass", "skip")


def test_a_master_address_of_another_machine_fails_only_master_port(tmp_path):
    """This machine only: ranks on other hosts there are none, so this machine's hostname is no problem."""
    run = doctor("--master-addr", "10.255.255.1", "--master-port", str(free_port()))
    assert run.exit_code == 1
    assert _failed(run) == {("master-port", "fail")}, run.report
    assert "is not an address of localhost" in run.get("master-port", "localhost")["detail"]


@pytest.fixture
def port_65535():
    """The highest port held by a real listener of ours on 127.0.0.1 (or already held by someone else)."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 65535))
        sock.listen()
    except OSError:
        pass  # in use already: the doctor finds it held either way
    yield
    sock.close()


def test_the_port_suggested_for_a_held_65535_exists(port_65535):
    run = doctor("--master-port", "65535")
    held = run.get("master-port", "localhost")
    assert run.exit_code == 1 and held["status"] == "fail"
    suggested = int(re.search(r"--master-port (\d+)", held["hint"]).group(1))
    assert 1024 <= suggested <= 65534, held


def test_bench_measures_allreduce_bandwidth():
    run = doctor("-n", "2", "--bench", "--bench-max", "64K", "--master-port", str(free_port()))
    assert run.exit_code == 0, run.report
    bench = run.report["bench"]
    assert bench["backend"] == "gloo" and bench["world_size"] == 2
    assert [r["bytes"] for r in bench["rows"]] == [1 << k for k in range(10, 17)]
    for row in bench["rows"]:
        assert row["busbw_gbs"] == row["algbw_gbs"] * 1.0 > 0  # 2(n-1)/n = 1 for two ranks
        assert abs(row["algbw_gbs"] - row["bytes"] / row["seconds"] / 1e9) < 1e-9
    assert run.status("bench", "(local)") == "pass"


def test_doctor_imports_no_torch():
    code = "import sys, distlaunch.doctor, distlaunch.cli.doctor; print(json.dumps('torch' in sys.modules))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) is False

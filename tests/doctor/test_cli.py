"""``distlaunch doctor`` through the CLI: this machine only, the table, exit codes, --bench, no torch import."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import invoke

from tests.doctor.conftest import assert_healthy, doctor, free_port


def test_this_machine_only_passes():
    run = doctor("--master-port", str(free_port()))
    assert run.exit_code == 0 and run.report["ok"] is True
    assert_healthy(run, "localhost", local=True)
    assert run.status("hostfile", "(local)") == "pass"


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
    assert out.strip().splitlines()[-1].startswith("NOT READY: 1 check(s) failed on nowhere.invalid")


def test_bad_hostfile_is_a_usage_error(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 gpus=8\n", encoding="utf-8")
    run = doctor("-H", str(hostfile))
    assert run.exit_code == 2  # as for run: the input is wrong, no host was checked
    found = run.get("hostfile", "(local)")
    assert found["status"] == "fail" and "line 1" in found["detail"] and "slots=8" in found["hint"]


def test_parallel_that_does_not_fit_fails(tmp_path):
    run = doctor("-n", "2", "--parallel", "tp=4", "--master-port", str(free_port()))
    assert run.exit_code == 1 and run.status("parallel", "(local)") == "fail"


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

"""The hosts decide, against real sshd daemons whose sessions see simulated GPUs and memory
(tests/fixtures/hardware.py): typed on this machine, which has none, a job to GPU hosts plans nccl on cuda devices;
hosts that disagree are refused before any rank starts; CPU ranks count on the memory of their hosts; what the hosts
reported is kept a while, and forgotten after a failed preflight."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.sshd import start_sshd
from helpers import invoke

from distlaunch.contract.inventory import HostInventory
from distlaunch.jobs.inventories import cache_key, remember
from distlaunch.launcher.planning.decisions import PENDING_HOST_MEMORY
from tests.doctor.conftest import host_block, write_config
from tests.fixtures.hardware import FakeGpu, Hardware

TWO_GPUS = Hardware(gpus=[FakeGpu("0000:18:00.0"), FakeGpu("0000:9a:00.0", numa="1")], nodes={"node0": "0-1"})
SMALL = Hardware(meminfo="MemTotal:          16384 kB\nMemAvailable:      12288 kB\n")  # 16 MiB: no rank fits
OK = Path(__file__).parent / "ok_rank.py"  # a rank that does nothing
MARK = "import os, pathlib; pathlib.Path({path!r}, os.environ['RANK']).write_text(os.environ['DISTLAUNCH_BACKEND'])\n"


@pytest.fixture(scope="module")
def gpu_hosts(tmp_path_factory):
    """node1 and node2: one sshd whose sessions see two GPUs each."""
    root = tmp_path_factory.mktemp("gpu-hosts")
    prefix = tuple(TWO_GPUS.prefix(root / "hw"))
    cluster = start_sshd(root / "sshd", addresses=["127.0.0.11", "127.0.0.12"], prefix=prefix)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def small_host(tmp_path_factory):
    """small: an sshd whose sessions see a host of 16 MiB."""
    root = tmp_path_factory.mktemp("small-host")
    cluster = start_sshd(root / "sshd", addresses=["127.0.0.14"], prefix=tuple(SMALL.prefix(root / "hw")))
    yield cluster
    cluster.stop()


def launch(hostfile: Path, config: Path, *args: str):
    return invoke(["run", "-H", str(hostfile), "--ssh-config", str(config), *args])


def test_a_dry_run_contacts_no_host_and_says_the_hosts_decide_at_start(gpu_hosts, tmp_path):
    hostfile = gpu_hosts.write_hostfile(tmp_path / "hosts", 2)
    result = launch(hostfile, gpu_hosts.ssh_config, "--dry-run", str(OK))
    assert result.exit_code == 0, result.stderr
    assert "backend: from the hosts at start (nccl where every host has GPUs, else gloo)" in result.stdout
    assert "at start" in result.stdout.split("devices")[1]
    plan = json.loads(launch(hostfile, gpu_hosts.ssh_config, "--dry-run", "--json", str(OK)).stdout)
    assert plan["backend"] == "auto" and plan["decisions"] is None


def test_probe_reads_the_hosts_and_the_next_plan_is_decided_at_once(gpu_hosts, tmp_path):
    hostfile = gpu_hosts.write_hostfile(tmp_path / "hosts", 2)
    result = launch(hostfile, gpu_hosts.ssh_config, "-n", "gpu", "--dry-run", "--probe", "--json", str(OK))
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["backend"] == "nccl" and plan["decisions"]["gpus"] == {"node1": 2, "node2": 2}
    assert [[r["device"] for r in n["ranks"]] for n in plan["nodes"]] == [["cuda:0", "cuda:1"]] * 2
    assert plan["nodes"][1]["ranks"][0]["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    again = json.loads(launch(hostfile, gpu_hosts.ssh_config, "-n", "gpu", "--dry-run", "--json", str(OK)).stdout)
    assert again["backend"] == "nccl" and again["world_size"] == 4
    assert again["decisions"]["source"] == "the hosts, as they reported just now"


def test_typed_without_gpus_to_gpu_hosts_it_starts_nccl_whose_ranks_fail_in_one_line(gpu_hosts, tmp_path):
    """This machine has no GPU; the hosts report two each: nccl, and the engine's ranks, finding no real CUDA
    under the simulated files, say so in one line. The same hosts with --backend gloo train."""
    hostfile = gpu_hosts.write_hostfile(tmp_path / "hosts", 2, slots=1)
    train = ["train", "-H", str(hostfile), "--ssh-config", str(gpu_hosts.ssh_config), "--set", "train.steps=2"]
    failed = invoke(train)
    assert failed.exit_code == 2, failed.stdout + failed.stderr
    lines = [line for line in failed.stderr.splitlines() if "the job's backend is nccl, but torch" in line]
    assert lines and "Traceback" not in failed.stderr, failed.stderr
    trained = invoke([*train, "--backend", "gloo"])
    assert trained.exit_code == 0, trained.stdout + trained.stderr


def test_hosts_that_disagree_are_refused_before_any_rank_starts(gpu_hosts, sshd_cluster, tmp_path):
    config = write_config(
        tmp_path / "ssh_config",
        gpu_hosts,
        host_block("cpu1", "127.0.0.13", sshd_cluster.port, sshd_cluster.user_key, sshd_cluster.known_hosts),
    )
    (tmp_path / "hosts").write_text("node1\ncpu1\n")
    script = tmp_path / "mark.py"
    script.write_text(MARK.format(path=str(tmp_path)))
    result = launch(tmp_path / "hosts", config, str(script))
    assert result.exit_code == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cpu1 has 0 GPUs but node1 has 2 GPUs" in errors[0], result.stderr
    assert "--backend gloo" in errors[0] and not list(tmp_path.glob("[0-9]"))  # no rank wrote its mark
    gloo = launch(tmp_path / "hosts", config, "--backend", "gloo", str(script))
    assert gloo.exit_code == 0, gloo.stderr
    assert sorted(p.read_text() for p in tmp_path.glob("[0-9]")) == ["gloo", "gloo"]


def test_cpu_ranks_count_on_the_memory_of_their_hosts_and_the_smallest_is_named(sshd_cluster, small_host, tmp_path):
    """This machine has memory enough; small, one of the hosts, has 16 MiB: its share decides, never ours."""
    s = small_host
    config = write_config(
        tmp_path / "ssh_config", sshd_cluster, host_block("small", "127.0.0.14", s.port, s.user_key, s.known_hosts)
    )
    (tmp_path / "hosts").write_text("node1 slots=1\nsmall slots=1\n")
    train = ["train", "-H", str(tmp_path / "hosts"), "--ssh-config", str(config), "--backend", "gloo", "--dry-run"]
    pending = invoke(train)  # contacts no host: says where the figure will come from
    assert pending.exit_code == 0, pending.stdout + pending.stderr
    assert f"memory per rank {PENDING_HOST_MEMORY}" in " ".join(pending.stdout.split())
    probed = invoke([*train, "--probe"])
    assert probed.exit_code == 2, probed.stdout + probed.stderr
    errors = [line for line in probed.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the plan does not fit" in errors[0], probed.stderr
    assert "of 16.0 MiB per rank (MemTotal of small / 1 rank)" in errors[0]


def test_what_the_hosts_reported_is_not_trusted_past_a_failed_preflight(sshd_cluster, tmp_path):
    c = sshd_cluster
    config = write_config(
        tmp_path / "ssh_config", c, host_block("nolisten", "127.0.0.99", c.port, c.user_key, c.known_hosts)
    )
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1\nnolisten\n")
    two = HostInventory.model_validate(TWO_GPUS_INVENTORY)
    remember(cache_key(hostfile, config), {"node1": two, "nolisten": two})
    plan = json.loads(launch(hostfile, config, "--dry-run", "--json", str(OK)).stdout)
    assert plan["backend"] == "nccl"  # as they reported
    assert launch(hostfile, config, str(OK)).exit_code == 3  # nolisten refuses the connection
    plan = json.loads(launch(hostfile, config, "--dry-run", "--json", str(OK)).stdout)
    assert plan["backend"] == "auto" and plan["decisions"] is None


TWO_GPUS_INVENTORY = {"gpus": [{"index": i, "model": "NVIDIA H100 80GB HBM3"} for i in range(2)]}


def test_probe_without_dry_run_is_one_line():
    result = invoke(["run", "--probe", str(OK)])
    assert result.exit_code == 2 and "--probe without --dry-run" in result.stderr


def test_where_this_machine_runs_the_ranks_its_own_inventory_decides(tmp_path):
    """No hostfile: this machine is the host, probed as an agent probes (here, with two simulated GPUs)."""
    command = [*TWO_GPUS.prefix(tmp_path / "hw"), sys.executable, "-m", "distlaunch", "run", "--dry-run", "--json"]
    done = subprocess.run([*command, str(OK)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["backend"] == "nccl" and [r["device"] for r in plan["nodes"][0]["ranks"]] == ["cuda:0", "cuda:1"]
    assert plan["decisions"]["source"] == "this machine"

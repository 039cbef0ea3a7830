"""``distlaunch hosts`` against real sshd daemons: every host answers with its own inventory (a daemon whose
sessions see simulated GPUs and NUMA nodes reports those), and a host that cannot be reached is one line."""

from __future__ import annotations

import io
import json

import pytest
from fixtures.sshd import start_sshd
from helpers import invoke
from rich.console import Console

from distlaunch.cli.hosts_render import render_hosts
from distlaunch.contract.inventory import HostInventory
from distlaunch.doctor.hosts import HostAnswer, HostsReport
from tests.doctor.conftest import host_block, write_config
from tests.fixtures.hardware import FakeGpu, Hardware

GPU_HOST = Hardware(
    gpus=[FakeGpu("0000:18:00.0", numa="0"), FakeGpu("0000:9a:00.0", numa="1")],
    nodes={"node0": "0-3", "node1": "4-7"},
    driver_version="NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n",
)


def hosts(*args: str) -> tuple[int, dict]:
    result = invoke(["hosts", *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def test_every_host_of_the_hostfile_reports_its_inventory(sshd_cluster, tmp_path):
    hostfile = sshd_cluster.write_hostfile(tmp_path / "hosts", 3)
    code, report = hosts("-H", str(hostfile), "--ssh-config", str(sshd_cluster.ssh_config))
    assert code == 0 and report["ok"] is True
    assert [h["host"] for h in report["hosts"]] == ["node1", "node2", "node3"]
    for answer in report["hosts"]:
        inventory = HostInventory.model_validate(answer["inventory"])
        assert inventory.interface_toward("127.0.0.11").name == "lo" and inventory.cpus


def test_a_host_that_cannot_be_reached_is_one_line_and_exit_3(sshd_cluster, tmp_path):
    c = sshd_cluster
    config = write_config(
        tmp_path / "ssh_config", c, host_block("nolisten", "127.0.0.99", c.port, c.user_key, c.known_hosts)
    )
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1\nnolisten\n")
    result = invoke(["hosts", "-H", str(hostfile), "--ssh-config", str(config)])
    assert result.exit_code == 3, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("nolisten")]
    assert len(lines) == 1 and "refused" in lines[0], result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    code, report = hosts("-H", str(hostfile), "--ssh-config", str(config))
    assert code == 3 and report["hosts"][1]["check"] == "ssh.connect" and report["hosts"][1]["inventory"] is None
    assert report["hosts"][0]["inventory"] is not None  # the host beside it still answers


def test_a_host_with_simulated_gpus_reports_them(tmp_path):
    """An sshd in a mount namespace of its own, over simulated driver and sysfs files: its sessions, and so the
    probe, see two GPUs on two NUMA nodes."""
    cluster = start_sshd(tmp_path / "sshd", addresses=["127.0.0.11"], prefix=tuple(GPU_HOST.prefix(tmp_path / "hw")))
    try:
        code, report = hosts(
            "-H", str(cluster.write_hostfile(tmp_path / "hosts", 1)), "--ssh-config", str(cluster.ssh_config)
        )
    finally:
        cluster.stop()
    assert code == 0, report
    inventory = HostInventory.model_validate(report["hosts"][0]["inventory"])
    assert [(g.model, g.numa_node) for g in inventory.gpus] == [
        ("NVIDIA H100 80GB HBM3", 0),
        ("NVIDIA H100 80GB HBM3", 1),
    ]
    assert inventory.cuda_driver == "550.54.15" and [n.id for n in inventory.numa_nodes] == [0, 1]


def test_without_a_hostfile_this_machine_answers():
    code, report = hosts()
    assert code == 0 and [h["host"] for h in report["hosts"]] == ["localhost"]


@pytest.fixture
def big_host() -> HostInventory:
    return HostInventory.model_validate(
        {
            "gpus": [
                {"index": i, "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "numa_node": i // 4}
                for i in range(8)
            ],
            "cpus": 224,
            "affinity": "0-223",
            "numa_nodes": [{"id": 0, "cpus": "0-55,112-167"}, {"id": 1, "cpus": "56-111,168-223"}],
            "interfaces": [
                {"name": "lo", "up": True, "state": "unknown", "addresses": ["127.0.0.1/8"]},
                {
                    "name": "enp170s0f0np0",
                    "up": True,
                    "state": "up",
                    "speed_mbps": 100000,
                    "addresses": ["10.224.17.35/20"],
                },
                {"name": "ib0", "up": True, "state": "up", "speed_mbps": 400000, "addresses": ["192.168.117.35/16"]},
            ],
            "ib_devices": [
                {
                    "name": f"mlx5_{i}",
                    "ports": [{"port": 1, "state": "ACTIVE", "rate_gbps": 400, "link_layer": "InfiniBand"}],
                }
                for i in range(4)
            ],
            "cuda_driver": "550.54.15",
            "nccl": "2.21.5",
        }
    )


def test_the_table_fits_80_columns(big_host):
    report = HostsReport(
        ok=False,
        hosts=[
            HostAnswer(host="gpu-node-017.cluster.example.org", inventory=big_host),
            HostAnswer(
                host="gpu-node-018", check="ssh.auth", error="authentication failed (user=me)", hint="add your key"
            ),
        ],
    )
    out = io.StringIO()
    render_hosts(report, Console(file=out, width=80, color_system=None))
    text = out.getvalue()
    assert not [line for line in text.splitlines() if len(line.rstrip()) > 80], text
    for word in (
        "gpu-node-017.cluster.example.org",
        "8 × NVIDIA H100 80GB HBM3",
        "enp170s0f0np0 up 100 Gb/s",
        "10.224.17.35/20",
        "mlx5_3:1 ACTIVE 400 Gb/s",
        "NCCL 2.21.5",
    ):
        assert any(word in line for line in text.splitlines()), f"{word!r} cut or missing:\n{text}"
    assert "1 of 2 hosts did not answer" in text
    assert sum(line.startswith("gpu-node-018: authentication failed") for line in text.splitlines()) == 1

"""The host inventory's probe (distlaunch/hostprobe.py) on simulated hardware: the driver's files and the sysfs
node, PCI and InfiniBand trees mounted in a namespace of the probe's own (tests/fixtures/hardware.py), so it
reports exactly what those files say, and nothing (never a traceback) where they are garbled or absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import distlaunch
from distlaunch.contract.inventory import HostInventory
from distlaunch.doctor.gather import PROBE_SOURCE
from distlaunch.hostprobe import bus_id, format_cpulist, inventory, parse_cpulist, parse_smi
from tests.fixtures.hardware import FakeGpu, Hardware

CHECKOUT = str(Path(distlaunch.__file__).parent.parent)
PROBE = "import json; from distlaunch.hostprobe import inventory; print(json.dumps(inventory()))"
DRIVER = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16)\n"
IB_PORT = {"state": "4: ACTIVE", "rate": "200 Gb/sec (4X HDR)", "link_layer": "InfiniBand"}
EIGHT_GPUS = Hardware(
    gpus=[
        FakeGpu(f"0000:{bus}:00.0", numa=str(i // 4))
        for i, bus in enumerate(("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"))
    ],
    nodes={"node0": "0-27,56-83", "node1": "28-55,84-111"},
    driver_version=DRIVER,
    ib={"mlx5_0": {"1": IB_PORT}, "mlx5_1": {"1": {**IB_PORT, "state": "1: DOWN"}}},
    meminfo="MemTotal:       528074752 kB\nMemFree:        10240000 kB\nMemAvailable:   509964288 kB\n",
)


def run_on(hw: Hardware, root: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``argv`` in a mount namespace where ``hw``'s files stand in for the host's."""
    env = {**os.environ, "PYTHONPATH": CHECKOUT}
    return subprocess.run([*hw.prefix(root), *argv], capture_output=True, text=True, env=env, input=stdin, timeout=60)


def probed(hw: Hardware, root: Path) -> dict:
    done = run_on(hw, root, sys.executable, "-c", PROBE)
    assert done.returncode == 0 and not done.stderr, done.stderr
    return json.loads(done.stdout)


def test_the_probe_reports_what_the_driver_and_sysfs_files_say(tmp_path):
    found = HostInventory.model_validate(probed(EIGHT_GPUS, tmp_path / "hw"))
    assert [g.model for g in found.gpus] == ["NVIDIA H100 80GB HBM3"] * 8 and found.gpu_source == "driver"
    assert [g.bus_id for g in found.gpus][4:6] == ["0000:9a:00.0", "0000:ab:00.0"]  # lower case, as sysfs names it
    assert [g.numa_node for g in found.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [(n.id, format_cpulist(n.cpus)) for n in found.numa_nodes] == [(0, "0-27,56-83"), (1, "28-55,84-111")]
    assert found.cuda_driver == "550.54.15"
    assert [d.name for d in found.ib_devices] == ["mlx5_0", "mlx5_1"] and found.ib_hcas() == ["mlx5_0:1"]
    assert found.ib_devices[0].ports[0].rate_gbps == 200.0
    assert (found.memory_mib, found.memory_available_mib) == (515698, 498012)  # /proc/meminfo's kB, in MiB
    assert found.interface("lo") is not None  # the host's own interfaces stay: /sys/class/net is the real one
    usable = set(found.affinity)
    assert found.gpu_cpus(5) == tuple(c for c in parse_cpulist("28-55,84-111") if c in usable)


def test_garbled_files_give_empty_facts_never_a_traceback(tmp_path):
    garbled = Hardware(
        gpus=[
            FakeGpu("0000:18:00.0", information="\x00\xff garbage without a colon\n::\n", numa="banana"),
            FakeGpu("0000:2a:00.0", numa="-1"),  # the kernel's "no node"
        ],
        nodes={"node0": "3-1", "node1": "x,y", "nodeX": "0-1", "node2": "0-1,,4"},
        driver_version="NVRM version: nothing like a version",
        ib={"mlx5_0": {"1": {"state": "", "rate": "fast", "link_layer": ""}, "p": {"state": "x"}}},
        meminfo="MemTotal: lots kB\nMemAvailable:\n",
    )
    found = HostInventory.model_validate(probed(garbled, tmp_path / "hw"))
    assert [(g.bus_id, g.model, g.numa_node) for g in found.gpus] == [
        ("0000:18:00.0", None, None),  # the bus id from the folder's name
        ("0000:2a:00.0", "NVIDIA H100 80GB HBM3", None),
    ]
    assert [(n.id, n.cpus) for n in found.numa_nodes] == [(2, (0, 1, 4))]  # the others' lists are garbled
    assert found.cuda_driver is None and (found.memory_mib, found.memory_available_mib) == (None, None)
    assert [p.model_dump() for p in found.ib_devices[0].ports] == [
        {"port": 1, "state": None, "rate_gbps": None, "link_layer": None}
    ]


def test_absent_files_give_no_gpus_and_no_numa_nodes(tmp_path):
    found = HostInventory.model_validate(probed(Hardware(), tmp_path / "hw"))
    assert (found.gpus, found.gpu_source, found.numa_nodes, found.ib_devices, found.cuda_driver) == (
        [],
        None,
        [],
        [],
        None,
    )
    assert found.gpu_cpus(0) == () and found.cpus == os.cpu_count()


def test_the_agents_hello_carries_the_hosts_inventory(tmp_path):
    """The agent says hello with the inventory before it reads its plan (stdin closed: it ends there)."""
    done = run_on(EIGHT_GPUS, tmp_path / "hw", sys.executable, "-m", "distlaunch.agent", stdin="")
    hello = json.loads(done.stdout.splitlines()[0])
    assert hello["ev"] == "hello" and hello["protocol"] == 4
    found = HostInventory.of(hello["inventory"])
    assert found is not None and found.gpu_count == 8 and found.ib_hcas() == ["mlx5_0:1"]


def test_the_doctors_probe_runs_on_a_bare_interpreter_with_the_shared_probe(tmp_path):
    """The doctor sends hostprobe.py's source, then its own, to an interpreter without distlaunch (-I -S: no
    site-packages, no PYTHONPATH); its facts hold the inventory."""
    done = run_on(EIGHT_GPUS, tmp_path / "hw", sys.executable, "-I", "-S", "-", "{}", stdin=PROBE_SOURCE)
    assert done.returncode == 0 and not done.stderr, done.stderr
    facts = json.loads(done.stdout)
    assert facts["ev"] == "probe" and HostInventory.of(facts["inventory"]).gpu_count == 8


def test_the_two_probes_define_no_name_twice():
    """Sent as one program, a name of the doctor's probe would replace the shared probe's own (its read, its run)."""
    import ast

    def top_names(path: str) -> set[str]:
        tree = ast.parse(Path(path).read_text())
        return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)} | {
            t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
        }

    from distlaunch import hostprobe
    from distlaunch.doctor import probe_script

    assert not top_names(hostprobe.__file__) & top_names(probe_script.__file__)


def test_this_machines_inventory_parses_and_is_quick():
    import time

    started = time.perf_counter()
    found = HostInventory.of(inventory())
    assert time.perf_counter() - started < 1.0
    assert found is not None and found.interface("lo") is not None


@pytest.mark.parametrize(
    ("text", "cpus"), [("0-3,8,10-11", [0, 1, 2, 3, 8, 10, 11]), ("", []), ("5", [5]), ("2-1", None), ("a", None)]
)
def test_cpulists_in_the_kernels_syntax(text, cpus):
    assert parse_cpulist(text) == cpus
    if cpus:
        assert format_cpulist(cpus) == text


def test_nvidia_smis_rows_and_bus_ids():
    text = (
        "0, 00000000:18:00.0, NVIDIA H100 80GB HBM3, 81559, GPU-5c1b, 550.54.15\n"
        "1, 00000000:2A:00.0, NVIDIA H100 80GB HBM3, [N/A], GPU-77aa, 550.54.15\n"
        "garbage line\n"
    )
    rows = parse_smi(text)
    assert [(r["index"], r["bus_id"], r["memory_mib"]) for r in rows] == [
        (0, "0000:18:00.0", 81559),
        (1, "0000:2a:00.0", None),
    ]
    assert bus_id("18:00.0") == "0000:18:00.0" and bus_id("not a bus") is None


def test_the_interface_toward_an_address():
    inv = HostInventory.model_validate(
        {
            "interfaces": [
                {"name": "lo", "up": True, "addresses": ["127.0.0.1/8"]},
                {"name": "eth0", "up": True, "addresses": ["10.0.0.5/16"]},
                {"name": "ib0", "up": True, "addresses": ["10.0.7.5/24"]},
                {"name": "eth1", "up": False, "addresses": ["192.168.0.5/24"]},
            ],
            "default_interface": "eth0",
        }
    )
    assert inv.interface_toward("10.0.7.1").name == "ib0"  # the longest prefix
    assert inv.interface_toward("10.0.9.1").name == "eth0"
    assert inv.interface_toward("10.0.0.5").name == "eth0"  # its own address: the master itself
    assert inv.interface_toward("8.8.8.8").name == "eth0"  # the default route
    assert inv.interface_toward("192.168.0.1").name == "eth0"  # eth1 is down: the default route again
    assert inv.interface_toward("not an address") is None
    assert HostInventory.of({"gpus": "garbled"}) is None and HostInventory.of(None) is None


def test_this_machines_gpu_count_is_the_probes(tmp_path):
    """local_gpu_count (what this machine's own work, an srun task, reads) counts the GPUs through the probe."""
    count = "from distlaunch.launcher.planning.decisions import local_gpu_count; print(local_gpu_count())"
    done = run_on(EIGHT_GPUS, tmp_path / "hw", sys.executable, "-c", count)
    assert done.stdout.strip() == "8", done.stderr

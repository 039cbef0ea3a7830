"""Doctor across a real network boundary: an sshd inside a network namespace of its own (veth pair,
private 10.99.N.0/24 addresses, its own firewall and /etc/hosts) is the master; node1 of the loopback
test cluster must reach it. Firewall rules and /etc/hosts lines are real, only inside that namespace."""

from __future__ import annotations

import socket
import subprocess

import pytest
from helpers import run_cli

from distlaunch.contract.endpoint import free_port
from tests.doctor.conftest import doctor, host_block, write_config


@pytest.fixture
def two_networks(netns_host, sshd_cluster, tmp_path):
    """ssh_config and hostfile for: master ``nsnode`` (in the namespace) and ``node1`` (here, loopback)."""
    ns = netns_host.cluster
    config = write_config(
        tmp_path / "ssh_config",
        sshd_cluster,
        host_block("nsnode", netns_host.address, ns.port, ns.user_key, ns.known_hosts),
    )
    hostfile = tmp_path / "hosts"
    hostfile.write_text("nsnode slots=1\nnode1 slots=1\n", encoding="utf-8")
    port = free_port()
    netns_host.set_hosts(f"127.0.0.1 localhost\n{netns_host.address} {socket.gethostname()}\n")
    yield ["-H", str(hostfile), "--ssh-config", str(config), "--master-port", str(port)], port
    netns_host.ns("iptables", "-F", "INPUT")


@pytest.mark.parametrize(
    "rule, result", [(["-j", "DROP"], "timeout"), (["-j", "REJECT", "--reject-with", "tcp-reset"], "refused")]
)
def test_firewall_on_master_port(netns_host, two_networks, rule, result):
    args, port = two_networks
    # Only packets arriving over the veth: the master can still reach itself, as in a real cluster.
    netns_host.ns("iptables", "-A", "INPUT", "-i", netns_host.inside, "-p", "tcp", "--dport", str(port), *rule)
    run = doctor(*args, "--env", "NCCL_SOCKET_IFNAME=dld", "--env", "GLOO_SOCKET_IFNAME=lo")
    assert run.exit_code == 1
    reach = run.get("master-reachable", "node1")
    assert reach["status"] == "fail"
    if result == "timeout":
        assert "within" in reach["detail"] and "drops" in reach["detail"] and f"--dport {port}" in reach["hint"]
    else:
        assert "refused" in reach["detail"]
    assert run.status("master-port", "nsnode") == "pass"
    assert run.status("master-reachable", "nsnode") == "pass"
    assert run.status("ssh.auth", "nsnode") == "pass"
    assert run.status("loopback-hostname", "nsnode") == "pass"


def test_reachable_master_across_namespaces(netns_host, two_networks):
    args, _ = two_networks
    run = doctor(*args)
    assert run.status("master-reachable", "node1") == "pass"
    assert run.status("master-reachable", "nsnode") == "pass"
    nic = run.get("nic", "nsnode")
    # The master's route to its own address is 'lo'; the interface to name is the one that owns the address.
    assert nic["status"] == "pass" and f"via {netns_host.inside}" in nic["detail"]
    assert f"NCCL_SOCKET_IFNAME={netns_host.inside}" in nic["detail"]
    assert f"via {netns_host.outside}" in run.get("nic", "node1")["detail"]
    # nsnode and node1 are one kernel, reached at a non-loopback address: a real duplicate entry.
    dup = run.get("duplicate-host", "node1")
    assert dup["status"] == "fail" and "same machine as nsnode" in dup["detail"]


def job(args: list[str], *extra: str) -> subprocess.CompletedProcess:
    """The real gloo all-reduce on the same hosts and options as the doctor run."""
    return run_cli("run", *args, *extra, "-m", "distlaunch.examples.allreduce", timeout=180)


def test_hostname_resolving_to_loopback_warns_as_the_launch_names_the_card_and_the_job_runs(netns_host, two_networks):
    """nsnode's name resolves to 127.0.1.1 (Ubuntu's default line): gloo alone binds and advertises that address.
    The launch names every host's card toward the master (GLOO_SOCKET_IFNAME, planning/netcards.py), so the job
    runs, and the doctor, by the same rule, says so: a warning, with the fix for gloo started any other way."""
    args, _ = two_networks
    netns_host.set_hosts(f"127.0.0.1 localhost\n127.0.1.1 {socket.gethostname()}\n")  # Ubuntu's default line
    check = doctor(*args).get("loopback-hostname", "nsnode")
    assert check["status"] == "warn", check
    assert f"distlaunch sets GLOO_SOCKET_IFNAME={netns_host.inside} on nsnode" in check["detail"]
    assert "127.0.1.1" in check["detail"] and "/etc/hosts" in check["hint"]
    assert f"GLOO_SOCKET_IFNAME={netns_host.inside}" in check["hint"]
    done = job(args)
    assert done.returncode == 0, done.stderr  # as the doctor said
    assert f"GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME={netns_host.inside} on nsnode" in done.stderr
    nccl = doctor(*args, "--backend", "nccl").get("loopback-hostname", "nsnode")
    assert nccl["status"] == "warn"  # NCCL picks its interface itself


def test_nccl_variable_on_a_gloo_job_only_warns(netns_host, two_networks):
    args, _ = two_networks
    run = doctor(*args, "--env", "NCCL_SOCKET_IFNAME=ib", "--backend", "gloo")
    nic = run.get("nic", "node1")
    assert nic["status"] == "warn" and "harmless for this gloo job" in nic["detail"]


def test_heterogeneous_nic_names_get_one_value_for_every_host(netns_host, two_networks):
    args, _ = two_networks
    inside, outside = netns_host.inside, netns_host.outside  # the master's NIC and node1's NIC differ in name
    run = doctor(
        *args, "--backend", "nccl", "--env", f"NCCL_SOCKET_IFNAME={inside}", "--env", f"GLOO_SOCKET_IFNAME={inside}"
    )
    node1 = run.get("nic", "node1")
    assert node1["status"] == "fail"
    assert f"NCCL_SOCKET_IFNAME={inside}" in node1["detail"] and f"GLOO_SOCKET_IFNAME={inside}" in node1["detail"]
    assert f"NCCL_SOCKET_IFNAME={inside},{outside}" in node1["hint"]
    assert run.status("nic", "nsnode") == "pass"
    # gloo names must exist on every host: the gloo job with the master's name fails on node1, as doctor said
    run = doctor(*args, "--backend", "gloo", "--env", f"GLOO_SOCKET_IFNAME={inside}")
    assert run.status("nic", "node1") == "fail" and run.report["ok"] is False
    assert job(args, "--backend", "gloo", "--env", f"GLOO_SOCKET_IFNAME={inside}").returncode != 0


def test_socket_ifname_matching_no_interface(netns_host, two_networks):
    args, _ = two_networks
    run = doctor(
        *args, "--backend", "nccl", "--env", "NCCL_SOCKET_IFNAME=ib", "--env", f"GLOO_SOCKET_IFNAME={netns_host.inside}"
    )
    nsnode, node1 = run.get("nic", "nsnode"), run.get("nic", "node1")
    assert nsnode["status"] == "fail" and "NCCL_SOCKET_IFNAME=ib matches no interface" in nsnode["detail"]
    assert node1["status"] == "fail"
    run = doctor(*args, "--env", f"GLOO_SOCKET_IFNAME={netns_host.inside}")
    assert run.status("nic", "nsnode") == "pass"
    gloo = run.get("nic", "node1")  # the namespace's interface name does not exist on this side
    assert gloo["status"] == "fail" and f"{netns_host.inside} is not an interface" in gloo["detail"]

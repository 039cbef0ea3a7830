"""Per-node mode across a real network boundary: node 0 runs in a network namespace of its own (a veth pair,
10.99.N.2 there, its own /etc/hosts) and serves the nodes' store there; node 1 runs here. Without
--master-addr, node 0 publishes the address the other nodes reach it at, by the rule a hostfile launch uses:
never a name that resolves to this side's loopback."""

from __future__ import annotations

import subprocess

import pytest
from fixtures.netns import need_root_netns, netns_sshd

from distlaunch.contract.endpoint import free_port
from tests.fixtures import require
from tests.helpers import distlaunch_cmd, finish
from tests.launcher.test_pernode import ALLREDUCE, node_env


@pytest.fixture(scope="module")
def namespace(tmp_path_factory):
    require(need_root_netns())
    with netns_sshd(tmp_path_factory.mktemp("netns"), "dlpn") as host:
        yield host


def test_node_0_in_another_network_publishes_an_address_the_other_nodes_reach(namespace):
    store = f"{namespace.address}:{free_port()}"  # free here; the namespace has ports of its own
    common = ["--nnodes", "2", "--rdzv-endpoint", store, "--rdzv-timeout", "60", "-n", "1"]
    # Each side names its own interface for gloo: the veth ends differ in name.
    node0 = ["ip", "netns", "exec", namespace.name, *distlaunch_cmd("run", *common, "--node-rank", "0")]
    node0 += ["--env", f"GLOO_SOCKET_IFNAME={namespace.inside}", *ALLREDUCE]
    node1 = distlaunch_cmd("run", *common, "--node-rank", "1", "--env", f"GLOO_SOCKET_IFNAME={namespace.outside}")
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=node_env())
        for argv in (node0, [*node1, *ALLREDUCE])
    ]
    results = finish(procs, timeout=150)
    for code, out, err in results:
        assert code == 0, out + err
    for rank, (_, out, _) in enumerate(results):
        assert f"rank {rank}/2 (gloo): all_reduce(sum of rank+1) = 3 (ok)" in out, out


def test_node_0_whose_own_name_resolves_to_loopback_there_still_serves_the_other_nodes(namespace):
    """Debian's /etc/hosts maps the machine's own name to 127.0.1.1, while the other nodes resolve it to its
    network address. Node 0's store, listening on the address the endpoint names, would be out of their
    reach: for such a name it listens on every address. (Node 1 names node 0 by the address it reaches.)"""
    namespace.set_hosts("127.0.0.1 localhost\n127.0.1.1 dlnode0\n")
    try:
        port, master = free_port(), ["--master-addr", namespace.address, "--master-port", str(free_port())]
        common = ["--nnodes", "2", *master, "--rdzv-timeout", "60", "-n", "1"]
        node0 = ["ip", "netns", "exec", namespace.name, *distlaunch_cmd("run", *common, "--node-rank", "0")]
        node0 += ["--rdzv-endpoint", f"dlnode0:{port}", "--env", f"GLOO_SOCKET_IFNAME={namespace.inside}"]
        node1 = distlaunch_cmd("run", *common, "--node-rank", "1", "--rdzv-endpoint", f"{namespace.address}:{port}")
        node1 += ["--env", f"GLOO_SOCKET_IFNAME={namespace.outside}"]
        procs = [
            subprocess.Popen(
                [*argv, *ALLREDUCE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=node_env()
            )
            for argv in (node0, node1)
        ]
        results = finish(procs, timeout=150)
    finally:
        namespace.set_hosts("127.0.0.1 localhost\n")
    for code, out, err in results:
        assert code == 0, out + err
    for rank, (_, out, _) in enumerate(results):
        assert f"rank {rank}/2 (gloo): all_reduce(sum of rank+1) = 3 (ok)" in out, out

"""The network card rule (launcher/planning/netcards.py) on inventories as hosts report them; the real thing, an
sshd in a network namespace with two cards of which one reaches the master, is in test_netcards_netns.py."""

from __future__ import annotations

import pytest

from distlaunch.contract.inventory import HostInventory
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.netcards import decide


def host(*cards: tuple[str, str], ib: tuple[str, ...] = ()) -> HostInventory:
    """A host with loopback, these (name, address/prefix) cards up, and these active InfiniBand devices."""
    interfaces = [{"name": "lo", "up": True, "addresses": ["127.0.0.1/8"]}]
    interfaces += [{"name": name, "up": True, "addresses": [address]} for name, address in cards]
    devices = [{"name": d, "ports": [{"port": 1, "state": "ACTIVE"}]} for d in ib]
    return HostInventory.model_validate({"interfaces": interfaces, "ib_devices": devices})


def hcas(net) -> dict[str, str]:
    """The NCCL_IB_HCA each host's ranks get."""
    return {h: env["NCCL_IB_HCA"] for h, env in net.env.items() if "NCCL_IB_HCA" in env}


TWO_CARDS = host(("eth0", "192.168.1.5/24"), ("ib0", "10.1.0.5/16"))


def test_a_host_with_two_cards_gets_the_one_toward_the_master():
    net = decide("10.1.0.1", {"node2": TWO_CARDS}, {})
    assert net.env == {"node2": {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"}}
    assert net.lines == ["network: GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME=ib0 on node2 (reaches 10.1.0.1)"]


def test_a_host_with_one_card_gets_it_too_and_a_master_on_loopback_leaves_the_libraries_their_pick():
    """gloo would take the address the host's name resolves to (127.0.1.1 on a stock Ubuntu host)."""
    one = decide("192.168.1.1", {"node2": host(("eth0", "192.168.1.5/24"))}, {}).env
    assert one == {"node2": {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}}
    assert decide("127.0.0.1", {"localhost": TWO_CARDS}, {}).env == {}
    down = TWO_CARDS.model_copy(deep=True)
    down.interfaces[2].up = False
    assert decide("10.1.0.1", {"node2": down}, {}).env == {}


def test_the_users_value_wins_and_is_said_when_it_misses_the_master():
    net = decide("10.1.0.1", {"node2": TWO_CARDS}, {"node2": {"GLOO_SOCKET_IFNAME": "eth0"}})
    assert net.env == {"node2": {"NCCL_SOCKET_IFNAME": "ib0"}}
    assert "network: GLOO_SOCKET_IFNAME=eth0 (yours, kept) does not reach the master from node2 (ib0 does)" in net.lines
    net = decide("10.1.0.1", {"node2": TWO_CARDS}, {"node2": {"NCCL_SOCKET_IFNAME": "ib", "GLOO_SOCKET_IFNAME": "ib0"}})
    assert net.env == {} and net.lines == []  # NCCL takes a prefix


def test_a_users_interface_the_host_does_not_have_is_refused():
    with pytest.raises(UsageError, match=r"GLOO_SOCKET_IFNAME=eth9 names no interface of node3 \(it has lo, eth0"):
        decide("10.1.0.1", {"node3": TWO_CARDS}, {"node3": {"GLOO_SOCKET_IFNAME": "eth9"}})


def test_infiniband_hosts_get_the_hcas_they_all_have():
    a = host(("eth0", "10.0.0.1/24"), ib=("mlx5_0", "mlx5_1"))
    b = host(("eth0", "10.0.0.2/24"), ib=("mlx5_1", "mlx5_2"))
    net = decide("10.0.0.1", {"node1": a, "node2": b, "cpu": host(("eth0", "10.0.0.3/24"))}, {})
    assert hcas(net) == {"node1": "mlx5_1:1", "node2": "mlx5_1:1"}
    assert "network: NCCL_IB_HCA=mlx5_1:1 on node1, node2 (the active HCAs every host has)" in net.lines
    with pytest.raises(UsageError, match="no active InfiniBand HCA in common"):
        decide("10.0.0.1", {"node1": a, "node2": host(("eth0", "10.0.0.2/24"), ib=("mlx5_3",))}, {})
    users = {"node1": {"NCCL_IB_HCA": "mlx5_9"}, "node2": {"NCCL_IB_HCA": "mlx5_9"}}
    net = decide("10.0.0.1", {"node1": a, "node2": b}, users)
    assert hcas(net) == {} and "network: NCCL_IB_HCA=mlx5_9 (yours, kept) names no active HCA of node1" in net.lines

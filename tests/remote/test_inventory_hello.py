"""Every remote host's inventory, as its agent's hello tells it, is kept by the launch's preflight, over both
transports (the real test sshd)."""

from __future__ import annotations

import sys

import pytest

from distlaunch.remote.openssh import TRANSPORT_VAR
from distlaunch.remote.preflight import preflight


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_the_preflight_keeps_each_hosts_inventory_from_its_hello(sshd_cluster, tmp_path, monkeypatch, transport):
    monkeypatch.setenv(TRANSPORT_VAR, transport)
    hosts = preflight(
        ["node1", "node2"],
        ssh_config=sshd_cluster.ssh_config,
        accept_new_host_keys=False,
        python=sys.executable,
        workdir=str(tmp_path),
    )
    with hosts:
        assert sorted(hosts.inventories) == ["node1", "node2"]
        for inventory in hosts.inventories.values():
            assert inventory.interface_toward("127.0.0.12").name == "lo" and inventory.cpus

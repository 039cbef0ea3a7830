"""Emulated hosts for a benchmark: one network namespace per host, each with an ``eth0`` joined to a bridge in a
namespace of its own (the switch), each host's link shaped with tc in both directions; inside a host the ranks
talk over loopback, as on a real host. Root only; nothing outside the namespaces made here is touched, and they
are removed on the way out.

    with emulated_hosts(2, cpus_per_host=[[0], [1]]) as hosts:
        hosts.shape(1e9)                      # 1 Gbit/s each way, per host
        subprocess.run(hosts.argv(0, ["python", "-c", "..."]))
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

SUBNET = "10.98.0"  # inside the namespaces only: no route leads here from this machine's own network


@dataclass
class Hosts:
    """The namespaces made: host i is ``names[i]`` at ``address(i)``, its switch port ``ports[i]``."""

    names: list[str]
    switch: str
    ports: list[str]
    cpus: list[list[int]]  # the CPUs each host's processes are bound to

    def address(self, host: int) -> str:
        return f"{SUBNET}.{host + 2}"

    def argv(self, host: int, argv: list[str]) -> list[str]:
        """``argv`` run on ``host``: in its namespace, on its CPUs."""
        cpus = ",".join(map(str, self.cpus[host]))
        return ["ip", "netns", "exec", self.names[host], "taskset", "-c", cpus, *argv]

    def shape(self, bits_s: float) -> None:
        """Every host's link at ``bits_s`` each way: a token bucket on its eth0 (what it sends) and on its switch
        port (what it receives)."""
        rate = f"{int(bits_s)}bit"
        burst = str(max(256 * 1024, int(bits_s / 8 / 250)))  # 4 ms of the rate, at least 64 full-size segments
        for host, port in zip(self.names, self.ports, strict=True):
            for ns, dev in ((host, "eth0"), (self.switch, port)):
                _sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                    "burst", burst, "latency", "200ms")  # fmt: skip


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def host_cpus(hosts: int) -> list[list[int]]:
    """This process's CPUs split evenly between ``hosts`` (all of them for each where there are fewer CPUs)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < hosts:
        return [cpus] * hosts
    share = len(cpus) // hosts
    return [cpus[i * share : (i + 1) * share] for i in range(hosts)]


@contextlib.contextmanager
def emulated_hosts(count: int, cpus_per_host: list[list[int]] | None = None) -> Iterator[Hosts]:
    """``count`` hosts on one bridge, unshaped until ``Hosts.shape``."""
    tag = f"dlb{os.getpid()}"
    hosts = Hosts([f"{tag}h{i}" for i in range(count)], f"{tag}sw", [f"p{i}" for i in range(count)],
                  cpus_per_host or host_cpus(count))  # fmt: skip
    made: list[str] = []
    try:
        for ns in (hosts.switch, *hosts.names):
            _sh("ip", "netns", "add", ns)
            made.append(ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "-n", hosts.switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", hosts.switch, "link", "set", "br0", "up")
        for i, (ns, port) in enumerate(zip(hosts.names, hosts.ports, strict=True)):
            _sh("ip", "link", "add", port, "netns", hosts.switch, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _sh("ip", "-n", hosts.switch, "link", "set", port, "master", "br0")
            _sh("ip", "-n", hosts.switch, "link", "set", port, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{hosts.address(i)}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
        yield hosts
    finally:
        for ns in reversed(made):  # a namespace's veth ends go with it
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

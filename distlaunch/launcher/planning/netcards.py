"""Which network cards a job's ranks talk over, from the inventories the hosts reported (their agents' hellos, or
this machine's probe): the one rule for GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME and NCCL_IB_HCA.

- Every host of a job that spans machines gets the socket variables set to the card its kernel reaches the
  master through, even where it has one card besides loopback: gloo's own pick is the address the host's name
  resolves to, which on a stock Ubuntu host is 127.0.1.1, reached by no other host. With the master on loopback
  (every rank on one machine) nothing is set: there is nothing to choose.
- Every host that has InfiniBand gets NCCL_IB_HCA, the same set on all of them (NCCL needs it to agree across
  ranks): the active HCAs they all have; hosts with none in common are refused.
- A variable the user set always wins. One naming an interface the host does not have is refused (the ranks could
  not start their process group); one that does not reach the master is kept, and said.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field

from distlaunch.contract.inventory import HostInventory, Interface
from distlaunch.errors import UsageError

SOCKET_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
IB_VAR = "NCCL_IB_HCA"
NETWORK_VARS = (*SOCKET_VARS, IB_VAR)


@dataclass
class Network:
    """What the rule decided: the variables each host's ranks get (by host), and why, a line each."""

    env: dict[str, dict[str, str]] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


def master_ip(master_addr: str) -> str | None:
    """The master's IP address as this machine resolves it; None where it does not resolve."""
    try:
        return str(ipaddress.ip_address(master_addr.split("%")[0]))
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(master_addr, None)[0][4][0])
    except (OSError, IndexError):
        return None


def is_loopback(interface: Interface) -> bool:
    """The loopback interface, or one whose every address is a loopback one."""
    networks = interface.networks()
    return interface.name == "lo" or (bool(networks) and all(n.ip.is_loopback for n in networks))


def launch_card(inventory: HostInventory, master: str) -> Interface | None:
    """The card the launch names for a host's ranks where its user named none (the doctor predicts the launch by
    it): the one the host reaches ``master`` (an IP address) through; None where that is loopback (every rank on
    one machine: nothing to choose) or the host knows no route to it."""
    toward = inventory.interface_toward(master)
    return None if toward is None or is_loopback(toward) else toward


def matches(var: str, entry: str, name: str) -> bool:
    """Whether interface ``name`` is one ``entry`` of ``var`` selects: gloo names interfaces exactly, NCCL by
    prefix (``=eth0``: exactly)."""
    if var == "GLOO_SOCKET_IFNAME" or entry.startswith("="):
        return name == entry.lstrip("=")
    return name.startswith(entry)


def chosen(var: str, value: str, inventory: HostInventory) -> list[Interface]:
    """The interfaces of the host that the user's ``value`` of ``var`` selects (an NCCL ``^`` list: all the others)."""
    entries = [e.strip() for e in value.split(",") if e.strip()]
    if var.startswith("NCCL") and value.startswith("^"):
        excluded = [e.lstrip("^") for e in entries]
        return [i for i in inventory.interfaces if not any(i.name.startswith(e) for e in excluded)]
    return [i for i in inventory.interfaces if any(matches(var, e, i.name) for e in entries)]


def check_user_socket(host: str, var: str, value: str, inventory: HostInventory, toward: Interface | None) -> str:
    """The user's ``var``: refused where it names no interface of ``host``; a line where it misses the master."""
    selected = chosen(var, value, inventory)
    if not selected:
        names = ", ".join(i.name for i in inventory.interfaces) or "none"
        raise UsageError(
            f"{var}={value} names no interface of {host} (it has {names})",
            f"set {var} to one of {host}'s interfaces, or leave it unset: distlaunch picks the one toward the master",
        )
    if toward is not None and toward.name not in {i.name for i in selected}:
        return f"network: {var}={value} (yours, kept) does not reach the master from {host} ({toward.name} does)"
    return ""


def host_sockets(host: str, inventory: HostInventory, master: str, user: dict[str, str], net: Network) -> None:
    """The socket variables of one host's ranks, and why; the user's own ones checked."""
    toward = launch_card(inventory, master)
    decided = {}
    for var in SOCKET_VARS:
        if var in user:
            line = check_user_socket(host, var, user[var], inventory, toward)
            net.lines += [line] if line else []
        elif toward is not None:
            decided[var] = toward.name
    if decided:
        net.env.setdefault(host, {}).update(decided)
        names = "/".join(decided)
        net.lines.append(f"network: {names}={toward.name} on {host} (reaches {master})")


def ib_hcas(inventories: dict[str, HostInventory], user: dict[str, dict[str, str]], net: Network) -> None:
    """NCCL_IB_HCA on every host with InfiniBand: the active HCAs they all have, or the user's (checked)."""
    with_ib = {host: inv.ib_hcas() for host, inv in inventories.items() if inv.ib_hcas()}
    if not with_ib:
        return
    given = {host: user[host][IB_VAR] for host in with_ib if IB_VAR in user.get(host, {})}
    if given:
        for host, value in given.items():
            devices = {hca.partition(":")[0] for hca in with_ib[host]}
            named = {e.strip().lstrip("^=").partition(":")[0] for e in value.split(",") if e.strip()}
            if not value.startswith("^") and not named & devices:
                net.lines.append(f"network: {IB_VAR}={value} (yours, kept) names no active HCA of {host}")
        return
    common = sorted(set.intersection(*(set(found) for found in with_ib.values())))
    if not common:
        found = "; ".join(f"{host}: {','.join(hcas)}" for host, hcas in with_ib.items())
        raise UsageError(
            f"the hosts have no active InfiniBand HCA in common ({found}), and NCCL needs {IB_VAR} to agree",
            f"set it for every host yourself, e.g. --env {IB_VAR}={next(iter(with_ib.values()))[0]}",
        )
    value = ",".join(common)
    for host in with_ib:
        net.env.setdefault(host, {})[IB_VAR] = value
    net.lines.append(f"network: {IB_VAR}={value} on {', '.join(with_ib)} (the active HCAs every host has)")


def decide(master_addr: str, inventories: dict[str, HostInventory], user: dict[str, dict[str, str]]) -> Network:
    """The network variables of each host's ranks (``inventories``: by host, in node order; ``user``: the
    variables each host's ranks already have, which win)."""
    net = Network()
    master = master_ip(master_addr)
    if master is not None:
        for host, inventory in inventories.items():
            host_sockets(host, inventory, master, user.get(host, {}), net)
    ib_hcas(inventories, user, net)
    return net


# the dry run's line: no host is contacted, so it says what each host will decide (GLOO_SOCKET_IFNAME,
# NCCL_SOCKET_IFNAME: its card toward the master; NCCL_IB_HCA where hosts have InfiniBand)
PLAN_LINE = "network: at start, each host's card toward the master and the common HCAs"

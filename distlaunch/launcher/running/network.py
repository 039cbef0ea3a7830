"""The network cards of a plan's ranks, decided once the hosts have said what they have (the remote agents'
hellos, this machine's own probe) and before any rank starts, for every attempt (a spare's too): the rule is
planning/netcards.py's, which an srun task applies to itself (slurm/task.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from distlaunch.contract.inventory import HostInventory
from distlaunch.hostprobe import inventory
from distlaunch.launcher.planning.netcards import NETWORK_VARS, decide
from distlaunch.launcher.planning.plan import LaunchPlan

if TYPE_CHECKING:
    from distlaunch.remote.session import RemoteHosts


def inventories(plan: LaunchPlan, remote: RemoteHosts | None) -> dict[str, HostInventory]:
    """Each host's inventory, in node order: a remote one from its agent's hello, this machine's probed here."""
    here = HostInventory.of(inventory()) if any(node.local for node in plan.nodes) else None
    found = {}
    for node in plan.nodes:
        inv = here if node.local else (remote.inventories.get(node.host) if remote is not None else None)
        if inv is not None:
            found[node.host] = inv
    return found


def users_vars(plan: LaunchPlan) -> dict[str, dict[str, str]]:
    """The network variables each host's ranks have already: the plan's (--env, forwarded ones) and, for ranks
    here, the launcher's environment they inherit."""
    found = {}
    for node in plan.nodes:
        env = {**(os.environ if node.local else {}), **node.ranks[0].env}
        found[node.host] = {name: env[name] for name in NETWORK_VARS if name in env}
    return found


def with_network(plan: LaunchPlan, remote: RemoteHosts | None, notice: Callable[[str], None]) -> LaunchPlan:
    """``plan`` with each host's ranks given their network variables, each choice said through ``notice``; a
    variable of the user's that names no interface of a host is a UsageError."""
    net = decide(plan.master_addr, inventories(plan, remote), users_vars(plan))
    for line in net.lines:
        notice(line)
    if not net.env:
        return plan
    plan = plan.model_copy(deep=True)
    for node in plan.nodes:
        for rank in node.ranks:
            rank.env.update(net.env.get(node.host, {}))
    return plan

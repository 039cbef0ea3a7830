"""MASTER_ADDR for a Slurm step: the first node of the step, as a name every node can reach.

Slurm node names often are DNS names; where they are not (NodeName differs from the host name, as in the test
cluster where node1/node2 both run on one machine), the node's NodeAddr from ``scontrol show node`` is used.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Mapping

from distlaunch.errors import HostError

SCONTROL_TIMEOUT_S = 30
_NODE_ADDR = re.compile(r"(?:^|\s)NodeAddr=(\S+)")


def resolves(name: str) -> bool:
    """True when the resolver knows ``name``."""
    try:
        socket.getaddrinfo(name, None)
    except (socket.gaierror, UnicodeError):
        return False
    return True


def node_addr_from_scontrol(text: str) -> str | None:
    """The NodeAddr field of ``scontrol show node -o NAME`` output."""
    match = _NODE_ADDR.search(text)
    return match.group(1) if match else None


def scontrol_node_addr(node: str) -> str | None:
    """Ask slurmctld for a node's NodeAddr (None when scontrol is missing or does not know it)."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        out = subprocess.run(
            [scontrol, "show", "node", "-o", node],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return node_addr_from_scontrol(out.stdout) if out.returncode == 0 else None


def node_address(node: str) -> str:
    """The node name when it resolves, else its NodeAddr from Slurm; a HostError when neither works."""
    if resolves(node):
        return node
    addr = scontrol_node_addr(node)
    if addr and (addr != node) and resolves(addr):
        return addr
    raise HostError(
        f"the first node of the step, {node!r}, does not resolve and scontrol gave no usable NodeAddr (got {addr!r})",
        "pass --master-addr ADDRESS (an address of that node every node can reach), or export MASTER_ADDR before srun",
    )


def master_address(first_node: str, given: str | None, environ: Mapping[str, str]) -> str:
    """--master-addr, else an exported MASTER_ADDR, else the first node's reachable address."""
    return given or environ.get("MASTER_ADDR") or node_address(first_node)

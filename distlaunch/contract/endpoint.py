"""Where ranks meet: the master port policy, one place for every backend and the doctor.

- ``--master-port N``: N, checked.
- ``auto`` with the master on this machine: a port free right now, outside the kernel's ephemeral range
  (``free_port``).
- ``auto`` with a remote master: one in AUTO_REMOTE_PORTS (the range firewall rules name), since no
  free port can be asked for from here.
- an srun step with no port given: every task derives the same port from the job and step ids
  (``step_port``), because tasks cannot talk before the store exists.
"""

from __future__ import annotations

import secrets
import socket
import zlib
from pathlib import Path

from distlaunch.errors import UsageError

DEFAULT_PORT = 29500  # torchrun's; what a manifest or a hand-started node uses when none is given
AUTO_REMOTE_PORTS = range(29500, 29600)
STEP_PORTS = range(15000, 30000)
STEPS_PER_JOB = 16  # consecutive steps of one job get different ports
LOCAL_AUTO_FLOOR = 20000  # auto ports below the ephemeral range start here (under it: well-known services)
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_ports() -> range:
    """The ports the kernel gives outgoing connections (Linux's default where it cannot be read)."""
    try:
        low, high = (int(word) for word in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port(addr: str = "127.0.0.1", attempts: int = 64) -> int:
    """A TCP port nothing is bound to on ``addr`` right now, outside the kernel's ephemeral range.

    The port is released before rank 0 binds it seconds later. A port the kernel picked for us
    (bind to 0) lies in the ephemeral range, from which every outgoing connection on the machine
    also draws its local port: any gloo or ssh connection opened meanwhile can take it, and rank 0
    then dies with EADDRINUSE. Below (or above) that range only another explicit bind can.
    """
    ephemeral = ephemeral_ports()
    if ephemeral.start > LOCAL_AUTO_FLOOR:
        candidates = range(LOCAL_AUTO_FLOOR, ephemeral.start)
    else:
        candidates = range(ephemeral.stop, 65536)
    if len(candidates) >= 1024:  # else the range covers nearly every port: let the kernel pick
        for _ in range(attempts):
            port = secrets.choice(candidates)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((addr, port))
                except OSError:
                    continue  # bound, listening, or in TIME_WAIT: another
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def parse_port(text: str | int, what: str = "--master-port") -> int:
    """A port number from the command line or the environment, or a one-line error."""
    try:
        port = int(text)
    except ValueError:
        raise UsageError(f"{what} {text!r} is not a port", "give an integer 1024-65535, or auto") from None
    if not 1 <= port <= 65535:
        raise UsageError(f"{what} {port} is out of range", "give an integer 1024-65535, or auto")
    if port < 1024:
        # only root may listen there, and well-known services do: rank 0's store would fail or collide
        raise UsageError(
            f"{what} {port} is a privileged port (below 1024)",
            "give an integer 1024-65535 (torchrun uses 29500), or auto",
        )
    return port


def choose_port(given: str, master_is_local: bool) -> int:
    """``--master-port``: an integer, or ``auto`` (see the module's policy)."""
    if given != "auto":
        return parse_port(given)
    if master_is_local:
        return free_port()
    return AUTO_REMOTE_PORTS.start + secrets.randbelow(len(AUTO_REMOTE_PORTS))


def auto_port_text(master_is_local: bool) -> str:
    """What ``auto`` means for this master, in words (the doctor says which port it probed, and why)."""
    if master_is_local:
        return "a free port on this machine, chosen at launch"
    return f"a port in {AUTO_REMOTE_PORTS.start}-{AUTO_REMOTE_PORTS.stop - 1}, chosen at launch"


def step_port(job_id: str, step_id: int) -> int:
    """The rendezvous port every task of an srun step computes alike from the job and step ids."""
    number = int(job_id) if job_id.isdigit() else zlib.crc32(job_id.encode())
    return STEP_PORTS.start + (number * STEPS_PER_JOB + step_id % STEPS_PER_JOB) % len(STEP_PORTS)

"""Where ranks meet: the master port policy, one place for every backend and the doctor.

- ``--master-port N``: N, checked.
- ``auto`` with the master on this machine: a port the kernel says is free right now.
- ``auto`` with a remote master: one in AUTO_REMOTE_PORTS (the range firewall rules name), since no
  free port can be asked for from here.
- an srun step with no port given: every task derives the same port from the job and step ids
  (``step_port``), because tasks cannot talk before the store exists.
"""

from __future__ import annotations

import secrets
import socket
import zlib

from distlaunch.errors import UsageError

DEFAULT_PORT = 29500  # torchrun's; what a manifest or a hand-started node uses when none is given
AUTO_REMOTE_PORTS = range(29500, 29600)
STEP_PORTS = range(15000, 30000)
STEPS_PER_JOB = 16  # consecutive steps of one job get different ports


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the kernel picks it)."""
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

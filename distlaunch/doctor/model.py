"""What the doctor reports (``Check``, ``DoctorReport``: the JSON contract in docs/cli.md), what it is asked
(``DoctorOptions``), and the facts it gathers from each host on the way (``HostFacts``)."""

from __future__ import annotations

import os
import sys
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, model_serializer

from distlaunch.contract.inventory import HostInventory, Interface
from distlaunch.contract.options import HostOptions

Status = Literal["pass", "warn", "fail", "skip"]
DOCS = "docs/troubleshooting.md"
LOCAL = "(local)"  # the host of checks about the doctor's own inputs (hostfile, parallel spec)

# Stable check ids, in the order the report lists them for each host.
CHECK_IDS = (
    "hostfile",
    "parallel",
    "dns",
    "ssh.connect",
    "ssh.auth",
    "ssh.hostkey",
    "python",
    "workdir",
    "torch-version",
    "nccl",
    "gpus",
    "loopback-hostname",
    "duplicate-host",
    "master-port",
    "master-reachable",
    "nic",
    "shm",
    "memlock",
    "clock",
    "bench",
)


class Check(BaseModel):
    """One finding: which check, on which host, how it went, what was seen and what to do about it."""

    id: str
    host: str
    status: Status
    detail: str
    hint: str = ""


def check(id: str, host: str, status: Status, detail: str, hint: str = "") -> Check:
    """A Check whose hint (for warn and fail) ends with the link to the check's troubleshooting section."""
    if status in ("warn", "fail"):
        link = f"see {DOCS}#{id.replace('.', '')}"
        hint = f"{hint}; {link}" if hint else link
    return Check(id=id, host=host, status=status, detail=detail, hint=hint)


class BenchRow(BaseModel):
    """One message size: time per all-reduce and the two bandwidths of nccl-tests (GB/s, 10^9 bytes)."""

    bytes: int
    seconds: float
    algbw_gbs: float
    busbw_gbs: float


class BenchResult(BaseModel):
    """The all-reduce sweep."""

    backend: str
    world_size: int
    hosts: int
    max_bytes: int
    note: str = ""
    rows: list[BenchRow] = Field(default_factory=list)


class DoctorReport(BaseModel):
    """The doctor's verdict: ``ok`` unless some check failed (warnings do not fail); ``bench`` only with --bench."""

    ok: bool
    checks: list[Check]
    bench: BenchResult | None = None
    _usage_error: bool = PrivateAttr(default=False)  # the input itself is wrong (hostfile, options): exit 2

    @property
    def usage_error(self) -> bool:
        return self._usage_error

    @model_serializer(mode="wrap")
    def _contract(self, handler):
        data = handler(self)
        if data.get("bench") is None:
            data.pop("bench", None)  # the documented shape, exactly, unless a benchmark was asked for
        return data

    @classmethod
    def of(cls, checks: list[Check], bench: BenchResult | None = None, usage_error: bool = False) -> DoctorReport:
        """A report whose ``ok`` follows from its checks."""
        report = cls(ok=not any(c.status == "fail" for c in checks), checks=checks, bench=bench)
        report._usage_error = usage_error
        return report


class DoctorOptions(HostOptions):
    """What to check: the hosts (a hostfile, or this machine), the master, the layout, the environment: the
    launch options as for run (--master-port auto: the port run would pick; --backend: the one whose
    NCCL_/GLOO_SOCKET_IFNAME variables are judged; --env: NCCL/GLOO_SOCKET_IFNAME are checked), and how to check."""

    remote_python: str = sys.executable  # as the launcher: remote ranks run the launcher's interpreter path
    python: str | None = None  # the ranks' interpreter (run's --python); None: remote_python's
    workdir: str | None = None  # the ranks' working directory on every host (run's --workdir); None: ours
    connect_timeout: float = 5.0  # SSH connect
    # an interpreter's start and first answer (the master's listener, each probe beyond its connect)
    start_timeout: float = 20.0
    reach_timeout: float = 2.5  # each host's TCP connect to the master; a firewall that drops packets costs this much
    bench: bool = False
    bench_max_bytes: int | None = None  # default: 256 MiB on GPUs, 16 MiB on CPU

    @property
    def ranks_workdir(self) -> str:
        """Where the ranks start on every host, as run starts them: --workdir, else the launcher's current folder."""
        return self.workdir or os.getcwd()

    @property
    def ranks_python(self) -> str | None:
        """--python as the ranks' exec finds it (a relative path with a '/' from their working directory); None
        when not given: the ranks run the probe's interpreter."""
        if self.python and "/" in self.python and not os.path.isabs(self.python):
            return os.path.join(self.ranks_workdir, self.python)
        return self.python or None


class HostFacts(BaseModel):
    """Everything the probe found on one host (see ``probe_script.py``); unknown keys are kept."""

    model_config = {"extra": "allow"}

    hostname: str
    fqdn: str
    hostname_addrs: list[str] | dict[str, Any]  # a dict {"error": …} where the name does not resolve
    fqdn_addrs: list[str] | dict[str, Any]
    machine_id: str | None = None
    boot_id: str | None = None
    python: dict[str, str]
    distlaunch: str | None = None
    torch: dict[str, str | None] | None = None
    inventory: HostInventory = Field(default_factory=HostInventory)  # GPUs, interfaces, InfiniBand: hostprobe.py
    shm_bytes: int | None = None
    memlock: int = -1  # bytes; -1 is unlimited
    workdir: dict[str, Any] | None = None  # {"path", "problem"}: the ranks' working directory there
    master: dict[str, Any] | None = None
    time: float = 0.0
    # Filled in by the doctor, not the probe: when the question left and the answer came back (local clock).
    sent_at: float = 0.0
    received_at: float = 0.0
    # NTP-style, from several round trips to a clock helper (None when it could not run: the probe's stamp)
    ntp_offset: float | None = None
    ntp_error: float | None = None
    clock_note: str | None = None

    @property
    def gpu_count(self) -> int:
        return self.inventory.gpu_count

    @property
    def interfaces(self) -> list[Interface]:
        return self.inventory.interfaces

    @property
    def infiniband(self) -> list[str]:
        """The names of the host's InfiniBand devices."""
        return [d.name for d in self.inventory.ib_devices]

    @property
    def clock_offset(self) -> float:
        """The host's clock minus ours: from the round trips when measured, else the probe's own stamp (taken
        last, just before its answer comes back)."""
        return self.ntp_offset if self.ntp_offset is not None else self.time - self.received_at

    @property
    def clock_uncertainty(self) -> float:
        """How well the offset is known: half the shortest round trip, else the whole probe round trip."""
        return self.ntp_error if self.ntp_error is not None else self.received_at - self.sent_at

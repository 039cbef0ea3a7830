"""A launch on a fleet of loopback SSH hosts, watched from outside: when every rank started, and what the launcher
process itself uses meanwhile (CPU, threads, RSS) and at its end (bench/_probe_launcher.py). Shared by
bench/launch_fanout_cpu.py and bench/scale_rehearsal.py.

The hosts are real sshd daemons on 127.0.x.y (tests/fixtures/sshd.py, 16 addresses each); each rank is a
``python -c`` that imports no torch, prints one line and sleeps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
from fixtures.sshd import SshdFleet, start_sshd_fleet  # noqa: E402

PROBE = Path(__file__).with_name("_probe_launcher.py")
TICK_S = os.sysconf("SC_CLK_TCK")
TRANSPORT_VAR = "DISTLAUNCH_SSH_TRANSPORT"  # openssh (the default where ssh exists) or paramiko


def rank_code(sleep_s: float) -> str:
    """A rank: one line with its start time and job id, then ``sleep_s`` seconds of nothing."""
    return (
        "import os, time; print('STARTED', time.time(), os.environ['DISTLAUNCH_JOB_ID'], flush=True); "
        f"time.sleep({sleep_s})"
    )


@dataclass
class Usage:
    """One look at a process: CPU seconds so far, threads, resident KiB."""

    cpu_s: float
    threads: int
    rss_kib: int


def usage(pid: int) -> Usage:
    """``pid``'s CPU, threads and RSS from /proc (zeros once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return Usage(0.0, 0, 0)
    fields = dict(line.split(":", 1) for line in status if ":" in line)
    cpu = (int(stat[11]) + int(stat[12])) / TICK_S  # utime, stime (fields 14, 15 of /proc/PID/stat)
    return Usage(cpu, int(fields["Threads"]), int(fields["VmRSS"].split()[0]))


def children_of(pid: int) -> list[int]:
    """The direct children of ``pid`` (the OpenSSH clients of a launcher)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def pss_kib(pid: int) -> int:
    """Proportional set size: a process's own memory plus its share of what it shares (the ssh binary, libc)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class FleetLaunch:
    """``distlaunch run`` on the first ``nhosts`` hosts of ``fleet``, one rank each, started at once."""

    def __init__(
        self,
        fleet: SshdFleet,
        nhosts: int,
        sleep_s: float,
        *args: str,
        transport: str | None = None,
        env: dict[str, str] | None = None,
    ):
        self.nhosts = nhosts
        self.dir = Path(tempfile.mkdtemp(prefix="distlaunch-fleet-launch-"))
        hostfile = fleet.write_hostfile(self.dir / "hosts", nhosts)
        env = {**os.environ, "NO_COLOR": "1", "DISTLAUNCH_PROBE_OUT": str(self.dir / "probe.json"), **(env or {})}
        if transport:
            env[TRANSPORT_VAR] = transport
        cmd = [sys.executable, str(PROBE), "run", "-H", str(hostfile), "--ssh-config", str(fleet.ssh_config)]
        cmd += [*args, "--no-python", sys.executable, "-c", rank_code(sleep_s)]
        self.began = time.time()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.starts: list[float] = []
        self.job_id = ""
        self.err: list[str] = []
        self.stopping_at: float | None = None  # when the launcher said it stops every rank (monotonic)
        self.all_started = threading.Event()
        threading.Thread(target=self._read_out, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read_out(self) -> None:
        for line in self.proc.stdout:
            if "STARTED " in line:
                at, self.job_id = line.split("STARTED ", 1)[1].split()[:2]
                self.starts.append(float(at))
                if len(self.starts) == self.nhosts:
                    self.all_started.set()

    def _read_err(self) -> None:
        for line in self.proc.stderr:
            self.err.append(line)
            if "stopping all ranks" in line and self.stopping_at is None:
                self.stopping_at = time.monotonic()

    def wait_started(self, timeout: float) -> float:
        """Seconds from the launcher's start until the last rank ran its first line."""
        deadline = time.monotonic() + timeout
        while not self.all_started.wait(0.5) and time.monotonic() < deadline and self.proc.poll() is None:
            pass
        if not self.all_started.is_set():
            self.proc.kill()
            self.proc.wait()
            time.sleep(0.5)  # the readers take the launcher's last words
            raise RuntimeError(f"{len(self.starts)}/{self.nhosts} ranks started in {timeout:g}s: {''.join(self.err)}")
        return max(self.starts) - self.began

    def cpu_by_thread(self) -> dict[str, float]:
        """The launcher's CPU seconds so far per kind of thread (with DISTLAUNCH_PROBE_EVERY_S set: as of its last
        write, at most that long ago)."""
        try:
            return json.loads((self.dir / "probe.json.live").read_text())
        except (OSError, ValueError):
            return {}

    def ssh_clients(self) -> list[int]:
        return children_of(self.proc.pid)

    def finish(self, timeout: float = 300) -> dict:
        """Wait for the launcher's end; what it used (probe_launcher.py) and its wall time and exit code."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # our own child, by its handle
            self.proc.wait()
            raise RuntimeError(f"the launcher of {self.nhosts} hosts ran past {timeout:g}s") from None
        try:
            report = json.loads((self.dir / "probe.json").read_text())
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
        return {**report, "wall_s": time.time() - self.began, "rc": self.proc.returncode}


def start_fleet(directory: Path, nhosts: int) -> SshdFleet:
    return start_sshd_fleet(directory, nhosts)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            parents.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def job_processes(job_id: str) -> list[int]:
    """Processes whose environment carries DISTLAUNCH_JOB_ID=job_id: ranks, agents and ssh clients."""
    needle = f"DISTLAUNCH_JOB_ID={job_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def session_of(fleet: SshdFleet, alias: str) -> list[int]:
    """The sshd session process that serves ``alias`` (by the local end of its socket) and all below it: the
    host's login shell, agent and ranks. Only processes of the fleet's own daemons."""
    daemon = fleet.daemon_of(alias)
    address = fleet.addresses[fleet.aliases.index(alias)]
    want = "".join(f"{int(o):02X}" for o in reversed(address.split("."))) + f":{daemon.port:04X}"
    inodes = {line.split()[9] for line in Path("/proc/net/tcp").read_text().splitlines()[1:] if line.split()[1] == want}
    for pid in descendants(daemon.pid):
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            return [pid, *descendants(pid)]
    return []

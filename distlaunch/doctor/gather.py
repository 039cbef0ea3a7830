"""Fact gathering: every host is connected, probed and (with the master's temporary listener up) asked to
reach the master, each host in its own thread, so one slow or broken host never delays or hides the
others. The result per host is its facts or the reason there are none; nothing here judges them."""

from __future__ import annotations

import ipaddress
import json
import secrets
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from distlaunch.doctor.model import DoctorOptions, HostFacts
from distlaunch.doctor.sessions import HostSession, LineStream, LocalSession, SshSession
from distlaunch.launcher.hostfile import HostSlots
from distlaunch.remote.ssh import SshError, connect_with_retries
from distlaunch.remote.sshconfig import SshTarget

HERE = Path(__file__).parent
PROBE_SOURCE = (HERE / "probe_script.py").read_text(encoding="utf-8")
LISTENER_SOURCE = (HERE / "listener_script.py").read_text(encoding="utf-8")
MAX_PARALLEL = 64
CONNECT_RETRIES = 1  # one more try for a refused/timed-out connection: a doctor must answer fast
LISTENER_START_S = 15.0  # bound on the master's interpreter start (a loaded host, a slow file system)


@dataclass
class HostResult:
    """What is known about one host after gathering."""

    host: str
    slots: HostSlots
    target: SshTarget | None  # None: this machine, no SSH
    ssh_error: SshError | None = None
    probe_error: str | None = None
    facts: HostFacts | None = None

    @property
    def loopback(self) -> bool:
        """True when the host is this machine at a loopback address (a simulated cluster, or localhost)."""
        return self.target is None or is_loopback_name(self.target.hostname)


@dataclass
class ListenerResult:
    """The master's temporary listener: did it bind, who holds the port, which peers reached it."""

    host: str
    address: str  # MASTER_ADDR as given
    port: int
    nonce: str = field(default_factory=lambda: secrets.token_hex(8))
    started: bool = False  # the script ran and reported
    bound: bool = False
    status: dict = field(default_factory=dict)  # the listener's first line
    error: str | None = None  # why there is no report (master host unreachable, interpreter missing)
    peers: list[str] = field(default_factory=list)


def is_loopback_name(name: str) -> bool:
    """True when every address ``name`` resolves to here is a loopback address."""
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
    except OSError:
        return False
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def open_session(result: HostResult, opts: DoctorOptions) -> HostSession | None:
    """This machine as a local session, a remote host over SSH; None (with ``ssh_error`` set) on failure."""
    if result.target is None:
        return LocalSession(result.host)
    try:
        timeout = result.target.connect_timeout or opts.connect_timeout
        client = connect_with_retries(result.target, timeout=timeout, retries=CONNECT_RETRIES)
    except SshError as exc:
        result.ssh_error = exc
        return None
    return SshSession(result.host, client)


def start_listener(session: HostSession, listener: ListenerResult, python: str) -> LineStream | None:
    """Start the listener on the master and wait for its first report."""
    args = json.dumps({"master_addr": listener.address, "port": listener.port, "nonce": listener.nonce})
    try:
        stream = session.start([python, "-c", LISTENER_SOURCE, args])
    except (OSError, SshError) as exc:
        listener.error = f"cannot start {python} on {listener.host}: {exc}"
        return None
    line = stream.readline(LISTENER_START_S)
    try:
        listener.status = json.loads(line or "")
    except ValueError:
        listener.error = f"{python} on {listener.host} did not start the listener" + (f": {line}" if line else "")
        stream.finish(1.0)
        return None
    listener.started = True
    listener.bound = bool(listener.status.get("bound"))
    return stream


def run_probe(session: HostSession, result: HostResult, opts: DoctorOptions, probe_args: dict) -> None:
    """Run the probe on the host and record its facts (or why there are none) in ``result``."""
    python = opts.remote_python
    sent = time.time()
    try:
        done = session.run([python, "-", json.dumps(probe_args)], timeout=opts.reach_timeout + 20, stdin=PROBE_SOURCE)
    except SshError as exc:
        result.probe_error = exc.detail
        return
    received = time.time()
    if done.rc != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit code {done.rc}"]
        result.probe_error = f"rc={done.rc}: {tail[0]}"
        return
    try:
        result.facts = HostFacts.model_validate({**json.loads(done.stdout), "sent_at": sent, "received_at": received})
    except (ValueError, ValidationError) as exc:
        result.probe_error = f"unexpected probe output ({exc.__class__.__name__}): {done.stdout[:200]!r}"


class Gathering:
    """One doctor run's fan-out: sessions, the master's listener, the probes."""

    def __init__(self, results: list[HostResult], opts: DoctorOptions, master_addr: str):
        self.results = results
        self.opts = opts
        self.listener = ListenerResult(host=results[0].host, address=master_addr, port=opts.master_port)
        self._listener_ready = threading.Event()
        self._stream: LineStream | None = None
        self._sessions: list[HostSession] = []
        self._lock = threading.Lock()

    def _host(self, index: int) -> None:
        result = self.results[index]
        session = None
        try:
            session = open_session(result, self.opts)
            if session is not None:
                with self._lock:
                    self._sessions.append(session)
            if index == 0:
                self._start_master(session)
            if session is None:
                return
            self._listener_ready.wait()
            args = {"master_addr": self.listener.address, "timeout": self.opts.reach_timeout,
                    "port": self.listener.port if self.listener.bound else None}
            run_probe(session, result, self.opts, args)
        except Exception as exc:  # noqa: BLE001 - a surprise on one host is that host's finding, not everyone's
            result.probe_error = f"{type(exc).__name__}: {exc}"
        finally:
            if index == 0:
                self._listener_ready.set()  # never leave the other hosts waiting, whatever happened here

    def _start_master(self, session: HostSession | None) -> None:
        if session is None:
            self.listener.error = f"master host {self.listener.host} could not be reached"
        else:
            self._stream = start_listener(session, self.listener, self.opts.remote_python)
        self._listener_ready.set()

    def run(self) -> tuple[list[HostResult], ListenerResult]:
        """Gather from every host in parallel; always stops the listener and closes every connection."""
        try:
            with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(self.results)), thread_name_prefix="doctor") as pool:
                list(pool.map(self._host, range(len(self.results))))
        finally:
            if self._stream is not None:
                self._collect_peers(self._stream.finish(5.0))
            for session in self._sessions:
                session.close()
        return self.results, self.listener

    def _collect_peers(self, lines: list[str]) -> None:
        for line in lines:
            try:
                self.listener.peers += json.loads(line).get("peers", [])
            except (ValueError, AttributeError):
                continue

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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from pydantic import ValidationError

from distlaunch import hostprobe
from distlaunch.doctor.model import DoctorOptions, HostFacts
from distlaunch.doctor.sessions import HostSession, LineStream, LocalSession, SshSession, StartGate
from distlaunch.launcher.planning import listener_script
from distlaunch.launcher.planning.hostfile import HostSlots
from distlaunch.readable import plural
from distlaunch.remote import sshlog
from distlaunch.remote.command import SHELL_FILES, shell_hang, without_shell_ready
from distlaunch.remote.ssh import SshError, connect
from distlaunch.remote.sshconfig import SshTarget

HERE = Path(__file__).parent
# The shared inventory probe, then the doctor's own: one program for a bare interpreter (probe_script.py)
PROBE_SOURCE = "\n".join(Path(p).read_text(encoding="utf-8") for p in (hostprobe.__file__, HERE / "probe_script.py"))
LISTENER_SOURCE = Path(listener_script.__file__).read_text(encoding="utf-8")  # the launcher's port check, run remotely
MAX_PARALLEL = 64
STOP_S = 0.8  # on Ctrl-C, how long stopping the remote processes may take before the doctor exits anyway
CLOCK_ROUND_TRIPS = 5
CLOCK_WAIT_S = 10.0  # bound on the clock helper's start and on each of its answers
# The clock helper: answers every line on stdin with its clock, so offsets come from several round trips.
CLOCK_SOURCE = (
    "import sys, time\n"
    "print('distlaunch-clock ready', flush=True)\n"
    "for _ in sys.stdin:\n"
    "    print('distlaunch-clock', repr(time.time()), flush=True)\n"
)


@dataclass
class HostResult:
    """What is known about one host after gathering."""

    host: str
    slots: HostSlots
    target: SshTarget | None  # None: this machine, no SSH
    ssh_error: SshError | None = None
    probe_error: str | None = None
    probe_hung: bool = False  # the interpreter started (or was started) but never answered
    shell_hung: bool = False  # the login shell never got to start the interpreter: a startup file hangs
    hint: str = ""  # the fix that goes with probe_error, where it is known when the error is
    facts: HostFacts | None = None
    ranks: HostResult | None = None  # with --python: the same probe, run by the ranks' interpreter

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
    chosen_at_launch: str = ""  # with --master-port auto: how run picks the port, and which one was probed


def is_loopback_name(name: str) -> bool:
    """True when every address ``name`` resolves to here is a loopback address."""
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
    except OSError:
        return False
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def open_session(
    result: HostResult, opts: DoctorOptions, nonce: str, gate: StartGate | None = None
) -> HostSession | None:
    """This machine as a local session, a remote host over SSH; None (with ``ssh_error`` set) on failure.
    A refused connection is tried once more (an sshd restarting); a timeout is not: it would double the wait.
    Commands start on the session only while ``gate`` is open."""
    if result.target is None:
        return LocalSession(result.host, nonce, gate)
    timeout = result.target.connect_timeout or opts.connect_timeout
    for attempt in range(2):
        try:
            client = connect(result.target, timeout=timeout, accept_new_host_keys=opts.accept_new_host_keys)
            return SshSession(result.host, client, nonce, gate)
        except SshError as exc:
            result.ssh_error = exc
            if exc.kind != "refused" or attempt:
                return None
            time.sleep(0.25)
    return None


def parse_after_banner(stdout: str, kind: str) -> dict | None:
    """The first line of ``stdout`` that is a JSON object with ``"ev": kind``; the lines before it are a login
    banner (a shell startup file that prints), skipped as the agent skips them before its hello."""
    for line in stdout.splitlines():
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and found.get("ev") == kind:
            return found
    return None


@contextmanager
def quiet_threads(log: list[str]) -> Iterator[None]:
    """While the doctor gathers, uncaught errors of background threads (a drain thread of an interpreter that
    hangs) go to ``log``, not stderr: the report already says what failed, as a check. paramiko's own log
    records are kept per host by :mod:`distlaunch.remote.sshlog`."""
    previous_hook = threading.excepthook

    def hook(args) -> None:
        log.append(f"{args.thread.name if args.thread else 'thread'}: {args.exc_type.__name__}: {args.exc_value}")

    sshlog.install()
    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous_hook


def start_listener(session: HostSession, listener: ListenerResult, python: str, timeout: float) -> LineStream | None:
    """Start the listener on the master and wait for its first report."""
    args = json.dumps({"master_addr": listener.address, "port": listener.port, "nonce": listener.nonce})
    try:
        stream = session.start([python, "-c", LISTENER_SOURCE, args])
    except (OSError, SshError) as exc:
        listener.error = f"cannot start {python} on {listener.host}: {exc}"
        return None
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while (line := stream.readline(max(deadline - time.monotonic(), 0.0))) is not None:
        status = parse_after_banner(line, "listener")
        if status is not None:
            break
        seen.append(line)
    else:
        seen, shell_ran = without_shell_ready(seen)
        if time.monotonic() >= deadline and not shell_ran and session.through_login_shell:
            listener.error = f"{listener.host}: " + shell_hang(listener.host, python, timeout)[0]
        elif time.monotonic() >= deadline:
            listener.error = (
                f"{python} on {listener.host} started but did not answer within {timeout:g}s (--start-timeout): "
                "the interpreter hangs at startup"
            )
        else:
            listener.error = f"{python} on {listener.host} did not start the listener" + (
                f": {seen[-1]}" if seen else ""
            )
        stream.finish(1.0)
        return None
    listener.status = status
    listener.started = True
    listener.bound = bool(listener.status.get("bound"))
    return stream


def run_probe(
    session: HostSession, result: HostResult, opts: DoctorOptions, probe_args: dict, python: str | None = None
) -> None:
    """Run the probe on the host with ``python`` (default: --remote-python) and record its facts (or why there are
    none) in ``result``."""
    python = python or opts.remote_python
    timeout = opts.reach_timeout + opts.start_timeout
    sent = time.time()
    try:
        done = session.run([python, "-", json.dumps(probe_args)], timeout=timeout, stdin=PROBE_SOURCE)
    except SshError as exc:
        result.probe_error = exc.detail
        if exc.kind == "shell":
            result.shell_hung = True
            result.probe_error, result.hint = shell_hang(result.host, python, timeout)
        elif exc.kind == "timeout":
            result.probe_hung = True
            result.probe_error = (
                f"{python} started but did not answer within {timeout:g}s (--start-timeout {opts.start_timeout:g} "
                f"and {opts.reach_timeout:g}s to reach the master): the interpreter hangs at startup"
            )
        return
    received = time.time()
    if done.rc != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit code {done.rc}"]
        result.probe_error = f"rc={done.rc}: {tail[0]}"
        return
    found = parse_after_banner(done.stdout, "probe")
    if found is None:
        shown = done.stdout.strip().splitlines()[:1]
        result.probe_error = (
            f"the probe's answer never came: the output is {shown[0][:120]!r}" + " …" * (len(done.stdout) > 120)
            if shown
            else "the probe printed nothing"
        ) + f"; a shell startup file on {result.host} prints it ({SHELL_FILES})"
        return
    try:
        result.facts = HostFacts.model_validate({**found, "sent_at": sent, "received_at": received})
    except ValidationError as exc:
        result.probe_error = f"unexpected probe output ({plural(exc.error_count(), 'field error')}): {str(found)[:200]}"


def measure_clock(session: HostSession, result: HostResult, python: str) -> None:
    """NTP-style: several round trips to a helper on the host; the one with the shortest round trip gives
    the offset (host minus here, taken at the middle of the trip), half its round trip the error bar."""
    try:
        stream = session.start([python, "-c", CLOCK_SOURCE])
    except (OSError, SshError, paramiko.SSHException) as exc:
        result.facts.clock_note = f"clock helper did not start: {exc}"
        return
    best: tuple[float, float] | None = None
    try:
        deadline = time.monotonic() + CLOCK_WAIT_S
        while (line := stream.readline(max(deadline - time.monotonic(), 0.0))) is not None:
            if line == "distlaunch-clock ready":
                break
        else:
            return
        for _ in range(CLOCK_ROUND_TRIPS):
            sent = time.time()
            stream.send(b"t\n")
            line = stream.readline(CLOCK_WAIT_S)
            received = time.time()
            if line is None or not line.startswith("distlaunch-clock "):
                return
            offset, trip = float(line.split()[1]) - (sent + received) / 2, received - sent
            if best is None or trip < best[1]:
                best = (offset, trip)
    except (OSError, ValueError, EOFError) as exc:
        result.facts.clock_note = f"clock helper failed: {exc}"
    finally:
        stream.finish(1.0)
        if best is not None:
            result.facts.ntp_offset, result.facts.ntp_error = best[0], best[1] / 2


class Gathering:
    """One doctor run's fan-out: sessions, the master's listener, the probes. Every process it starts on a
    host carries the run's mark, and every one still running is stopped before ``run`` returns or raises.

    Stopping closes the run's start gate first: from then on no thread starts anything (a host thread that
    the listener's end lets go on finds the gate closed), and the sweep by the mark runs only once the starts
    already under way have their processes on the hosts."""

    def __init__(self, results: list[HostResult], opts: DoctorOptions, master_addr: str | None, master_port: int = 0):
        """``master_addr`` None: no master, no listener and no clocks, only each host's probe (its inventory)."""
        self.results = results
        self.opts = opts
        self.master = master_addr is not None
        self.listener = ListenerResult(host=results[0].host, address=master_addr or "", port=master_port)
        self.nonce = secrets.token_hex(8)
        self.log: list[str] = []  # paramiko's messages and background threads' errors
        self._listener_ready = threading.Event()
        self._stream: LineStream | None = None
        self._sessions: list[HostSession] = []
        self._unfinished: set[int] = set()  # sessions (by id) where a command may still run: a hang
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_PARALLEL)
        self._gate = StartGate()
        if not self.master:
            self._listener_ready.set()

    def _host(self, index: int) -> None:
        result = self.results[index]
        session = None
        try:
            with self._slots:
                session = open_session(result, self.opts, self.nonce, self._gate)
                if session is not None:
                    with self._lock:
                        stopping = self._gate.closed  # under the lock: _stop has taken its list, or will see this one
                        if not stopping:
                            self._sessions.append(session)
                    if stopping:  # a connect that finished after Ctrl-C: nothing may start on it
                        session.close()
                        return
                if index == 0 and self.master:
                    self._start_master(session)
                if session is None:
                    return
                self._listener_ready.wait()
                args = {"workdir": self.opts.ranks_workdir}
                if self.master:
                    args.update(
                        master_addr=self.listener.address,
                        timeout=self.opts.reach_timeout,
                        port=self.listener.port if self.listener.bound else None,
                    )
                run_probe(session, result, self.opts, args)
                if result.facts is not None and self.opts.ranks_python:  # what the ranks run: torch is theirs
                    result.ranks = HostResult(host=result.host, slots=result.slots, target=result.target)
                    run_probe(session, result.ranks, self.opts, {}, python=self.opts.ranks_python)
                if result.facts is not None and self.master:
                    measure_clock(session, result, self.opts.remote_python)
                if any(r.probe_hung or r.shell_hung for r in (result, result.ranks) if r is not None):
                    with self._lock:
                        self._unfinished.add(id(session))
        except Exception as exc:
            result.probe_error = f"{type(exc).__name__}: {exc}"
        finally:
            if index == 0:
                self._listener_ready.set()  # never leave the other hosts waiting, whatever happened here

    def _start_master(self, session: HostSession | None) -> None:
        if session is None:
            self.listener.error = f"master host {self.listener.host} could not be reached"
        else:
            self._stream = start_listener(session, self.listener, self.opts.remote_python, self.opts.start_timeout)
            if not self.listener.started:
                with self._lock:
                    self._unfinished.add(id(session))
        self._listener_ready.set()

    def run(self) -> tuple[list[HostResult], ListenerResult]:
        """Gather from every host in parallel (daemon threads: Ctrl-C never waits for a pending connect);
        always stops the listener and every hung command, and closes every connection."""
        with quiet_threads(self.log):
            threads = [
                threading.Thread(target=self._host, args=(i,), name=f"doctor-{i}", daemon=True)
                for i in range(len(self.results))
            ]
            try:
                for t in threads:
                    t.start()
                for t in threads:
                    while t.is_alive():
                        t.join(0.2)  # short waits: the main thread stays responsive to Ctrl-C
            except BaseException:
                self._stop(STOP_S, everywhere=True)
                raise
            self._stop(5.0, everywhere=False)
        return self.results, self.listener

    def _stop(self, timeout: float, everywhere: bool) -> None:
        """End the listener, kill what is still running (everywhere: on every host, as after Ctrl-C), close.
        The gate closes first, so the sweep comes after the last start: nothing runs after it."""
        with self._lock:
            self._gate.close(0.0)  # under the lock: a session opened from now on is closed by its own thread
        if not self._gate.close(timeout / 2):  # the starts under way: each is one SSH round trip
            self.log.append(f"stopping: a start was still under way after {timeout / 2:g}s")
        with self._lock:
            sessions = list(self._sessions)
            unfinished = set(self._unfinished)
        if self._stream is not None and not everywhere:
            self._collect_peers(self._stream.finish(timeout))
        targets = [s for s in sessions if everywhere or id(s) in unfinished]
        if self._stream is not None and everywhere:
            targets = sessions
        stoppers = [threading.Thread(target=s.stop_all, args=(timeout,), daemon=True) for s in targets]
        deadline = time.monotonic() + timeout
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join(max(deadline - time.monotonic(), 0.0))
        for session in sessions:
            try:
                session.close()
            except Exception as exc:  # closing is best effort: a dead transport has nothing left to release
                self.log.append(f"closing {session.name}: {exc}")

    def _collect_peers(self, lines: list[str]) -> None:
        for line in lines:
            try:
                self.listener.peers += json.loads(line).get("peers", [])
            except (ValueError, AttributeError):
                continue

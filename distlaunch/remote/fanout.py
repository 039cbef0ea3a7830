"""``OpensshHosts``: the preflight over OpenSSH clients, one per host, started through a sliding window (as pdsh
does) and read by one thread (distlaunch/remote/pipes.py).

Every host's client runs the agent command at once (there is no separate connect step): a host is through its
handshake and login once its shell prints ``SHELL_READY``, and ready once its agent says hello. At most
``FANOUT`` hosts are in their handshake and login at a time; each has the agent start time from its own start.
A client that fails before its login is tried again (``RETRIES``, jittered back-off) unless ssh's words say no
retry can help, and its failure is then put in words (openssh.diagnose); one that fails after it, or whose
agent says nothing, in the words of ``RemoteHosts.start_failure``. Any failure raises HostsFailed before a rank starts.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import os
import queue
import random
import resource
import shlex
import subprocess
import time
from collections import deque

from distlaunch.contract.env import JOB_ID_VAR
from distlaunch.errors import HostError, UsageError
from distlaunch.remote.agent_conn import agent_command
from distlaunch.remote.command import after_login_shell, stop_marked_command
from distlaunch.remote.openssh import diagnose, is_final, ssh_command
from distlaunch.remote.pipes import PipeHub
from distlaunch.remote.session import SWEEP_S, HostSettings, RemoteHosts
from distlaunch.remote.ssh import RETRIES, RETRY_BASE_S, HostsFailed, SshError
from distlaunch.remote.sshconfig import SshTarget
from distlaunch.remote.sshproc import ProcessAgent, SshProcess

# Hosts in their handshake and login at once (pdsh's default is 32). The clients' work runs in their own
# processes, in C, so the launcher's CPU does not bound this; the launching machine's cores do, and where many
# names lead to one server, that sshd's MaxStartups (10 connections not yet logged in, by default).
FANOUT = 64
FDS_PER_HOST = 2  # the pipes to a client's stdin and from its stdout


class OpensshHosts(RemoteHosts):
    """The remote hosts of a job, each reached by an OpenSSH client that runs its agent."""

    def __init__(
        self,
        targets: dict[str, SshTarget],
        python: str,
        workdir: str,
        job_id: str,
        config: str | None,
        accept_new: bool = False,
        timeout: float | None = None,
    ):
        super().__init__(python, workdir, job_id)
        self.targets, self.config = targets, config
        self.accept_new, self.timeout = accept_new, timeout  # --accept-new-host-keys; the connect timeout
        self.hub = PipeHub()
        self.started: dict[str, SshProcess] = {}  # preflight agents that said hello and wait for a plan
        self.processes: list[SshProcess] = []  # every client started, to end what is left at close
        self.env = {**os.environ, JOB_ID_VAR: job_id} if job_id else dict(os.environ)  # found as the job's own

    @classmethod
    def connect(cls, targets: dict[str, SshTarget], settings: HostSettings) -> OpensshHosts:
        _allow_descriptors(FDS_PER_HOST * len(targets))
        config = str(settings.ssh_config) if settings.ssh_config else None
        return cls(
            targets, settings.python, settings.workdir, settings.job_id, config, settings.accept_new_host_keys,
            settings.timeout,
        )  # fmt: skip

    def client(self, alias: str, heard) -> SshProcess:
        """A new client (not started yet) that runs the agent on ``alias``; ``heard`` is told of its steps."""
        command = after_login_shell(agent_command(self.python, self.workdir, self.job_id))
        argv = ssh_command(
            self.targets[alias], command, config=self.config, timeout=self.timeout, accept_new_host_keys=self.accept_new
        )
        process = SshProcess(alias, argv, self.hub, self.env, heard)
        self.processes.append(process)
        return process

    def start_agents(self, timeout: float) -> None:
        """Start every host's agent through the window and wait for its hello, or raise HostsFailed."""
        preflight = _Preflight(self, timeout)
        while preflight.todo or preflight.later or preflight.starting:
            preflight.start_more()
            preflight.give_up_late()
            preflight.judge(preflight.wait())
        self._sweep(preflight.hung)
        self._raise(preflight.errors, preflight.unreached)

    def _raise(self, errors: dict[str, HostError], unreached: dict[str, tuple[SshTarget, list[str]]]) -> None:
        """HostsFailed for what went wrong, in the hostfile's order: hosts that could not be reached first, as
        the paramiko path (which reaches every host before it starts any agent) would say."""
        if unreached:
            found = diagnose(unreached, self.timeout, self.accept_new)
            raise HostsFailed(
                [found[a] for a in self.targets if a in found], "could not be reached; no rank was started"
            )
        if errors:
            ordered = [errors[a] for a in self.targets if a in errors]
            raise HostsFailed(ordered, "cannot start the distlaunch agent; no rank was started")

    def _sweep(self, hung: list[SshProcess]) -> None:
        """An interpreter that hangs at startup never runs the agent's code, which would end it with the
        connection: closing that leaves it, and whatever it started, on the host. Its login shell worked, so a
        second command ends every process there that carries the job's id (none of the job's ranks runs there:
        its agent never started); on every such host at once, for SWEEP_S at most."""
        if not hung or not self.job_id:
            return
        sweep = after_login_shell(shlex.join(["sh", "-c", stop_marked_command(JOB_ID_VAR, self.job_id)]))
        env = {k: v for k, v in self.env.items() if k != JOB_ID_VAR}  # unmarked: never a target of its own sweep
        sweeps = []
        for process in hung:
            argv = ssh_command(
                self.targets[process.alias], sweep, config=self.config, accept_new_host_keys=self.accept_new
            )
            with contextlib.suppress(OSError):
                quiet = subprocess.DEVNULL
                sweeps.append(
                    subprocess.Popen(argv, stdin=quiet, stdout=quiet, stderr=quiet, start_new_session=True, env=env)
                )
        deadline = time.monotonic() + SWEEP_S
        for proc in sweeps:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:  # the host is gone: its sshd ends the session
                proc.kill()
                proc.wait()

    def __contains__(self, host: str) -> bool:
        return host in self.targets

    def agent(self, node_rank: int, host: str, events) -> ProcessAgent:
        """The agent connection for the node on ``host``: the preflight's agent on first use, then a new client
        for each restart."""
        process = self.started.pop(host, None) or self.client(host, _ignore)
        bounds = self.clock_bounds.get(host, (-math.inf, math.inf))
        return ProcessAgent(node_rank, host, events, process, self.workdir, bounds)

    def close(self) -> None:
        """End every client still running (their agents read EOF and stop what they started) and the reader."""
        for process in self.processes:
            process.finish(0)
        self.processes.clear()
        self.started.clear()
        self.hub.close()


class _Preflight:
    """The state of one preflight: which hosts wait for a start, a retry, a login or a hello; what went wrong."""

    def __init__(self, hosts: OpensshHosts, timeout: float):
        self.hosts, self.timeout = hosts, timeout
        self.news: queue.SimpleQueue[SshProcess] = queue.SimpleQueue()  # a client's step, from the hub's thread
        self.todo = deque(hosts.targets)
        self.later: list[tuple[float, str]] = []  # heap of (when, alias): clients tried again after a back-off
        self.tries = dict.fromkeys(hosts.targets, 0)
        self.starting: dict[str, SshProcess] = {}  # no hello yet, in the order they started (and time out)
        self.in_login: set[str] = set()  # the window: started, not logged in yet
        self.unreached: dict[str, tuple[SshTarget, list[str]]] = {}  # failed before their login: diagnosed later
        self.errors: dict[str, HostError] = {}
        self.hung: list[SshProcess] = []  # agents whose interpreter hangs at startup: what they started is ended

    def start_more(self) -> None:
        """Start the clients that are due, as far as the window lets."""
        now = time.monotonic()
        while self.later and self.later[0][0] <= now:
            self.todo.append(heapq.heappop(self.later)[1])
        while self.todo and len(self.in_login) < FANOUT:
            alias = self.todo.popleft()
            process = self.hosts.client(alias, self.news.put)
            try:
                process.spawn()
            except SshError as exc:
                self.errors[alias] = exc
                continue
            self.starting[alias] = process
            self.in_login.add(alias)

    def give_up_late(self) -> None:
        """Agents whose start took longer than the timeout: why, from what their host said."""
        now = time.monotonic()
        for alias, process in list(self.starting.items()):  # the oldest first: the first in time is the last out
            if now - process.started_at <= self.timeout:
                return
            process.silent_for = round(self.timeout, 1)  # however long this loop took to notice
            self.errors[alias] = self.hosts.start_failure(alias, process.output, process)
            self._done_with(alias)
            process.finish(0)
            if process.logged_in:
                self.hung.append(process)

    def wait(self) -> set[SshProcess]:
        """The clients that took a step, waiting for one until the next retry or time-out is due."""
        due = [when for when, _ in self.later[:1]]
        oldest = next(iter(self.starting.values()), None)
        if oldest is not None:
            due.append(oldest.started_at + self.timeout)
        if not due:
            return set()  # every host is through (or its client could not even be started)
        try:  # a signal's handler runs (and may raise) while this waits
            heard = {self.news.get(timeout=max(0.0, min(due) - time.monotonic()) + 0.01)}
        except queue.Empty:
            return set()
        with contextlib.suppress(queue.Empty):
            while True:  # every step that came meanwhile
                heard.add(self.news.get_nowait())
        return heard

    def judge(self, heard: set[SshProcess]) -> None:
        """Where each client that took a step now is: logged in, ready (hello), or ended without a hello."""
        for process in heard:
            alias = process.alias
            if self.starting.get(alias) is not process:
                continue  # given up already
            if process.logged_in:
                self.in_login.discard(alias)
            if process.hello:
                self._done_with(alias)
                self._ready(alias, process)
            elif process.done.is_set():
                self._done_with(alias)
                self._ended(alias, process)
                process.finish(1.0)

    def _ready(self, alias: str, process: SshProcess) -> None:
        refused = self.hosts.hello_error(alias, process.hello)
        if refused is not None:
            self.errors[alias] = refused
        else:
            self.hosts.started[alias] = process
            self.hosts.heard(alias, process.hello, process.clock_bounds)

    def _ended(self, alias: str, process: SshProcess) -> None:
        """A client that ended without a hello: the agent failed, or the connection did (then a retry, or
        the diagnosis)."""
        if process.logged_in:
            self.errors[alias] = self.hosts.start_failure(alias, process.output, process)
        elif self.tries[alias] < RETRIES and not is_final(process.output):
            back_off = RETRY_BASE_S * 2 ** self.tries[alias] * random.uniform(0.5, 1.5)
            heapq.heappush(self.later, (time.monotonic() + back_off, alias))
            self.tries[alias] += 1
        else:
            self.unreached[alias] = (self.hosts.targets[alias], process.output)

    def _done_with(self, alias: str) -> None:
        self.starting.pop(alias, None)
        self.in_login.discard(alias)


def _ignore(process: SshProcess) -> None:
    pass


def _allow_descriptors(needed: int) -> None:
    """Raise this process's soft limit on open files to what ``needed`` more pipes take (the hard limit at most):
    1,024 by default, which 500 hosts would exhaust."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 256  # the launcher's own files, logs and sockets
    if want <= soft:
        return
    if hard != resource.RLIM_INFINITY and want > hard:
        raise UsageError(
            f"{needed // FDS_PER_HOST} remote hosts need {want} open files, and this process may open {hard}",
            "raise the hard limit (ulimit -Hn, or nofile in /etc/security/limits.conf)",
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else hard, hard))

"""``RemoteHosts``: the SSH side of one launch, opened by ``preflight`` (distlaunch/remote/preflight.py): every
remote host connected in parallel and its agent started, which says hello before it is given any work; so an
unreachable host, or one that cannot run the agent, fails the launch with exit 3 before any rank starts
anywhere. Then each node's agent gets its plan; connections are closed in finally.

Two transports do this. By default each host gets an OpenSSH client process, and one thread reads them all
(``OpensshHosts``, distlaunch/remote/fanout.py); where no ``ssh`` is installed, or with
DISTLAUNCH_SSH_TRANSPORT=paramiko, paramiko connects from inside the launcher (``ParamikoHosts``, here). What
their failures mean, in words, is said here once for both (``RemoteHosts.start_failure``)."""

from __future__ import annotations

import contextlib
import math
import time
from abc import ABC, abstractmethod
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import NamedTuple

from distlaunch.contract.env import JOB_ID_VAR
from distlaunch.contract.inventory import HostInventory
from distlaunch.errors import HostError
from distlaunch.protocol import NEEDS_FLOOR, PROTOCOL, PYTHON_FLOOR, AgentConnection
from distlaunch.remote.agent_conn import START_TIMEOUT_VAR, SshAgent, StartedAgent
from distlaunch.remote.command import run_command, shell_hang, stop_marked_command, without_shell_ready
from distlaunch.remote.ssh import HostsFailed, SshClient, SshError, close_all, connect_all, require_all
from distlaunch.remote.sshconfig import SshTarget

SWEEP_S = 10.0  # how long ending what a hung agent start left on its host may take


def other_version(alias: str, protocol) -> HostError:
    """A host whose agent speaks another protocol: another distlaunch is installed there."""
    older = isinstance(protocol, int) and protocol < PROTOCOL
    return HostError(
        f"{alias}: its distlaunch is {'older' if older else 'newer'} than this launcher's "
        f"(agent protocol {protocol}, here {PROTOCOL}); the two cannot run a job together",
        f"install distlaunch {launcher_version()} there, as here, or point --remote-python at an interpreter "
        "that has it",
    )


def launcher_version() -> str:
    try:
        return version("distlaunch")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(this launcher's version)"


def _on(alias: str, error: HostError) -> HostError:
    """``error``, marked as ``alias``'s own (a job with spares replaces that host)."""
    error.host = alias
    return error


class HostSettings(NamedTuple):
    """How a launch reaches its hosts, whatever the transport."""

    ssh_config: Path | str | None
    accept_new_host_keys: bool  # --accept-new-host-keys
    python: str  # --remote-python
    workdir: str
    job_id: str
    timeout: float | None  # the connect timeout


class RemoteHosts(ABC):
    """The remote hosts of a job, each with an agent that said hello and waits for its node plan."""

    def __init__(self, python: str, workdir: str, job_id: str = ""):
        self.python, self.workdir, self.job_id = python, workdir, job_id  # job_id: what marks its processes
        # host -> where its wall clock minus ours lies, from its agent's hello (protocol.clock_bounds)
        self.clock_bounds: dict[str, tuple[float, float]] = {}
        # host -> what it has, as its agent's hello tells (missing where the hello carried none, or a garbled one)
        self.inventories: dict[str, HostInventory] = {}

    @classmethod
    @abstractmethod
    def connect(cls, targets: dict[str, SshTarget], settings: HostSettings) -> RemoteHosts:
        """This transport's hosts for ``targets``, before any agent starts (raise HostsFailed for hosts that
        cannot be reached at all)."""

    @abstractmethod
    def start_agents(self, timeout: float) -> None:
        """Start every host's agent and wait ``timeout`` seconds for their hellos, or raise HostsFailed."""

    @abstractmethod
    def __contains__(self, host: str) -> bool:
        """Whether ``host`` is one of this launch's remote hosts."""

    @abstractmethod
    def agent(self, node_rank: int, host: str, events) -> AgentConnection:
        """The agent connection for the node on ``host`` (the preflight's agent on first use)."""

    @abstractmethod
    def close(self) -> None:
        """End agents that never got a plan and every connection."""

    def __enter__(self) -> RemoteHosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def heard(self, alias: str, hello: dict, bounds: tuple[float, float]) -> None:
        """Keep what the accepted ``hello`` of ``alias``'s agent told: its clock's offset and its inventory."""
        self.clock_bounds[alias] = bounds
        inventory = HostInventory.of(hello.get("inventory"))
        if inventory is not None:
            self.inventories[alias] = inventory

    def hello_error(self, alias: str, hello: dict) -> HostError | None:
        """What keeps an agent that said ``hello`` from the job: another distlaunch's protocol. None: nothing."""
        protocol = hello.get("protocol", 1)
        return None if protocol == PROTOCOL else _on(alias, other_version(alias, protocol))

    def start_failure(self, alias: str, output: list[str], agent) -> HostError:
        """Why the agent on ``alias`` did not start, from what the remote shell or Python printed (``agent``: its
        start, with ``silent_for`` and ``exit_status()``), as that host's own error."""
        return _on(alias, self._why(alias, output, agent))

    def _why(self, alias: str, output: list[str], agent) -> HostError:
        output, shell_ran = without_shell_ready(output)
        if agent.silent_for is not None and not shell_ran:
            detail, hint = shell_hang(alias, "the agent", agent.silent_for)
            return HostError(f"{alias}: {detail}", hint)
        if agent.silent_for is not None:
            return HostError(
                f"{alias}: {self.python} -m distlaunch.agent started but did not say hello within "
                f"{agent.silent_for:g}s: the interpreter hangs at startup",
                f"run it by hand to see where it waits: ssh {alias} {self.python} -m distlaunch.agent (something "
                "at its startup blocks: sitecustomize, a .pth file, a hung network file system); if it is only "
                f"slow, give it longer with {START_TIMEOUT_VAR}=SECONDS",
            )
        text = "\n".join(output)
        status = agent.exit_status()
        last = output[-1] if output else f"exit status {status}"
        if NEEDS_FLOOR in last:  # the agent's own line: that interpreter is older than the floor
            floor = ".".join(map(str, PYTHON_FLOOR))
            return HostError(f"{alias}: {last}", f"point --remote-python at Python {floor} or newer there")
        if "cd" in text and self.workdir in text:
            return HostError(
                f"{alias}: working directory {self.workdir!r} is not usable ({last})",
                f"create it on {alias} (the same checkout as here), or pass --workdir DIR",
            )
        if status == 127 or (self.python in text and ("not found" in text or "No such file" in text)):
            return HostError(
                f"{alias}: Python {self.python!r} not found ({last})",
                "install Python there, or pass --remote-python PATH (an interpreter with distlaunch installed)",
            )
        if "No module named" in text:
            return HostError(
                f"{alias}: {self.python} cannot import distlaunch ({last})",
                f"install distlaunch for that Python on {alias} (pip install distlaunch), or pass --remote-python / --workdir",
            )
        return HostError(
            f"{alias}: {self.python} -m distlaunch.agent did not start: {last}",
            f"run it by hand to see why: ssh {alias} {self.python} -m distlaunch.agent",
        )


class ParamikoHosts(RemoteHosts):
    """Open paramiko connections to the remote hosts of a job, each with an agent waiting for its node plan."""

    def __init__(self, clients: dict[str, SshClient], python: str, workdir: str, job_id: str = ""):
        super().__init__(python, workdir, job_id)
        self.clients = clients
        self.started: dict[str, StartedAgent] = {}

    @classmethod
    def connect(cls, targets: dict[str, SshTarget], settings: HostSettings) -> ParamikoHosts:
        results = connect_all(targets, timeout=settings.timeout, accept_new_host_keys=settings.accept_new_host_keys)
        reached = require_all(results, "could not be reached; no rank was started")
        return cls(reached, settings.python, settings.workdir, settings.job_id)

    def start_agents(self, timeout: float) -> None:
        """Start every host's agent (all at once) and wait ``timeout`` seconds for their hellos, or raise
        HostsFailed."""
        errors: list[HostError] = []
        for alias, client in self.clients.items():
            try:
                self.started[alias] = StartedAgent.start(client, alias, self.python, self.workdir, self.job_id)
            except SshError as exc:
                errors.append(exc)
        deadline = time.monotonic() + timeout  # one deadline for all: they started together
        for alias, agent in self.started.items():
            output = agent.wait_hello(max(deadline - time.monotonic(), 0.1))
            if output is not None:
                errors.append(self.start_failure(alias, output, agent))
                if agent.silent_for is not None and without_shell_ready(output)[1]:
                    self._end_hung_start(alias, agent)
            elif (refused := self.hello_error(alias, agent.hello)) is not None:
                errors.append(refused)
            else:
                self.heard(alias, agent.hello, agent.clock_bounds)
        if errors:
            raise HostsFailed(errors, "cannot start the distlaunch agent; no rank was started")

    def _end_hung_start(self, alias: str, agent: StartedAgent) -> None:
        """An interpreter that hangs at startup never runs the agent's code, which would end it with the SSH
        channel: closing the channel leaves it, and whatever it started, on the host. Its login shell worked, so
        a second command ends every process there that carries the job's id (none of the job's ranks runs there:
        its agent never started)."""
        agent.close()
        if self.job_id:
            with contextlib.suppress(SshError):  # the connection is gone: sshd hangs up its sessions itself
                run_command(self.clients[alias], ["sh", "-c", stop_marked_command(JOB_ID_VAR, self.job_id)], SWEEP_S)

    def __contains__(self, host: str) -> bool:
        return host in self.clients

    def agent(self, node_rank: int, host: str, events) -> SshAgent:
        """The agent connection for the node on ``host`` (the preflight's agent on first use)."""
        started, bounds = self.started.pop(host, None), self.clock_bounds.get(host, (-math.inf, math.inf))
        return SshAgent(node_rank, host, events, self.clients[host], self.python, self.workdir, started, bounds)

    def close(self) -> None:
        """Stop agents that never got a plan (their stdin closes) and disconnect from every host."""
        for agent in self.started.values():
            agent.close()
        self.started.clear()
        close_all(self.clients)

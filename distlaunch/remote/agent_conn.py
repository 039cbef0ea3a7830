"""``SshAgent``: the per-node agent on a remote host, started on one SSH channel of an open connection.

The node plan travels as JSON on the channel's stdin, so argv and env values reach the ranks byte for
byte; only the agent's own command line goes through the remote shell, every word shlex-quoted. No
pty: when the launcher dies the channel closes, the agent reads EOF on stdin and stops its ranks.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import threading
import time
from collections.abc import Iterator

import paramiko

from distlaunch.contract.env import JOB_ID_VAR
from distlaunch.errors import UsageError
from distlaunch.protocol import HELLO, AgentConnection, clock_bounds, nearest_zero
from distlaunch.remote.command import SHELL_READY, after_login_shell
from distlaunch.remote.ssh import SshError

CLOSE_WAIT_S = 10.0  # how long close() waits for the agent to finish (it has usually sent "done" already)
HELLO_TIMEOUT_S = 30.0  # an agent that has not said hello by then cannot start on that host
START_TIMEOUT_VAR = "DISTLAUNCH_AGENT_START_TIMEOUT"  # seconds, in place of HELLO_TIMEOUT_S


def hello_timeout() -> float:
    """How long every host's agent has to say hello (a login shell, then Python's start-up): 30 s, or
    $DISTLAUNCH_AGENT_START_TIMEOUT. A Python on a slow network file system, cold, may need more."""
    text = os.environ.get(START_TIMEOUT_VAR)
    if text is None:
        return HELLO_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise UsageError(
            f"{START_TIMEOUT_VAR}={text!r} is not a number of seconds",
            f"set it to e.g. 120, or unset it ({HELLO_TIMEOUT_S:g} s)",
        )
    return seconds


class StartedAgent:
    """An agent process running on a host that said hello and now waits for its node plan on stdin."""

    def __init__(self, channel: paramiko.Channel, stream, sent: float):
        self.channel, self.stream = channel, stream
        self.started_at = time.monotonic()
        self.sent = sent  # wall clock just before the agent's command went out: its hello came after
        self.hello: dict = {}  # what the agent said in its hello
        self.clock_bounds = (-math.inf, math.inf)  # where the host's clock offset lies, as its hello tells
        self.silent_for: float | None = None  # set when the agent did not say hello in time: since its start

    @classmethod
    def start(cls, client: paramiko.SSHClient, host: str, python: str, workdir: str, job_id: str) -> StartedAgent:
        """Run the agent command on a new channel (no pty: its stdin closes when we go away)."""
        transport = client.get_transport()
        try:
            if transport is None or not transport.is_active():
                raise paramiko.SSHException("the connection is closed")
            channel = transport.open_session(timeout=CLOSE_WAIT_S)
            channel.set_combine_stderr(True)  # a shell or interpreter error shows as agent output
            sent = time.time()
            channel.exec_command(after_login_shell(agent_command(python, workdir, job_id)))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise SshError(
                host,
                "other",
                f"cannot start the agent over SSH: {exc}",
                f"check that {host} is still up (ssh {host} true)",
            ) from None
        return cls(channel, channel.makefile("rb"), sent)

    def wait_hello(self, timeout: float) -> list[str] | None:
        """None once the agent said hello; else everything it printed before it ended (why it failed),
        ``SHELL_READY`` included once the login shell got as far as running the agent's command."""
        self.channel.settimeout(timeout)
        output = []
        try:
            for raw in self.stream:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                hello = parse_hello(line)
                if hello is not None:
                    self.hello = hello
                    self.clock_bounds = clock_bounds(hello.get("now"), self.sent, time.time())
                    return None
                output.append(line)
        except (OSError, EOFError, paramiko.SSHException):  # socket.timeout is an OSError
            self.silent_for = round(time.monotonic() - self.started_at)
            output.append(f"(no hello within {self.silent_for:g}s)")
        finally:
            self.channel.settimeout(None)
        return output

    def exit_status(self, timeout: float = 5.0) -> int:
        """The agent command's exit status once it ended (-1 if sshd has not said within ``timeout``)."""
        self.channel.status_event.wait(timeout)
        return self.channel.exit_status

    def close(self) -> None:
        self.channel.close()


def agent_command(python: str, workdir: str, job_id: str = "") -> str:
    """The remote shell command that starts the agent in ``workdir``, marked with the job id."""
    mark = f"env {JOB_ID_VAR}={shlex.quote(job_id)} " if job_id else ""
    # -X utf8: the agent's JSON lines are UTF-8 whatever locale the SSH login has.
    return f"cd -- {shlex.quote(workdir)} && exec {mark}{shlex.quote(python)} -X utf8 -m distlaunch.agent"


def plan_job_id(payload: dict) -> str:
    """The job id a node plan gives its ranks (its agent carries it too)."""
    ranks = payload.get("ranks") or [{}]
    return ranks[0].get("env", {}).get(JOB_ID_VAR, "")


def parse_hello(line: str) -> dict | None:
    """The agent's hello, if ``line`` is one."""
    try:
        message = json.loads(line)
    except ValueError:
        return None  # a login banner, or the error that kept the agent from starting
    return message if isinstance(message, dict) and message.get("ev") == HELLO else None


def _lines(stream) -> Iterator[str]:
    with stream:
        for raw in stream:
            line = raw.decode("utf-8", "replace")
            if line.rstrip("\n") != SHELL_READY:  # an agent started without the preflight: not its output
                yield line


class SshAgent(AgentConnection):
    """An agent on a remote host, on its own channel of an already open SSH connection."""

    def __init__(
        self,
        node_rank: int,
        host: str,
        events,
        client: paramiko.SSHClient,
        python: str,
        workdir: str,
        started: StartedAgent | None = None,
        bounds: tuple[float, float] = (-math.inf, math.inf),
    ):
        super().__init__(node_rank, host, events)
        # measured by the preflight's agent on that host (its hello), narrowed by each attempt's "ready"
        self.clock_bounds, self.clock_offset = bounds, nearest_zero(*bounds)
        self.client, self.python, self.workdir = client, python, workdir
        self.started = started  # the preflight's agent, already running; else one is started here
        self.channel: paramiko.Channel | None = None
        self._pump: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self, payload: dict) -> None:
        workdir = payload.get("workdir") or self.workdir
        agent, self.started = self.started, None
        agent = agent or StartedAgent.start(self.client, self.host, self.python, workdir, plan_job_id(payload))
        self.channel = agent.channel
        # Remote ranks get a minimal environment plus the plan's, never this machine's whole environment.
        self.plan_sent = time.time()
        self.send({**payload, "workdir": workdir, "inherit_env": False})
        self._pump = threading.Thread(
            target=self.pump, args=(_lines(agent.stream),), daemon=True, name=f"agent-{self.host}"
        )
        self._pump.start()

    def send(self, message: dict) -> None:
        # The agent or the connection may already be gone; its missing "done" reports that.
        with self._lock, contextlib.suppress(OSError, EOFError, AttributeError, paramiko.SSHException):
            self.channel.sendall((json.dumps(message) + "\n").encode("utf-8"))

    def close(self, wait_s: float | None = None) -> None:
        if self.channel is None:
            if self.started is not None:
                self.started.close()
            return
        try:
            self.channel.shutdown_write()  # EOF: an agent still running stops its ranks by itself
            if self._pump is not None:
                self._pump.join(CLOSE_WAIT_S if wait_s is None else wait_s)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            self.channel.close()

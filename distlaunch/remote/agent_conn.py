"""``SshAgent``: the per-node agent on a remote host, started on one SSH channel of an open connection.

The node plan travels as JSON on the channel's stdin, so argv and env values reach the ranks byte for
byte; only the agent's own command line goes through the remote shell, every word shlex-quoted. No
pty: when the launcher dies the channel closes, the agent reads EOF on stdin and stops its ranks.
"""

from __future__ import annotations

import json
import shlex
import threading
from typing import Iterator

import paramiko

from distlaunch.launcher.transport import AgentConnection
from distlaunch.remote.ssh import SshError

CLOSE_WAIT_S = 10.0  # how long close() waits for the agent to finish (it has usually sent "done" already)


def agent_command(python: str, workdir: str, job_id: str = "") -> str:
    """The remote shell command that starts the agent in ``workdir``, marked with the job id."""
    mark = f"env DISTLAUNCH_JOB_ID={shlex.quote(job_id)} " if job_id else ""
    # -X utf8: the agent's JSON lines are UTF-8 whatever locale the SSH login has.
    return f"cd -- {shlex.quote(workdir)} && exec {mark}{shlex.quote(python)} -X utf8 -m distlaunch.agent"


def _job_id(payload: dict) -> str:
    ranks = payload.get("ranks") or [{}]
    return ranks[0].get("env", {}).get("DISTLAUNCH_JOB_ID", "")


class SshAgent(AgentConnection):
    """An agent on a remote host, on its own channel of an already open SSH connection."""

    def __init__(self, node_rank: int, host: str, events, client: paramiko.SSHClient, python: str, workdir: str):
        super().__init__(node_rank, host, events)
        self.client, self.python, self.workdir = client, python, workdir
        self.channel: paramiko.Channel | None = None
        self._pump: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self, payload: dict) -> None:
        workdir = payload.get("workdir") or self.workdir
        transport = self.client.get_transport()
        try:
            if transport is None or not transport.is_active():
                raise paramiko.SSHException("the connection is closed")
            self.channel = transport.open_session(timeout=CLOSE_WAIT_S)
            self.channel.set_combine_stderr(True)  # a shell or interpreter error shows as agent output
            self.channel.exec_command(agent_command(self.python, workdir, _job_id(payload)))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise SshError(self.host, "other", f"cannot start the agent over SSH: {exc}",
                           f"check that {self.host} is still up (ssh {self.host} true)") from None
        # Remote ranks get a minimal environment plus the plan's, never this machine's whole environment.
        self.send({**payload, "workdir": workdir, "inherit_env": False})
        self._pump = threading.Thread(target=self.pump, args=(self._lines(),), daemon=True, name=f"agent-{self.host}")
        self._pump.start()

    def _lines(self) -> Iterator[str]:
        with self.channel.makefile("rb") as stream:
            for raw in stream:
                yield raw.decode("utf-8", "replace")

    def send(self, message: dict) -> None:
        with self._lock:
            try:
                self.channel.sendall((json.dumps(message) + "\n").encode("utf-8"))
            except (OSError, EOFError, AttributeError, paramiko.SSHException):
                pass  # the agent or the connection is already gone; its missing "done" reports that

    def close(self) -> None:
        if self.channel is None:
            return
        try:
            self.channel.shutdown_write()  # EOF: an agent still running stops its ranks by itself
            if self._pump is not None:
                self._pump.join(CLOSE_WAIT_S)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            self.channel.close()

"""The local agent connection: ``python -m distlaunch.agent`` as a child process on this machine (remote hosts:
distlaunch/remote/sshproc.py, or agent_conn.py over paramiko). The protocol and the shared reader are in
distlaunch/protocol.py."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from typing import IO

from distlaunch.agent.strays import end_stragglers
from distlaunch.protocol import AgentConnection, encode


class LocalAgent(AgentConnection):
    """An agent started as a child process on this machine, in its own session so a terminal ^C reaches
    only the launcher, which then stops everything in order."""

    def __init__(self, node_rank: int, host: str, events, python: str = sys.executable):
        super().__init__(node_rank, host, events)
        self.python = python
        self.proc: subprocess.Popen | None = None
        self.ranks: list[dict] = []  # the plan's ranks, whose marks find what they leave behind
        self._lock = threading.Lock()

    def start(self, payload: dict) -> None:
        self.proc = subprocess.Popen(
            [self.python, "-m", "distlaunch.agent"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
            bufsize=1,
        )
        self.plan_sent = time.time()
        self.ranks = payload["ranks"]
        self.send({**payload, "inherit_env": True})  # like torchrun: local ranks see the launcher's environment
        threading.Thread(target=self.pump, args=(self.proc.stdout,), daemon=True).start()

    def send(self, message: dict) -> None:
        stdin: IO[str] | None = self.proc.stdin if self.proc else None
        with self._lock:
            try:
                stdin.write(encode(message))
                stdin.flush()
            except (BrokenPipeError, ValueError, AttributeError):
                pass  # the agent is already gone; its missing "done" reports that

    def close(self, wait_s: float | None = None) -> None:
        if self.proc:
            with contextlib.suppress(BrokenPipeError, OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:  # a frozen agent: SIGKILL takes its ranks with it (PDEATHSIG)
                self.proc.kill()
                self.proc.wait()
            if self.proc.returncode:  # it died before it could end what its ranks left (their children)
                end_stragglers(self.ranks)

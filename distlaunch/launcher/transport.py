"""Connections to per-node agents. Every node, local or remote, runs ``python -m distlaunch.agent``;
a connection starts it, sends it the node's plan and commands, and turns its stdout into events."""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import IO


class AgentConnection(ABC):
    """Base: a started agent whose JSON-line events are posted to ``events`` as (node_rank, event)."""

    def __init__(self, node_rank: int, host: str, events: queue.Queue[tuple[int, dict]]):
        self.node_rank = node_rank
        self.host = host
        self.events = events
        self.last_seen = time.monotonic()  # when the agent last said anything (its heartbeat included)
        self.done = False

    @abstractmethod
    def start(self, payload: dict) -> None:
        """Start the agent and send it its node plan."""

    @abstractmethod
    def send(self, message: dict) -> None:
        """Send a command line to the agent."""

    @abstractmethod
    def close(self, wait_s: float | None = None) -> None:
        """Close the connection and wait for the agent (at most ``wait_s``, then leave it)."""

    def pump(self, lines: Iterator[str]) -> None:
        """Read agent output until it ends; a missing ``done`` means the agent died."""
        done = False
        for line in lines:
            self.last_seen = time.monotonic()
            try:
                event = json.loads(line)
            except ValueError:  # not ours: a remote login banner or an interpreter crash
                event = {"ev": "agent-out", "line": line.rstrip("\n")}
            done = done or event.get("ev") == "done"
            if event.get("ev") != "hb":
                self.events.put((self.node_rank, event))
        if not done:
            self.events.put((self.node_rank, {"ev": "lost"}))


class LocalAgent(AgentConnection):
    """An agent started as a child process on this machine, in its own session so a terminal ^C reaches
    only the launcher, which then stops everything in order."""

    def __init__(self, node_rank: int, host: str, events, python: str = sys.executable):
        super().__init__(node_rank, host, events)
        self.python = python
        self.proc: subprocess.Popen | None = None
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
        self.send({**payload, "inherit_env": True})  # like torchrun: local ranks see the launcher's environment
        threading.Thread(target=self.pump, args=(self.proc.stdout,), daemon=True).start()

    def send(self, message: dict) -> None:
        stdin: IO[str] | None = self.proc.stdin if self.proc else None
        with self._lock:
            try:
                stdin.write(json.dumps(message) + "\n")
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

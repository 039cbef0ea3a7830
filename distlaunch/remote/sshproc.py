"""One host's OpenSSH client running its agent (``SshProcess``), and the launcher's end of that agent
(``ProcessAgent``). The client's stdout is read by the launch's one ``PipeHub`` thread; its stdin is written by
whoever sends, never blocking: what a full pipe does not take now, the hub writes once it can.

No pty (``ssh -T``): when the launcher goes away the client's stdin closes, the agent reads EOF and stops its
ranks; the client runs in its own session, so a terminal's Ctrl-C reaches only the launcher, which then stops
everything in order.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import threading
import time
from collections.abc import Callable

from distlaunch.protocol import AgentConnection, clock_bounds, encode, nearest_zero
from distlaunch.remote.agent_conn import CLOSE_WAIT_S, parse_hello
from distlaunch.remote.command import SHELL_READY
from distlaunch.remote.pipes import PipeHub
from distlaunch.remote.ssh import SshError


class SshProcess:
    """``ssh HOST <agent command>``: started by ``spawn``; until a connection takes its lines (``attach``), it
    keeps what the host said before its agent's hello (ssh's errors, a banner, the login shell's
    ``SHELL_READY``) and calls ``heard(self)`` at each step of its start: logged in, hello, ended."""

    def __init__(self, alias: str, argv: list[str], hub: PipeHub, env: dict[str, str], heard: Callable):
        self.alias, self.argv, self.hub, self.env, self.heard = alias, argv, hub, env, heard
        self.proc: subprocess.Popen | None = None
        self.sent = 0.0  # wall clock just before the client started: the agent's hello came after
        self.started_at = 0.0  # monotonic, likewise
        self.output: list[str] = []  # before the hello, SHELL_READY included (what _why reads)
        self.hello: dict = {}
        self.clock_bounds = (-math.inf, math.inf)  # where the host's clock offset lies, as its hello tells
        self.silent_for: float | None = None  # set when it did not say hello in time: since its start
        self.done = threading.Event()  # its stdout ended (the client exited)
        self._conn: AgentConnection | None = None
        self._early: list[str] = []  # lines after the hello that no connection took yet
        self._lock = threading.Lock()  # the connection, and the lines and end before it came
        self._stdin: int | None = None
        self._unsent = bytearray()  # what the full pipe to its stdin did not take yet
        self._write_lock = threading.Lock()

    @property
    def logged_in(self) -> bool:
        """Whether the host's login shell got as far as running the agent's command."""
        return SHELL_READY in self.output or bool(self.hello)

    def spawn(self) -> None:
        """Start the client (raises SshError when it cannot be started at all)."""
        self.sent, self.started_at = time.time(), time.monotonic()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,  # ssh's own errors and the remote shell's, as the agent's output
                start_new_session=True,
                env=self.env,
            )
        except OSError as exc:
            raise SshError(
                self.alias, "other", f"cannot start {self.argv[0]}: {exc.strerror}", "install openssh-client"
            ) from None
        self._stdin = self.proc.stdin.fileno()
        os.set_blocking(self._stdin, False)
        self.hub.add(self.proc.stdout.fileno(), self)

    # --- the hub's side

    def lines(self, lines: list[bytes]) -> None:
        """Lines from the client (the hub's thread)."""
        with self._lock:
            conn = self._conn
            if conn is None:
                for raw in lines:
                    self._before(raw.decode("utf-8", "replace"))
                return
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            if line != SHELL_READY:  # an agent started after the preflight: not its output
                conn.take(line)

    def _before(self, line: str) -> None:
        if self.hello:
            self._early.append(line)
            return
        hello = parse_hello(line)
        if hello is None:
            self.output.append(line)
            if line == SHELL_READY:
                self.heard(self)
            return
        self.hello = hello
        self.clock_bounds = clock_bounds(hello.get("now"), self.sent, time.time())
        self.heard(self)

    def ended(self) -> None:
        """The client's stdout ended (the hub's thread)."""
        with self._lock:
            conn = self._conn
            self.done.set()
        if conn is not None:
            conn.ended()
        else:
            self.heard(self)

    def flush(self) -> bool:
        """Write what waits for the client's stdin (the hub's thread); True once nothing does."""
        with self._write_lock:
            if self._stdin is None:
                return True
            try:
                del self._unsent[: os.write(self._stdin, self._unsent)]
            except BlockingIOError:
                return False
            except OSError:  # the client is gone: its output's end says so
                self._unsent.clear()
            return not self._unsent

    # --- the launcher's side

    def attach(self, conn: AgentConnection) -> None:
        """From now on the client's lines are ``conn``'s (with any that came after the hello)."""
        with self._lock:
            self._conn = conn
            for line in self._early:
                conn.take(line)
            self._early.clear()
            if self.done.is_set():  # it ended before: the connection hears of it now
                conn.ended()

    def write(self, data: bytes) -> None:
        """Send ``data`` to the agent, never blocking: the hub writes what the pipe does not take now."""
        with self._write_lock:
            if self._stdin is None:
                return
            if self._unsent:  # in order, after what waits
                self._unsent += data
                return
            try:
                data = data[os.write(self._stdin, data) :]
            except BlockingIOError:
                pass
            except OSError:  # the client is gone: its output's end says so
                return
            if data:
                self._unsent += data
                self.hub.flush_later(self._stdin, self)

    def close_stdin(self) -> None:
        """EOF for the agent: one still running stops its ranks by itself and ends."""
        with self._write_lock:
            self._stdin = None
            if self.proc is not None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()

    def finish(self, wait_s: float) -> None:
        """Close its stdin and wait ``wait_s`` at most for the client to end, then end it (our child: SIGKILL
        drops the connection, and the host's sshd ends the session)."""
        self.close_stdin()
        if self.proc is None:
            return
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.done.wait(1.0)  # the hub has read its last lines
        with contextlib.suppress(OSError):
            self.proc.stdout.close()

    def exit_status(self, timeout: float = 5.0) -> int:
        """The client's exit status (the agent command's, or 255 for ssh's own failure); -1 if still running."""
        if self.proc is None:
            return -1
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return -1


class ProcessAgent(AgentConnection):
    """An agent on a remote host behind its own OpenSSH client: the preflight's, or one started for a restart."""

    def __init__(
        self, node_rank: int, host: str, events, process: SshProcess, workdir: str, bounds: tuple[float, float]
    ):
        super().__init__(node_rank, host, events)
        self.process, self.workdir = process, workdir
        # measured by the preflight's agent on that host (its hello), narrowed by each attempt's "ready"
        self.clock_bounds, self.clock_offset = bounds, nearest_zero(*bounds)

    def start(self, payload: dict) -> None:
        if self.process.proc is None:  # a restart: a new client, whose hello and failures come as events
            self.process.attach(self)
            self.process.spawn()
        else:
            self.process.attach(self)
        # Remote ranks get a minimal environment plus the plan's, never this machine's whole environment.
        self.plan_sent = time.time()
        self.send({**payload, "workdir": payload.get("workdir") or self.workdir, "inherit_env": False})

    def send(self, message: dict) -> None:
        self.process.write(encode(message).encode("utf-8"))

    def close(self, wait_s: float | None = None) -> None:
        self.process.finish(CLOSE_WAIT_S if wait_s is None else wait_s)

"""How the doctor runs its scripts on a host: a child process here, or a command over the host's SSH
connection (``distlaunch.remote``). Both offer the same two things: run a command to completion, and
start a long-lived one whose output is read line by line and which ends when its stdin is closed.

Every start goes through the run's ``StartGate``: once the doctor stops (Ctrl-C, or the end), nothing new
starts, and the final sweep by the run's mark waits for the starts already under way."""

from __future__ import annotations

import contextlib
import os
import queue
import shlex
import signal
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import IO

import paramiko

from distlaunch.remote.command import CommandResult, finish_command, open_command, run_command, stop_marked_command
from distlaunch.remote.ssh import SshError


class LineStream:
    """A started command: its stdout as lines (read by a thread, so waits can time out) and its stdin."""

    def __init__(
        self,
        stdout: IO[bytes],
        end_input: Callable[[], None],
        release: Callable[[], None],
        send: Callable[[bytes], None] | None = None,
    ):
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._end_input = end_input
        self.send = send  # write to the command's stdin
        self._release = release
        self._ended = False
        threading.Thread(target=self._pump, args=(stdout,), daemon=True).start()

    def _pump(self, stdout: IO[bytes]) -> None:
        try:
            for raw in stdout:
                self._lines.put(raw.decode("utf-8", "replace").rstrip("\n"))
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            self._lines.put(None)  # end of output

    def readline(self, timeout: float) -> str | None:
        """The next line, or None at the end of output or after ``timeout`` seconds."""
        if self._ended:
            return None
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return None
        self._ended = line is None
        return line

    def finish(self, timeout: float) -> list[str]:
        """Close the command's stdin (its signal to stop) and return the lines it prints until it exits."""
        lines: list[str] = []
        try:
            self._end_input()
            deadline = time.monotonic() + timeout
            while (line := self.readline(max(deadline - time.monotonic(), 0.0))) is not None:
                lines.append(line)
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the command is gone already; what it printed before is all there is
        finally:
            self._release()
        return lines


MARK = "DISTLAUNCH_DOCTOR_RUN"  # in the environment of every process the doctor starts: its run's nonce


class StartGate:
    """Whether commands may still start in this doctor run. ``close`` refuses every later start and waits
    for the ones under way, so a sweep after it sees every process the run will ever start."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed = False
        self._starting = 0

    @contextlib.contextmanager
    def starting(self, host: str) -> Iterator[None]:
        """Around one start (until the process exists on the host); SshError once the gate is closed."""
        with self._cond:
            if self._closed:
                raise SshError(host, "other", "not started: the doctor is stopping", "")
            self._starting += 1
        try:
            yield
        finally:
            with self._cond:
                self._starting -= 1
                self._cond.notify_all()

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def close(self, timeout: float) -> bool:
        """Refuse new starts; wait up to ``timeout`` for those under way. True when none is left."""
        with self._cond:
            self._closed = True
            return self._cond.wait_for(lambda: self._starting == 0, timeout)


class HostSession(ABC):
    """A host the doctor can run commands on; every command carries the run's mark (``MARK``) and starts
    only while the run's gate is open."""

    name: str
    nonce: str
    gate: StartGate
    through_login_shell = False  # commands start in the user's login shell (its startup files run first)

    @abstractmethod
    def run(self, argv: list[str], timeout: float, stdin: str | None = None) -> CommandResult:
        """Run ``argv`` to completion."""

    @abstractmethod
    def start(self, argv: list[str]) -> LineStream:
        """Start ``argv`` and return its output stream."""

    @abstractmethod
    def stop_all(self, timeout: float) -> None:
        """Kill every process this doctor run started on the host (a hung probe, the listener)."""

    def close(self) -> None:  # noqa: B027 (a session without a connection has nothing to release)
        """Release the connection."""


class LocalSession(HostSession):
    """This machine: commands are child processes."""

    def __init__(self, name: str, nonce: str, gate: StartGate | None = None):
        self.name = name
        self.nonce = nonce
        self.gate = gate or StartGate()
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()

    def _popen(self, argv: list[str], stdout, stderr) -> subprocess.Popen:
        # its own process group, so a hung interpreter's children go with it
        env = {**os.environ, MARK: self.nonce}
        with self.gate.starting(self.name):  # Popen returns once the program runs, marked from its first moment
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr, env=env, start_new_session=True
            )
            with self._lock:
                self._procs.append(proc)
        return proc

    def run(self, argv: list[str], timeout: float, stdin: str | None = None) -> CommandResult:
        try:
            proc = self._popen(argv, subprocess.PIPE, subprocess.PIPE)
        except FileNotFoundError as exc:
            return CommandResult(rc=127, stdout="", stderr=f"{argv[0]}: {exc.strerror}")
        try:
            out, err = proc.communicate((stdin or "").encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            raise SshError(
                self.name, "timeout", f"{shlex.join(argv[:1])} did not finish within {timeout:g}s", ""
            ) from None
        return CommandResult(
            rc=proc.returncode, stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace")
        )

    def start(self, argv: list[str]) -> LineStream:
        proc = self._popen(argv, subprocess.PIPE, subprocess.DEVNULL)

        def send(data: bytes) -> None:
            proc.stdin.write(data)
            proc.stdin.flush()

        return LineStream(proc.stdout, proc.stdin.close, lambda: _reap(proc), send)

    def stop_all(self, timeout: float) -> None:
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            _kill_group(proc)
        # and by the mark, as on a remote host: a child that left its process group (setsid) goes too
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                ["sh", "-c", stop_marked_command(MARK, self.nonce)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout,
            )


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # our own child's group (start_new_session), by its Popen handle
    proc.wait()


def _reap(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        _kill_group(proc)


class SshSession(HostSession):
    """A remote host over an open SSH connection."""

    through_login_shell = True

    def __init__(self, name: str, client: paramiko.SSHClient, nonce: str, gate: StartGate | None = None):
        self.name = name
        self.client = client
        self.nonce = nonce
        self.gate = gate or StartGate()

    def _marked(self, argv: list[str]) -> list[str]:
        return ["env", f"{MARK}={self.nonce}", *argv]

    def _exec(self, argv: list[str], timeout: float | None) -> paramiko.Channel:
        """A channel whose command runs on the host, started inside the gate (none starts once it closed)."""
        with self.gate.starting(self.name):
            return open_command(self.client, self.name, shlex.join(self._marked(argv)), timeout)

    def run(self, argv: list[str], timeout: float, stdin: str | None = None) -> CommandResult:
        """As ``distlaunch.remote.command.run_command``, with the start inside the gate."""
        deadline = time.monotonic() + timeout
        return finish_command(self._exec(argv, timeout), self.name, shlex.join(argv), deadline, stdin)

    def start(self, argv: list[str]) -> LineStream:
        channel = self._exec(argv, None)
        return LineStream(channel.makefile("rb"), channel.shutdown_write, channel.close, channel.sendall)

    def stop_all(self, timeout: float) -> None:
        with contextlib.suppress(SshError):  # the connection is gone: sshd hangs up its commands' sessions itself
            run_command(self.client, ["sh", "-c", stop_marked_command(MARK, self.nonce)], timeout=timeout)

    def close(self) -> None:
        self.client.close()

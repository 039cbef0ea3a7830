"""How the doctor runs its scripts on a host: a child process here, or a command over the host's SSH
connection (``distlaunch.remote``). Both offer the same two things: run a command to completion, and
start a long-lived one whose output is read line by line and which ends when its stdin is closed."""

from __future__ import annotations

import queue
import shlex
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from typing import IO, Callable

import paramiko

from distlaunch.remote.command import CommandResult, run_command


class LineStream:
    """A started command: its stdout as lines (read by a thread, so waits can time out) and its stdin."""

    def __init__(self, stdout: IO[bytes], end_input: Callable[[], None], release: Callable[[], None]):
        self._lines: "queue.Queue[str | None]" = queue.Queue()
        self._end_input = end_input
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


class HostSession(ABC):
    """A host the doctor can run commands on."""

    name: str

    @abstractmethod
    def run(self, argv: list[str], timeout: float, stdin: str | None = None) -> CommandResult:
        """Run ``argv`` to completion."""

    @abstractmethod
    def start(self, argv: list[str]) -> LineStream:
        """Start ``argv`` and return its output stream."""

    def close(self) -> None:
        """Release the connection."""


class LocalSession(HostSession):
    """This machine: commands are child processes."""

    def __init__(self, name: str):
        self.name = name

    def run(self, argv: list[str], timeout: float, stdin: str | None = None) -> CommandResult:
        try:
            done = subprocess.run(argv, input=stdin or "", capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError as exc:
            return CommandResult(rc=127, stdout="", stderr=f"{argv[0]}: {exc.strerror}")
        return CommandResult(rc=done.returncode, stdout=done.stdout, stderr=done.stderr)

    def start(self, argv: list[str]) -> LineStream:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        return LineStream(proc.stdout, proc.stdin.close, lambda: _reap(proc))


def _reap(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()  # our own child, by its Popen handle
        proc.wait()


class SshSession(HostSession):
    """A remote host over an open SSH connection."""

    def __init__(self, name: str, client: paramiko.SSHClient):
        self.name = name
        self.client = client

    def run(self, argv: list[str], timeout: float, stdin: str | None = None) -> CommandResult:
        return run_command(self.client, argv, timeout=timeout, stdin=stdin)

    def start(self, argv: list[str]) -> LineStream:
        channel = self.client.get_transport().open_session()
        channel.exec_command(shlex.join(argv))
        return LineStream(channel.makefile("rb"), channel.shutdown_write, channel.close)

    def close(self) -> None:
        self.client.close()

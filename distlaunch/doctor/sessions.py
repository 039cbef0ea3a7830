"""How the doctor runs its scripts on a host: a child process here, or a command over the host's SSH
connection (``distlaunch.remote``). Both offer the same two things: run a command to completion, and
start a long-lived one whose output is read line by line and which ends when its stdin is closed."""

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
from collections.abc import Callable
from typing import IO

import paramiko

from distlaunch.remote.command import CommandResult, run_command
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


def stop_marked_command(nonce: str) -> str:
    """The shell command that kills every process on a host whose environment carries this run's mark
    (probes and the listener, with whatever children a hung interpreter started); the killer itself is
    not marked. One grep over /proc, no process per candidate."""
    mark = shlex.quote(f"{MARK}={nonce}")
    return (
        f"grep -lsxzF {mark} /proc/[0-9]*/environ | sed -e 's#^/proc/##' -e 's#/environ$##' "
        "| xargs -r kill -KILL 2>/dev/null; true"
    )


class HostSession(ABC):
    """A host the doctor can run commands on; every command carries the run's mark (``MARK``)."""

    name: str
    nonce: str

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

    def __init__(self, name: str, nonce: str):
        self.name = name
        self.nonce = nonce
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()

    def _popen(self, argv: list[str], stdout, stderr) -> subprocess.Popen:
        # its own process group, so a hung interpreter's children go with it
        env = {**os.environ, MARK: self.nonce}
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

    def __init__(self, name: str, client: paramiko.SSHClient, nonce: str):
        self.name = name
        self.client = client
        self.nonce = nonce

    def _marked(self, argv: list[str]) -> list[str]:
        return ["env", f"{MARK}={self.nonce}", *argv]

    def run(self, argv: list[str], timeout: float, stdin: str | None = None) -> CommandResult:
        return run_command(self.client, self._marked(argv), timeout=timeout, stdin=stdin)

    def start(self, argv: list[str]) -> LineStream:
        channel = self.client.get_transport().open_session()
        channel.exec_command(shlex.join(self._marked(argv)))
        return LineStream(channel.makefile("rb"), channel.shutdown_write, channel.close, channel.sendall)

    def stop_all(self, timeout: float) -> None:
        with contextlib.suppress(SshError):  # the connection is gone: sshd hangs up its commands' sessions itself
            run_command(self.client, ["sh", "-c", stop_marked_command(self.nonce)], timeout=timeout)

    def close(self) -> None:
        self.client.close()

"""Run one command on a connected host and collect its exit code and output (used by preflight and doctor)."""

from __future__ import annotations

import contextlib
import shlex
import threading
import time

import paramiko
from pydantic import BaseModel

from distlaunch.remote.ssh import SshError

READ_CHUNK = 65536
# sshd runs every command through the user's login shell, which first sources its startup files. A line the
# shell prints just before the command tells a hung startup file (a ~/.bashrc waiting on a network mount, a
# `module load` on a license server) from a command that hangs itself.
SHELL_READY = "distlaunch-login-shell-ready"
SHELL_FILES = "~/.bashrc, ~/.bash_profile, ~/.profile, /etc/bash.bashrc"


class CommandResult(BaseModel):
    """How a remote command ended."""

    rc: int
    stdout: str
    stderr: str


def after_login_shell(command: str) -> str:
    """``command`` as sent to sshd: preceded by the ``SHELL_READY`` line, printed once the shell's startup
    files have run (``echo`` and ``;`` mean the same in sh, bash, zsh, fish and csh)."""
    return f"echo {SHELL_READY}; {command}"


def without_shell_ready(lines: list[str]) -> tuple[list[str], bool]:
    """``lines`` without the ``SHELL_READY`` line, and whether the login shell got as far as printing it."""
    kept = [line for line in lines if line != SHELL_READY]
    return kept, len(kept) < len(lines)


SWEEP_ROUNDS = 20  # the most rounds one sweep makes on a host
SWEEP_PAUSE_S = 0.05  # between two rounds


def stop_marked_command(var: str, nonce: str) -> str:
    """The shell command that kills every process on a host that carries the mark ``var=nonce``: in its
    environment (a doctor's probes, a job's agent, with whatever children a hung interpreter started), or in its
    command line (the login shell that is about to run one, e.g. a slow ~/.bashrc). The nonce is the run's own
    (a doctor run's, a job id), so only processes this run started can match: never any other by name. It sweeps
    in rounds until two in a row find nothing, so a process that appears while it kills (a fork, a start still
    on its way) goes too. The pattern is written ``VA[R]=nonce``: it matches the mark but not itself, so the
    killer (whose command line holds the pattern) is never marked. One grep per round over /proc."""
    mark = f"{var[:-1]}[{var[-1]}]={nonce}"
    word = shlex.quote(f"(^|[^A-Za-z0-9_]){mark}([^A-Za-z0-9_]|$)")  # in a command line: the whole word only
    find = (
        f"{{ grep -lsxzE -e {shlex.quote(mark)} /proc/[0-9]*/environ; grep -lszE -e {word} /proc/[0-9]*/cmdline; }}"
        " | sed -n 's#^/proc/\\([0-9]*\\)/.*#\\1#p' | sort -u"
    )
    return (
        f"quiet=0; n=0; while [ $quiet -lt 2 ] && [ $n -lt {SWEEP_ROUNDS} ]; do pids=$({find}); "
        'if [ -n "$pids" ]; then kill -KILL $pids 2>/dev/null; quiet=0; else quiet=$((quiet+1)); fi; '
        f"n=$((n+1)); sleep {SWEEP_PAUSE_S}; done; true"
    )


def shell_hang(host: str, what: str, timeout: float) -> tuple[str, str]:
    """Detail and hint for a login shell that never got to run ``what`` within ``timeout`` seconds."""
    return (
        f"the login shell did not get to run {what} within {timeout:g}s: a shell startup file hangs ({SHELL_FILES})",
        f"run 'ssh {host} true': if that hangs too, make the startup files return at once for non-interactive "
        "shells ('[ -z \"$PS1\" ] && return' before module, conda or network-mount commands)",
    )


def host_name(client: paramiko.SSHClient) -> str:
    """The alias of a distlaunch SshClient, else the peer address."""
    alias = getattr(client, "alias", None)
    if alias:
        return alias
    transport = client.get_transport()
    return str(transport.getpeername()[0]) if transport and transport.sock else "?"


def _drain(read, chunks: list[bytes]) -> None:
    while True:
        data = read(READ_CHUNK)
        if not data:
            return
        chunks.append(data)


def _drain_quietly(read, chunks: list[bytes]) -> None:
    """``_drain`` for a reader thread: a timeout or a closed channel ends it (the caller reports the timeout)."""
    with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
        _drain(read, chunks)


def run_command(
    client: paramiko.SSHClient, argv: list[str], timeout: float = 30.0, stdin: str | bytes | None = None
) -> CommandResult:
    """Run ``argv`` on the host (every word shlex-quoted, so the remote shell interprets nothing)."""
    command, host = shlex.join(argv), host_name(client)
    deadline = time.monotonic() + timeout
    return finish_command(open_command(client, host, command, timeout), host, command, deadline, stdin)


def open_command(client: paramiko.SSHClient, host: str, command: str, timeout: float | None) -> paramiko.Channel:
    """A channel whose ``command`` (a shell line) runs on the host: exec_command returns once sshd started it."""
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise SshError(host, "other", f"the SSH connection is closed; cannot run {command!r}", "connect again")
    try:
        channel = transport.open_session(timeout=timeout)
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise SshError(
            host,
            "other",
            f"cannot open an SSH session to run {command!r}: {exc}",
            "check MaxSessions in the host's sshd_config",
        ) from None
    try:
        channel.settimeout(timeout)
        channel.exec_command(after_login_shell(command))
    except (paramiko.SSHException, OSError, EOFError) as exc:
        channel.close()
        raise SshError(
            host, "other", f"cannot run {command!r}: {exc}", "check the SSH connection (ssh -v HOST)"
        ) from None
    return channel


def finish_command(
    channel: paramiko.Channel, host: str, command: str, deadline: float, stdin: str | bytes | None = None
) -> CommandResult:
    """Feed a started command ``stdin``, read its output to the end and its exit code, by the (monotonic)
    ``deadline``; the channel is closed whatever happens. A command whose login shell hangs (it never printed
    ``SHELL_READY``) is an SshError of kind ``shell``, one that hangs itself of kind ``timeout``."""
    timeout = max(deadline - time.monotonic(), 0.001)
    out: list[bytes] = []
    err: list[bytes] = []
    try:
        channel.settimeout(timeout)
        if stdin:
            channel.sendall(stdin.encode("utf-8") if isinstance(stdin, str) else stdin)
        channel.shutdown_write()
        # stderr in a thread: a command that fills one pipe while we wait on the other must not stall
        err_reader = threading.Thread(target=_drain_quietly, args=(channel.recv_stderr, err), daemon=True)
        err_reader.start()
        _drain(channel.recv, out)
        err_reader.join(max(deadline - time.monotonic(), 0.001))
        if err_reader.is_alive() or not channel.status_event.wait(max(deadline - time.monotonic(), 0.001)):
            raise TimeoutError()
        rc = channel.recv_exit_status()
    except TimeoutError:
        if not without_shell_ready(b"".join(out).decode("utf-8", "replace").splitlines())[1]:
            raise SshError(host, "shell", *shell_hang(host, repr(command), timeout)) from None
        raise SshError(
            host,
            "timeout",
            f"{command!r} did not finish within {timeout:g}s",
            "check that the host is not overloaded, or give the command more time",
        ) from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise SshError(
            host, "other", f"running {command!r} failed: {exc}", "check the SSH connection (ssh -v HOST)"
        ) from None
    finally:
        channel.close()
    stdout = b"".join(out).decode("utf-8", "replace")
    return CommandResult(
        rc=rc, stdout=stdout.replace(SHELL_READY + "\n", "", 1), stderr=b"".join(err).decode("utf-8", "replace")
    )

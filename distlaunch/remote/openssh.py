"""The OpenSSH client (``ssh``) as the launch's transport: its command line for one host, and what its failure
means in the same words as a paramiko connection's (``SshError``, distlaunch/remote/ssh.py).

Why a process per host rather than paramiko in the launcher: the key exchange, the ciphers and the keepalives
then run in C, in processes the kernel spreads over the machine's cores, and the launcher reads every host
from one thread (distlaunch/remote/pipes.py). docs/benchmarks.md ("Launching on many hosts") has the numbers.

Host keys are checked by ``ssh`` against the known_hosts files distlaunch resolved for the host (the same files
the paramiko path reads), strictly: an unknown key is refused unless new keys are accepted, a changed key
always is. A failure is put in words by trying the host once more with paramiko, which names the fingerprints,
keys and fixes (``diagnose``); only a timeout is taken from ssh's own words, so it is not waited for twice.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
from collections.abc import Mapping

from distlaunch.errors import UsageError
from distlaunch.remote.ssh import (
    CONNECT_TIMEOUT_S,
    SshError,
    connect_all,
    handshake_timeout_error,
    socket_timeout_error,
)
from distlaunch.remote.sshconfig import SshTarget

TRANSPORT_VAR = "DISTLAUNCH_SSH_TRANSPORT"  # openssh (the default where ssh is installed) or paramiko
TRANSPORTS = ("openssh", "paramiko")
KEEPALIVE_S = 30  # as the paramiko path: keeps firewalls and NAT from dropping an idle job's connection
# ssh would end the connection after this many unanswered keepalives. Whether a host is gone is the heartbeat's
# call (--heartbeat-timeout, which may be 0: never), so ssh never makes it: a month of them.
KEEPALIVE_COUNT = 86400
# ssh's words for failures that no retry mends (the rest: refused, reset, timed out, closed, may pass)
FINAL_WORDS = ("Could not resolve hostname", "Permission denied", "Host key verification failed")


def transport() -> str:
    """The transport of remote hosts: $DISTLAUNCH_SSH_TRANSPORT, else OpenSSH's client where there is one."""
    chosen = os.environ.get(TRANSPORT_VAR, "").strip().lower()
    if chosen and chosen not in TRANSPORTS:
        raise UsageError(f"{TRANSPORT_VAR}={chosen!r} is not a transport", f"set it to {' or '.join(TRANSPORTS)}")
    return chosen or ("openssh" if ssh_program() else "paramiko")


def ssh_program() -> str | None:
    return _which("ssh", os.environ.get("PATH"))


def parent_death_prefix() -> list[str]:
    """``setpriv --pdeathsig TERM`` before ssh where util-linux has it: a launcher killed outright takes its ssh
    clients with it even when a host no longer answers (one that does sees their stdin close and ends anyway)."""
    setpriv = _which("setpriv", os.environ.get("PATH"))
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


@functools.lru_cache(maxsize=8)
def _which(program: str, path: str | None) -> str | None:
    """``shutil.which``, once per PATH: every host's command line names the same programs."""
    return shutil.which(program, path=path)


def ssh_command(
    target: SshTarget,
    remote_command: str,
    *,
    config: str | None,
    timeout: float | None = None,
    accept_new_host_keys: bool = False,
) -> list[str]:
    """The argv that runs ``remote_command`` (one shell line) on ``target`` with OpenSSH's client, no pty, never
    asking anything. ``config``: the ssh_config given with --ssh-config (else ssh reads its own, as ``ssh host``
    does). Where to connect, as whom and which known_hosts files vouch for the host are the ones distlaunch
    resolved (the plan's addresses, the paramiko path's files), so both transports reach and trust the same."""
    seconds = timeout or target.connect_timeout or CONNECT_TIMEOUT_S
    accept_new = accept_new_host_keys or target.strict_host_key_checking != "yes"
    options = {
        "BatchMode": "yes",  # no password, passphrase or host-key prompt: nobody is there to answer
        # "accept-new" records an unknown key; a changed key is refused all the same ("no" would connect)
        "StrictHostKeyChecking": "accept-new" if accept_new else "yes",
        "UserKnownHostsFile": _files(target.known_hosts_files),
        "GlobalKnownHostsFile": _files(target.global_known_hosts_files),
        "UpdateHostKeys": "no",  # known_hosts changes only when a new key is accepted, as on the paramiko path
        "CheckHostIP": "no",
        "HostName": target.hostname,
        "Port": str(target.port),
        "User": target.user,
        "ConnectTimeout": str(max(1, math.ceil(seconds))),  # TCP connect, then the server's banner
        "ServerAliveInterval": str(KEEPALIVE_S),
        "ServerAliveCountMax": str(KEEPALIVE_COUNT),
        # One process per job and host, nothing that outlives it: no shared master, no forwarded ports or agent.
        "ControlMaster": "no",
        "ControlPath": "none",
        "ClearAllForwardings": "yes",
        "ForwardAgent": "no",
        "ForwardX11": "no",
        "PermitLocalCommand": "no",
        "LogLevel": "ERROR",  # errors still say why; "Permanently added ..." notes do not reach the output
    }
    argv = [*parent_death_prefix(), ssh_program() or "ssh", "-T", "-e", "none"]
    if config:
        argv += ["-F", config]
    for name, value in options.items():
        argv += ["-o", f"{name}={value}"]
    return [*argv, "--", target.alias, remote_command]


def _files(paths: list[str]) -> str:
    """A list of files as one ssh_config value (``none`` for no file; a path with blanks in double quotes)."""
    return " ".join(f'"{p}"' if len(p.split()) != 1 else p for p in paths) or "none"


def is_final(output: list[str]) -> bool:
    """Whether ssh's words say that trying again cannot help (a name, a key, a host key)."""
    return any(words in line for line in output for words in FINAL_WORDS)


def diagnose(
    failed: Mapping[str, tuple[SshTarget, list[str]]], timeout: float | None, accept_new_host_keys: bool
) -> dict[str, SshError]:
    """The SshError of every host whose ssh failed before it logged in (``failed``: alias -> (target, what ssh
    said)), in today's words: a timeout from ssh's own, the rest from one more try with paramiko (in parallel,
    no retries). A host that paramiko reaches after all gets ssh's last words."""
    errors: dict[str, SshError] = {}
    again: dict[str, SshTarget] = {}
    for alias, (target, output) in failed.items():
        seconds = timeout or target.connect_timeout or CONNECT_TIMEOUT_S
        text = "\n".join(output)
        if "timed out during banner exchange" in text:
            errors[alias] = handshake_timeout_error(target, seconds)
        elif "Connection timed out" in text or "Operation timed out" in text:
            errors[alias] = socket_timeout_error(target, seconds)
        else:
            again[alias] = target
    for alias, result in connect_all(
        again, timeout=timeout, accept_new_host_keys=accept_new_host_keys, retries=0
    ).items():
        if isinstance(result, SshError):
            errors[alias] = result
            continue
        result.close()
        said = next((line for line in reversed(failed[alias][1]) if line.strip()), "no words")
        errors[alias] = SshError(alias, "other", f"ssh failed: {said}", f"run 'ssh -v {alias} true' to see why")
    return {alias: errors[alias] for alias in failed}

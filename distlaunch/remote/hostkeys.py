"""Host key verification against known_hosts, as OpenSSH does it: unknown keys are refused (with the
exact ``ssh-keyscan`` line that fixes it) unless new keys are accepted; changed keys are always refused."""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import threading

import paramiko

from distlaunch.remote.sshconfig import SshTarget

_append_lock = threading.Lock()  # many hosts may accept a new key at once; one line each, never interleaved


class UnknownHostKey(Exception):
    """The server's key is in no known_hosts file (raised inside paramiko's handshake)."""

    def __init__(self, key: paramiko.PKey):
        super().__init__(f"unknown host key {fingerprint(key)}")
        self.key = key


def fingerprint(key: paramiko.PKey) -> str:
    """The key type and its SHA256 fingerprint, as ``ssh-keygen -l`` prints it."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


def load_known_hosts(client: paramiko.SSHClient, target: SshTarget) -> None:
    """Load the target's known_hosts files into the client (missing files are simply empty)."""
    for path in target.global_known_hosts_files:
        if os.path.isfile(path):
            client.load_system_host_keys(path)
    for path in target.known_hosts_files:
        if os.path.isfile(path):
            client.get_host_keys().load(path)


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """What to do with a key that no known_hosts file lists: refuse, or accept and record it."""

    def __init__(self, target: SshTarget, accept_new: bool):
        self.target = target
        self.accept_new = accept_new or target.strict_host_key_checking in ("accept-new", "no")

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if not self.accept_new:
            raise UnknownHostKey(key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.target.known_hosts_files:
            _append(self.target.known_hosts_files[0], f"{hostname} {key.get_name()} {key.get_base64()}\n")


def _append(path: str, line: str) -> None:
    with _append_lock:
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)


def keyscan_fix(target: SshTarget) -> str:
    """The command that adds the target's current host key to its known_hosts file."""
    file = target.known_hosts_files[0] if target.known_hosts_files else "~/.ssh/known_hosts"
    port = f"-p {target.port} " if target.port != 22 else ""
    return f"ssh-keyscan {port}-H {shlex.quote(target.host_key_alias or target.hostname)} >> {shlex.quote(file)}"


def remove_fix(target: SshTarget) -> str:
    """The command that removes the target's recorded (now wrong) host key."""
    file = target.known_hosts_files[0] if target.known_hosts_files else "~/.ssh/known_hosts"
    return f"ssh-keygen -R {shlex.quote(target.known_hosts_name)} -f {shlex.quote(file)}"

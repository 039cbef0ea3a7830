"""SSH connections with paramiko: one host (``connect``) or many in parallel (``connect_all``), with
explicit timeouts, bounded retries with jitter for transient errors, and every low-level failure
translated into an ``SshError`` that names the host, says what happened and gives the exact fix."""

from __future__ import annotations

import errno
import queue
import random
import socket
import threading
import time
from collections.abc import Mapping

import paramiko

from distlaunch.errors import HostError
from distlaunch.remote import sshlog
from distlaunch.remote.hostkeys import (
    HostKeyPolicy,
    UnknownHostKey,
    fingerprint,
    keyscan_fix,
    load_known_hosts,
    remove_fix,
)
from distlaunch.remote.sshconfig import SshTarget

CONNECT_TIMEOUT_S = 10.0
RETRIES = 2  # extra tries for transient errors: 3 in all
RETRY_BASE_S = 0.25  # back-off before retry i is RETRY_BASE_S * 2**i, scaled by a random 0.5-1.5 (jitter)
MAX_PARALLEL = 32  # concurrent handshakes; more only queues on the CPU (key exchange is CPU bound)
KEEPALIVE_S = 30  # a training job's connection idles for hours: keep firewalls/NAT from dropping it

# shell: connected, but the login shell hangs in its startup files before it runs a command
KINDS = ("dns", "refused", "timeout", "auth", "hostkey-unknown", "hostkey-changed", "shell", "other")
TRANSIENT = ("refused", "timeout", "other")  # may pass on a retry; dns, auth and host keys never do
_CHECK_IDS = {"dns": "dns", "auth": "ssh.auth", "hostkey-unknown": "ssh.hostkey", "hostkey-changed": "ssh.hostkey"}


class SshError(HostError):
    """An SSH failure on one host: ``kind`` (one of KINDS), ``host``, ``detail`` and the fix in ``hint``."""

    def __init__(self, host: str, kind: str, detail: str, hint: str):
        super().__init__(f"{host}: {detail}", hint)
        self.host, self.kind, self.detail = host, kind, detail

    @property
    def check_id(self) -> str:
        """The doctor check this failure belongs to: ``dns``, ``ssh.connect``, ``ssh.auth`` or ``ssh.hostkey``."""
        return _CHECK_IDS.get(self.kind, "ssh.connect")

    @property
    def transient(self) -> bool:
        """True when trying again may help."""
        return self.kind in TRANSIENT


class HostsFailed(HostError):
    """Several hosts failed: one line per host, each with its own fix (exit 3)."""

    def __init__(self, errors: list[HostError], what: str = "could not be reached"):
        self.errors = errors
        if len(errors) == 1:
            super().__init__(errors[0].message, errors[0].hint)
            return
        lines = [f"{len(errors)} hosts {what}:"] + [f"  {e}" for e in errors]
        super().__init__("\n".join(lines))


class SshClient(paramiko.SSHClient):
    """A paramiko client that knows its host's alias and closes the ProxyJump hops it rides on."""

    def __init__(self, alias: str):
        super().__init__()
        self.alias = alias
        self.hops: list[paramiko.SSHClient] = []
        self.set_log_channel(sshlog.channel(alias))

    def close(self) -> None:
        try:
            super().close()
        finally:
            for hop in reversed(self.hops):
                hop.close()


def _socket_error(target: SshTarget, exc: OSError, timeout: float) -> SshError:
    host, where = target.alias, target.endpoint
    if isinstance(exc, socket.gaierror):
        return SshError(
            host,
            "dns",
            f"cannot resolve host name {target.hostname!r} ({exc.strerror})",
            f"check the name in the hostfile, give {host} a HostName in ssh_config, or add it to DNS or /etc/hosts",
        )
    if isinstance(exc, ConnectionRefusedError):
        return SshError(
            host,
            "refused",
            f"connection refused by {where}",
            f"check that sshd runs on {host} and listens on port {target.port} (the Port in ssh_config)",
        )
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return SshError(
            host,
            "timeout",
            f"no answer from {where} within {timeout:g}s",
            f"check that {host} is up and no firewall drops port {target.port}; or raise ConnectTimeout in ssh_config",
        )
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return SshError(
            host, "other", f"no route to {where} ({exc.strerror})", f"check that {host} is up and on this network"
        )
    return SshError(host, "other", f"cannot connect to {where}: {exc}", f"try 'ssh -v {host}' to see what fails")


def _open_socket(target: SshTarget, via: paramiko.SSHClient | None, timeout: float):
    """A byte stream to the target's sshd: direct TCP, through the previous ProxyJump hop, or a ProxyCommand."""
    if via is not None:
        try:
            return via.get_transport().open_channel(
                "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=timeout
            )
        except paramiko.ChannelException as exc:
            text = exc.text.lower()
            kind = "refused" if "refused" in text else "dns" if "resolve" in text or "name" in text else "other"
            raise SshError(
                target.alias,
                kind,
                f"jump host cannot open {target.endpoint}: {exc.text}",
                f"check that {target.hostname} is reachable from the jump host",
            ) from None
    if target.proxy_command:
        return paramiko.ProxyCommand(target.proxy_command)
    try:
        socket.getaddrinfo(target.hostname, target.port, type=socket.SOCK_STREAM)
        return socket.create_connection((target.hostname, target.port), timeout=timeout)
    except OSError as exc:
        raise _socket_error(target, exc, timeout) from None


def _auth_error(target: SshTarget, exc: paramiko.AuthenticationException) -> SshError:
    keys = ", ".join(target.identity_files) or "none"
    agent = "no" if target.identities_only else "yes"
    detail = f"authentication failed as user {target.user!r} (keys tried: {keys}; ssh-agent keys: {agent})"
    if isinstance(exc, paramiko.PasswordRequiredException):
        return SshError(
            target.alias,
            "auth",
            f"{detail}: a key needs its passphrase",
            "load the key into ssh-agent (ssh-add KEY) and drop IdentitiesOnly, so no passphrase is asked",
        )
    if not target.identity_files:
        return SshError(
            target.alias,
            "auth",
            detail,
            f"create a key (ssh-keygen -t ed25519), install it with ssh-copy-id -p {target.port} {target.user}@{target.hostname}, "
            f"or set IdentityFile for {target.alias} in ssh_config",
        )
    return SshError(
        target.alias,
        "auth",
        detail,
        f"install the key: ssh-copy-id -i {target.identity_files[0]}.pub -p {target.port} {target.user}@{target.hostname}; "
        f"or set User/IdentityFile for {target.alias} in ssh_config",
    )


def _caused_by(exc: BaseException | None, types: tuple[type, ...]) -> bool:
    """True if ``exc`` or an exception it was raised from is one of ``types`` (paramiko re-raises as SSHException)."""
    while exc is not None:
        if isinstance(exc, types):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _handshake_error(target: SshTarget, exc: Exception, timeout: float) -> SshError:
    host = target.alias
    if isinstance(exc, UnknownHostKey):
        files = ", ".join(target.known_hosts_files) or "none"
        return SshError(
            host,
            "hostkey-unknown",
            f"host key of {target.endpoint} ({fingerprint(exc.key)}) is not in known_hosts ({files})",
            f"check the fingerprint, then run: {keyscan_fix(target)}; or pass --accept-new-host-keys",
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        return SshError(
            host,
            "hostkey-changed",
            f"host key of {target.endpoint} CHANGED: known_hosts has {fingerprint(exc.expected_key)}, "
            f"the server offers {fingerprint(exc.key)} (host reinstalled, or someone in the middle)",
            f"if the change is expected, run: {remove_fix(target)} && {keyscan_fix(target)}",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return _auth_error(target, exc)
    if _caused_by(exc, (socket.timeout, TimeoutError)) and target.proxy_command:
        return SshError(
            host,
            "timeout",
            f"no SSH handshake came through ProxyCommand {target.proxy_command!r} within {timeout:g}s",
            f"run the ProxyCommand by hand to see where it waits, or check it in {target.config_file or 'ssh_config'}",
        )
    if _caused_by(exc, (socket.timeout, TimeoutError)):
        return SshError(
            host,
            "timeout",
            f"{target.endpoint} accepted the connection but did not finish the SSH handshake within {timeout:g}s",
            f"check that port {target.port} on {host} is sshd (not another service) and that it is not overloaded",
        )
    if isinstance(exc, OSError):
        return _socket_error(target, exc, timeout)
    said = str(exc).strip()
    if not said or "No existing session" in said:  # paramiko's words for a server that stopped mid-handshake
        return SshError(
            host,
            "other",
            f"{target.endpoint} began the SSH handshake, then stopped answering or hung up"
            f"{f' (SSH library: {said})' if said else ''}",
            f"check sshd on {host} (its log; MaxStartups when many connect at once), or run 'ssh -v {host}'",
        )
    return SshError(
        host,
        "other",
        f"SSH handshake with {target.endpoint} failed (SSH library: {said})",
        f"try 'ssh -v {host}' to see what fails",
    )


def socket_timeout_error(target: SshTarget, timeout: float) -> SshError:
    """The error of a host whose TCP connection got no answer within ``timeout`` (OpenSSH's client said so)."""
    return _socket_error(target, TimeoutError(), timeout)


def handshake_timeout_error(target: SshTarget, timeout: float) -> SshError:
    """The error of a host that took the connection but sent no SSH banner within ``timeout``."""
    return _handshake_error(target, TimeoutError(), timeout)


def _handshake(target: SshTarget, sock, timeout: float, accept_new_host_keys: bool) -> SshClient:
    client = SshClient(target.alias)
    try:
        load_known_hosts(client, target)
        client.set_missing_host_key_policy(HostKeyPolicy(target, accept_new_host_keys))
        client.connect(
            target.host_key_alias or target.hostname,
            port=target.port,
            username=target.user,
            sock=sock,
            key_filename=target.identity_files or None,
            allow_agent=not target.identities_only,
            look_for_keys=False,
            banner_timeout=timeout,
            auth_timeout=timeout,
            channel_timeout=timeout,
            # key exchange gets twice the banner's time, so a silent server surfaces as a banner timeout
            timeout=2 * timeout,
        )
        return client
    except Exception as exc:
        client.close()
        sock.close()
        raise _handshake_error(target, exc, timeout) from None


def connect(target: SshTarget, *, timeout: float | None = None, accept_new_host_keys: bool = False) -> SshClient:
    """Open an authenticated SSH connection (through any ProxyJump hops); raise SshError on failure."""
    timeout = timeout or target.connect_timeout or CONNECT_TIMEOUT_S
    via: SshClient | None = None
    hops: list[SshClient] = []
    try:
        for hop in [*target.jumps, target]:
            try:
                via = _handshake(hop, _open_socket(hop, via, timeout), timeout, accept_new_host_keys)
            except SshError as exc:
                if hop is target:
                    raise
                raise SshError(target.alias, exc.kind, f"via ProxyJump {hop.alias}: {exc.detail}", exc.hint) from None
            hops.append(via)
    except BaseException:
        for client in reversed(hops):
            client.close()
        raise
    via.hops = hops[:-1]
    via.get_transport().set_keepalive(KEEPALIVE_S)
    return via


def connect_with_retries(
    target: SshTarget, *, timeout: float | None = None, accept_new_host_keys: bool = False, retries: int = RETRIES
) -> SshClient:
    """``connect``, tried again after a jittered back-off while the error is transient."""
    attempt = 0
    while True:
        try:
            return connect(target, timeout=timeout, accept_new_host_keys=accept_new_host_keys)
        except SshError as exc:
            if not exc.transient or attempt >= retries:
                raise
        time.sleep(RETRY_BASE_S * 2**attempt * random.uniform(0.5, 1.5))
        attempt += 1


def _connect_one(target: SshTarget, timeout: float | None, accept_new: bool, retries: int) -> SshClient | SshError:
    try:
        return connect_with_retries(target, timeout=timeout, accept_new_host_keys=accept_new, retries=retries)
    except SshError as exc:
        return exc
    except Exception as exc:
        return SshError(
            target.alias, "other", f"unexpected error: {type(exc).__name__}: {exc}", f"try 'ssh -v {target.alias}'"
        )


def connect_all(
    targets: Mapping[str, SshTarget],
    *,
    timeout: float | None = None,
    accept_new_host_keys: bool = False,
    retries: int = RETRIES,
    max_parallel: int = MAX_PARALLEL,
) -> dict[str, SshClient | SshError]:
    """Connect to every target in parallel; the result per alias is a client or the SshError (never raises)."""
    if not targets:
        return {}
    # Daemon threads, not a pool: a Ctrl-C or SIGTERM here ends the launch at once, while a pool's threads
    # would keep the process alive until every handshake had timed out (ConnectTimeout, maybe 30 s x retries).
    todo = queue.SimpleQueue()
    for alias in targets:
        todo.put(alias)
    results: dict[str, SshClient | SshError] = {}
    finished = threading.Semaphore(0)

    def work() -> None:
        while True:
            try:
                alias = todo.get_nowait()
            except queue.Empty:
                return
            results[alias] = _connect_one(targets[alias], timeout, accept_new_host_keys, retries)
            finished.release()

    for i in range(min(max_parallel, len(targets))):
        threading.Thread(target=work, name=f"ssh-connect-{i}", daemon=True).start()
    for _ in targets:
        finished.acquire()  # a signal's handler runs (and may raise) while this waits
    return {alias: results[alias] for alias in targets}


def require_all(
    results: Mapping[str, SshClient | SshError], what: str = "could not be reached"
) -> dict[str, SshClient]:
    """The clients if every host connected; else close them and raise HostsFailed naming every failed host."""
    errors = [r for r in results.values() if isinstance(r, SshError)]
    if errors:
        close_all(results)
        raise HostsFailed(errors, what)
    return dict(results)  # type: ignore[arg-type]


def close_all(results: Mapping[str, SshClient | SshError]) -> None:
    """Close every open client of a ``connect_all`` result."""
    for result in results.values():
        if isinstance(result, paramiko.SSHClient):
            result.close()
